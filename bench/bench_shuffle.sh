#!/usr/bin/env bash
# Side-by-side shuffle benchmark (just bench shuffle), on a ~330 MB dataset
# (200 clips, float32 [800, 1024] features + motion pickles, converted):
#   1. shuffle one epoch through the external two-pass path (--mem 64MiB),
#      durable (default) and --no-fsync, vs cp of the epoch's bytes without
#      and with fsync; peak RSS
#   2. the training-read simulation, cold and warm (bench/bench_read.py)
# Usage: bench/bench_shuffle.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
S="$W/shuf"
go build -o "$W/convert" ./cmd/convert
go build -o "$W/shuffle" ./cmd/shuffle
[ -f "$S/clips.txt" ] || "$PY" bench/bench_gen.py "$S" 200 600 1000 1024
"$W/convert" --quiet --clips "$S/clips.txt" --out "$W/shuf-ds" -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' >/dev/null
echo "dataset: $(du -sh --apparent-size "$W/shuf-ds" | cut -f1)"


args=(--dataset "$W/shuf-ds" --window 15 --epochs 1 --seed 1 --shard-samples 1024 --quiet --force)
# Every run writes a new output (the previous one removed first, untimed),
# for shuffle and cp alike; the five rows run in turn, one run of each a
# round (rounds, bench/bench_lib.sh): the external path durable (default)
# and --no-fsync (the page cache, as cp), the in-memory path, cp of the
# epoch (its source warm: the external row just wrote it) and cp made as
# durable as shuffle's output (shuffle fsyncs each epoch).
rounds shuffle-external "$W/shuf-ep" "$W/shuffle" "${args[@]}" --out "$W/shuf-ep" --mem 64MiB -- \
  shuffle-ext-no-fsync "$W/shuf-ep-nf" "$W/shuffle" "${args[@]}" --out "$W/shuf-ep-nf" --mem 64MiB --no-fsync -- \
  shuffle-in-memory "$W/shuf-ep-mem" "$W/shuffle" "${args[@]}" --out "$W/shuf-ep-mem" --mem 4GiB -- \
  cp-epoch "$W/cp-ep" cp -r "$W/shuf-ep/epoch-0000" "$W/cp-ep" -- \
  cp-epoch+fsync "$W/cp-ep" sh -c "cp -r '$W/shuf-ep/epoch-0000' '$W/cp-ep' && sync -f '$W/cp-ep'/*"
cmp -s <(cd "$W/shuf-ep" && cat SHA256SUMS | grep -v epochs.json) <(cd "$W/shuf-ep-mem" && cat SHA256SUMS | grep -v epochs.json) \
  && cmp -s <(cd "$W/shuf-ep" && cat SHA256SUMS | grep -v epochs.json) <(cd "$W/shuf-ep-nf" && cat SHA256SUMS | grep -v epochs.json) \
  && echo "  external == in-memory == external --no-fsync (SHA256SUMS)"
rm -rf "$W/shuf-ep-nf"
awk -v a="$(cat "$W/shuffle-external.median")" -v n="$(cat "$W/shuffle-ext-no-fsync.median")" -v c="$(cat "$W/cp-epoch.median")" -v f="$(cat "$W/cp-epoch+fsync.median")" \
  'BEGIN{printf "  medians: external shuffle --no-fsync / cp = %.2fx; external shuffle / (cp+fsync) = %.2fx (/ cp = %.2fx)\n", n/c, a/f, a/c}'
echo "epoch: $(du -sh --apparent-size "$W/shuf-ep/epoch-0000" | cut -f1)"

# Let the writes above settle first: cold reads right behind 300 MB of
# writes measure the disk finishing them, not the reads.
sync; sleep 3
"$PY" bench/bench_read.py "$S" "$W/shuf-ds" "$W/shuf-ep" cold
"$PY" bench/bench_read.py "$S" "$W/shuf-ds" "$W/shuf-ep" warm

# Cold again, with the reader's memory (page cache included) capped below
# the dataset's size, as on a node whose RAM is smaller than the features
# (700 GB on a 256-512 GB node): a page read ahead for one window is gone
# before a later window could use it. Needs root and a cgroup memory
# controller (v1 or v2).
CAP=${CLIPSHARD_BENCH_CAP:-256M}
cg=""
if [ "$(id -u)" = 0 ] && [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/clipshard-bench; mkdir -p "$cg" && echo "$CAP" > "$cg/memory.max"
elif [ "$(id -u)" = 0 ] && [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/clipshard-bench; mkdir -p "$cg" && numfmt --from=iec "$CAP" > "$cg/memory.limit_in_bytes"
fi
if [ -n "$cg" ]; then
  echo "memory capped at $CAP (dataset $(du -sh --apparent-size "$W/shuf-ds" | cut -f1)):"
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$PY" bench/bench_read.py "$S" "$W/shuf-ds" "$W/shuf-ep" cold
  rmdir "$cg" 2>/dev/null || true
else
  echo "memory-capped read simulation skipped: needs root and a cgroup memory controller"
fi
