#!/usr/bin/env bash
# just bench-peers: clipshard against LitData, Mosaic Streaming and
# WebDataset (their current releases, in a venv of this script's own) on
# the mixed bench set: prepare (wall, peak RSS, bytes), one epoch read into
# float32 tensors (warm, cold, over sshfs), resume after kill -9 with
# another world size, shuffle quality. docs/BENCHMARKS.md has the table.
#   docs/bench_peers.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-${BENCH_DIR:-/tmp/clipshard-bench}}
mkdir -p "$W"
V="$W/peers-venv"
if [ ! -x "$V/bin/python" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install --quiet --disable-pip-version-check litdata mosaicml-streaming webdataset torch
fi
PY="$V/bin/python"
"$PY" -c 'import importlib.metadata as m, sys; print("python", sys.version.split()[0], *["%s %s" % (p, m.version(p)) for p in ("litdata", "mosaicml-streaming", "webdataset", "torch", "numpy")])'
go build -o "$W/" ./cmd/clipshard
# The mixed set with one huge clip (20x the median length).
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" docs/bench_gen_mixed.py "$M" 400 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
OUT="$W/peers.jsonl"
ONLY=${BENCH_ONLY:-}
[ -n "$ONLY" ] || : > "$OUT"
P="$W/peers-huge"; mkdir -p "$P"
timed() {  # LABEL TOOL COMMAND...: wall and peak RSS (of the command and its children)
  local label=$1 tool=$2; shift 2
  sync
  local t0 t1; t0=$(date +%s%N)
  /usr/bin/time -f "%M" -o "$W/peers-time.txt" "$@" > /dev/null 2> "$W/peers-err.txt" || { tail -5 "$W/peers-err.txt"; exit 1; }
  t1=$(date +%s%N)
  echo "{\"prepare\": \"$label\", \"tool\": \"$tool\", \"wall_s\": $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", (b-a)/1e9}'), \"rss_MB\": $(( $(cat "$W/peers-time.txt") / 1024 ))}" >> "$OUT"
}
data() { case $1 in clipshard) echo "$P/ep" ;; clipshard-drawn) echo "$P/ds" ;; *) echo "$P/$1" ;; esac; }
TOOLS="clipshard clipshard-drawn litdata mosaic webdataset"
if [ -z "$ONLY" ]; then
# prepare: clipshard's convert + shuffle (one epoch, W=15), then each peer's
# writer over the same windows.
rm -rf "$P/ds" "$P/ep"
timed convert clipshard "$W/clipshard" convert --quiet --workers 2 --clips "$M/clips.txt" --out "$P/ds" "${mods[@]}"
timed shuffle clipshard "$W/clipshard" shuffle --quiet --workers 2 --dataset "$P/ds" --out "$P/ep" --window 15 --epochs 1 --seed 3
for t in litdata mosaic webdataset; do
  rm -rf "${P:?}/$t"
  timed write "$t" "$PY" docs/bench_peers.py prepare "$t" "$M" "$P/ep" "$P/$t"
done
for t in ep litdata mosaic webdataset; do
  echo "{\"bytes\": \"$t\", \"MB\": $(( $(du -sb "$P/$t" | cut -f1) / 1000000 ))}" >> "$OUT"
done
echo "{\"bytes\": \"ds\", \"MB\": $(( $(du -sb "$P/ds" | cut -f1) / 1000000 ))}" >> "$OUT"
# read: warm and cold, S = 0 and 20 ms, 3 runs each (the table takes the median).
for mode in warm cold; do
  for S in 0 20; do
    for run in 1 2 3; do
      for t in $TOOLS; do
        "$PY" docs/bench_peers.py read "$t" "$S" "$mode" "$(data "$t")" >> "$OUT" 2>"$W/peers-err.txt" || tail -3 "$W/peers-err.txt"
      done
    done
  done
done
# resume: 2 ranks killed at 40% of the epoch, resumed on 1 (drawn epochs'
# resume: testdata/check_drawn.py).
for t in clipshard litdata mosaic webdataset; do
  rm -rf "${W:?}/peers-resume/$t"
  "$PY" docs/bench_peers.py resume "$t" "$(data "$t")" "$W/peers-resume/$t" "$(python3 -c "import json; print(json.load(open('$P/ep/epochs.json'))['epochs'][0]['samples'])")" >> "$OUT"
done
# Over sshfs to a loopback sshd (root, sshfs, openssh-server), cold, S=0.
if command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ]; then
  N="$W/peers-net"; rm -rf "$N"; mkdir -p "$N/mnt"
  ssh-keygen -q -t ed25519 -N '' -f "$N/host" && ssh-keygen -q -t ed25519 -N '' -f "$N/user"
  printf 'Port 2298\nListenAddress 127.0.0.1\nHostKey %s/host\nAuthorizedKeysFile %s/user.pub\nPasswordAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nPidFile %s/sshd.pid\nSubsystem sftp internal-sftp\n' "$N" "$N" "$N" > "$N/sshd_config"
  mkdir -p /run/sshd
  /usr/sbin/sshd -f "$N/sshd_config"
  trap 'fusermount -u "$N/mnt" 2>/dev/null || true; kill "$(cat "$N/sshd.pid")" 2>/dev/null || true' EXIT
  for t in $TOOLS; do
    fusermount -u "$N/mnt" 2>/dev/null || true
    sshfs -p 2298 -o IdentityFile="$N/user",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR root@127.0.0.1:"$P" "$N/mnt"
    d=$(data "$t"); d="$N/mnt/${d#"$P"/}"
    BENCH_DROP="$(data "$t")" "$PY" docs/bench_peers.py read "$t" 0 "sshfs, cold" "$d" >> "$OUT" 2>"$W/peers-err.txt" || tail -3 "$W/peers-err.txt"
  done
  fusermount -u "$N/mnt"; kill "$(cat "$N/sshd.pid")"; trap - EXIT
else
  echo "network-filesystem leg skipped: needs root, sshfs and openssh-server (Debian: apt install sshfs openssh-server)"
fi
fi  # (BENCH_ONLY=capped: that leg alone)
# Under a memory cap below the data's size: a set 10x larger (4000 clips:
# ~2.2 GB an epoch) read with the page cache and every process of the
# reader capped at 1200M (root, a cgroup v1 or v2 memory controller): the
# cap must hold torch itself (~660 MB of RSS for its import here) and
# still be well below the data.
CAP=${CLIPSHARD_BENCH_CAP:-1200M}
cg=""
if [ "$(id -u)" = 0 ] && [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/clipshard-bench-peers; mkdir -p "$cg" && echo "$CAP" > "$cg/memory.max"
elif [ "$(id -u)" = 0 ] && [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/clipshard-bench-peers; mkdir -p "$cg" && numfmt --from=iec "$CAP" > "$cg/memory.limit_in_bytes"
fi
if [ -n "$cg" ]; then
  BM="$W/mixed-big-huge"; BP="$W/peers-big-huge"; mkdir -p "$BP"
  [ -f "$BM/clips.txt" ] || "$PY" docs/bench_gen_mixed.py "$BM" 4000 20
  [ -f "$BP/ds/dataset.json" ] || "$W/clipshard" convert --quiet --workers 2 --clips "$BM/clips.txt" --out "$BP/ds" "${mods[@]}"
  [ -f "$BP/ep/epochs.json" ] || "$W/clipshard" shuffle --quiet --workers 2 --dataset "$BP/ds" --out "$BP/ep" --window 15 --epochs 1 --seed 3
  for t in litdata mosaic webdataset; do
    [ -e "$BP/$t.done" ] || { rm -rf "${BP:?}/$t"; "$PY" docs/bench_peers.py prepare "$t" "$BM" "$BP/ep" "$BP/$t" > /dev/null 2>&1 && touch "$BP/$t.done"; }
  done
  echo "{\"bytes\": \"big epoch\", \"MB\": $(( $(du -sb "$BP/ep" | cut -f1) / 1000000 ))}" >> "$OUT"
  for t in $TOOLS; do
    d="$BP/$t"; [ "$t" = clipshard ] && d="$BP/ep"
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$PY" docs/bench_peers.py read "$t" 20 "capped $CAP, cold" "$d" >> "$OUT" 2>"$W/peers-err.txt" ||
      echo "{\"tool\": \"$t\", \"S\": 20, \"mode\": \"capped $CAP, cold\", \"killed\": true}" >> "$OUT"
  done
  rmdir "$cg" 2>/dev/null || true
else
  echo "memory-capped leg skipped: needs root and a cgroup memory controller"
fi
"$PY" docs/bench_peers.py table "$OUT"
