#!/usr/bin/env bash
# Appending 1 % of clips to a dataset (just bench append, #61), side by
# side in one run, rows interleaved: on the mixed set (bench/bench_gen_mixed.py:
# motion pickles, whisper @2, w2v 1024-dim, emotion) at 3 sizes, each
# round times, with the page cache warm:
#   full      a full convert of the grown list into a new folder
#   new-only  a convert of the new clips alone into a new folder (the floor)
#   copy      the same convert line over the old dataset (reuse by copy: format 1)
#   segments  the same line with --segments over the old dataset (a new segment)
#   bucket    push of the old dataset, then of the grown one into the same
#             prefix (bytes sent), and an epoch of each drawn from the bucket
#             on one node's cache (bytes fetched for the new version)
# and counts the bytes each run wrote (the sizes of the files it made or
# replaced under its folder). The old dataset is copied into place,
# untimed, before each run over it. The segmented output is checked
# against the full one: verify --deep, and shuffle's shards byte-identical.
# Usage: bench/bench_append.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
#   SIZES="200 400 800" (clips), RUNS=3, READERS=only (the readers' table alone, on the last size)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
go build -o "$W/clipshard" ./cmd/clipshard
B="$W/clipshard"
RUNS=${RUNS:-3}
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
export SOURCE_DATE_EPOCH=1700000000

# written DIR MARK: bytes of the regular files under DIR newer than MARK.
written() { find "$1" -type f -newer "$2" -printf '%s\n' | awk '{s+=$1} END{print s+0}'; }
# run LABEL DIR COMMAND...: times COMMAND (which writes DIR), appends "secs bytes" to $W/LABEL.rows.
run() {
  local label=$1 dir=$2; shift 2
  touch "$W/mark"; sleep 0.01
  local t0 t1
  t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N)
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", (b-a)/1e9}') $(written "$dir" "$W/mark")" >> "$W/$label.rows"
}
mib() { awk -v b="$1" 'BEGIN{printf "%.1f MiB", b/1048576}'; }
med() { sort -g | awk '{a[NR]=$1} END{printf "%s", a[int((NR+1)/2)]}'; }
rng() { sort -g | awk '{a[NR]=$1} END{printf "%s-%s", a[1], a[NR]}'; }

# The bucket rows (each size): the old dataset pushed (format 1) to a
# versitygw on 127.0.0.1 (started here, stopped by PID), one drawn epoch
# of it read from the bucket into a node-local cache; then the grown
# dataset (--segments) pushed into the same prefix, and an epoch of it
# read on the same node: the bytes push sent and the bytes the node
# fetched, against the new clips' bytes (the goals: each <= 1.1x + 2 MiB).
VGW=${CLIPSHARD_VERSITYGW:-${XDG_CACHE_HOME:-$HOME/.cache}/clipshard-ci/bin/versitygw}
BUCKET=""
if [ -x "$VGW" ] && "$PY" -c 'import boto3' 2>/dev/null; then
  rm -rf "$W/append-root"; mkdir -p "$W/append-root/bench"
  PORT=$(( 20000 + RANDOM % 20000 ))
  ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key "$VGW" --port "127.0.0.1:$PORT" posix "$W/append-root" > "$W/vgw-append.log" 2>&1 &
  VPID=$!
  trap 'kill $VPID 2>/dev/null || true; sleep 0.5; kill -9 $VPID 2>/dev/null || true' EXIT
  export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1
  export AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  BUCKET=1
  cat > "$W/read_bucket.py" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
import clipshard
ld = clipshard.Loader(dataset=sys.argv[1], epochs=[0], window=30, batch_size=64, cache_dir=sys.argv[2], cache_limit="64GiB")
for b in ld:
    pass
print(sum(s.remote.fetched for s in ld.drawn.sources), ld.drawn.versions)
ld.close()
PY
else
  echo "no bucket rows: they need versitygw ($VGW; CLIPSHARD_VERSITYGW) and boto3 in $PY"
fi

SIZES=${SIZES:-200 400 800}
last=${SIZES##* }
[ "${READERS:-}" = only ] && SIZES=""
for n in $SIZES; do
  S="$W/append-$n"
  [ -f "$S/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$S" "$n" >/dev/null
  add=$(( n / 100 > 2 ? n / 100 : 2 ))
  head -n $(( n - add )) "$S/clips.txt" > "$S/old.txt"
  tail -n "$add" "$S/clips.txt" > "$S/new.txt"
  rm -rf "$W/old-$n"
  "$B" convert --quiet --clips "$S/old.txt" --root "$S" --out "$W/old-$n" "${mods[@]}" >/dev/null
  rm -f "$W"/{full,new-only,copy,segments}.rows
  cat "$S"/*/* > /dev/null
  l0=$(cut -d' ' -f1 /proc/loadavg)
  for r in $(seq "$RUNS"); do
    rm -rf "$W/full"; run full "$W/full" "$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/full" "${mods[@]}"
    rm -rf "$W/new-only"; run new-only "$W/new-only" "$B" convert --quiet --clips "$S/new.txt" --root "$S" --out "$W/new-only" "${mods[@]}"
    rm -rf "$W/copy"; cp -a "$W/old-$n" "$W/copy"; sync
    run copy "$W/copy" "$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/copy" "${mods[@]}"
    rm -rf "$W/segments"; cp -a "$W/old-$n" "$W/segments"; sync
    run segments "$W/segments" "$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/segments" "${mods[@]}" --segments
  done
  newb=$(cut -d' ' -f2 "$W/new-only.rows" | med)
  newt=$(cut -d' ' -f1 "$W/new-only.rows" | med)
  echo "mixed set, $n clips ($(du -sh --apparent-size "$W/old-$n" | cut -f1) of float16), $add appended; $RUNS rounds, load average $l0-$(cut -d' ' -f1 /proc/loadavg):"
  for leg in full new-only copy segments; do
    t=$(cut -d' ' -f1 "$W/$leg.rows" | med); b=$(cut -d' ' -f2 "$W/$leg.rows" | med)
    awk -v leg="$leg" -v t="$t" -v tr="$(cut -d' ' -f1 "$W/$leg.rows" | rng)" -v b="$b" -v nb="$newb" -v nt="$newt" \
      'BEGIN{printf "  %-9s %7.3f s (%s)  wrote %9.1f MiB   %6.2fx the new clips alone'"'"' bytes, %5.2fx their time\n", leg, t, tr, b/1048576, b/nb, t/nt}'
  done
  if [ -n "$BUCKET" ]; then
    rm -rf "$W/node-$n"
    "$B" push --quiet "$W/old-$n" "s3://bench/grow-$n" >/dev/null
    f1=$("$PY" "$W/read_bucket.py" "s3://bench/grow-$n" "$W/node-$n" "$PWD/python" | cut -d' ' -f1)
    t0=$(date +%s%N)
    sent=$("$B" push --quiet --json "$W/segments" "s3://bench/grow-$n" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["bytes_sent"])')
    t1=$(date +%s%N)
    f2=$("$PY" "$W/read_bucket.py" "s3://bench/grow-$n" "$W/node-$n" "$PWD/python")
    case "$f2" in *": 2}") ;; *) echo "  the node read $f2, not version 2"; exit 1;; esac
    awk -v s="$sent" -v f="${f2%% *}" -v f1="$f1" -v nb="$newb" -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN{print (b-a)/1e9}')" \
      'BEGIN{printf "  bucket    push of the new version sent %.1f MiB (%.2fx the new clips'"'"' bytes) in %.2f s; a node that read version 1 (%.1f MiB fetched) fetched %.1f MiB for an epoch of version 2 (%.2fx)\n", s/1048576, s/nb, t, f1/1048576, f/1048576, f/nb}'
    rm -rf "$W/node-$n" "$W/append-root/bench/grow-$n"
  fi
  # The segmented version reads as the full convert: verify, and shards.
  "$B" verify --deep "$W/segments" >/dev/null
  for d in full segments; do
    rm -rf "$W/ep-$d"; "$B" shuffle --quiet --dataset "$W/$d" --out "$W/ep-$d" --window 30 --epochs 1 --seed 1 >/dev/null
  done
  diff <(cd "$W/ep-full" && find epoch-* -type f -exec sha256sum {} + | sort) <(cd "$W/ep-segments" && find epoch-* -type f -exec sha256sum {} + | sort) >/dev/null \
    && echo "  segments: verify --deep ok; shuffle's shards == the full convert's (sha256)" || { echo "  SHARDS DIFFER"; exit 1; }
  rm -rf "$W/full" "$W/new-only" "$W/copy" "$W/segments" "$W/ep-full" "$W/ep-segments" "$W/old-$n"
  last=$n
done

# Adding a modality (emotion) to the largest set's dataset of the other three.
S="$W/append-$last"
[ -f "$S/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$S" "$last" >/dev/null
if [ "${READERS:-}" != only ]; then
rm -rf "$W/old3"
"$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/old3" "${mods[@]:0:6}" >/dev/null
rm -f "$W"/{emotion-only,copy,segments}.rows
l0=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$RUNS"); do
  rm -rf "$W/emotion-only"; run emotion-only "$W/emotion-only" "$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/emotion-only" -m 'emotion=emotion/{clip}.npy'
  rm -rf "$W/copy"; cp -a "$W/old3" "$W/copy"; sync
  run copy "$W/copy" "$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/copy" "${mods[@]}"
  rm -rf "$W/segments"; cp -a "$W/old3" "$W/segments"; sync
  run segments "$W/segments" "$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/segments" "${mods[@]}" --segments
done
eb=$(cut -d' ' -f2 "$W/emotion-only.rows" | med); et=$(cut -d' ' -f1 "$W/emotion-only.rows" | med)
echo "mixed set, $last clips: adding emotion to motion, whisper, w2v; $RUNS rounds, load average $l0-$(cut -d' ' -f1 /proc/loadavg):"
for leg in emotion-only copy segments; do
  t=$(cut -d' ' -f1 "$W/$leg.rows" | med); b=$(cut -d' ' -f2 "$W/$leg.rows" | med)
  awk -v leg="$leg" -v t="$t" -v tr="$(cut -d' ' -f1 "$W/$leg.rows" | rng)" -v b="$b" -v nb="$eb" -v nt="$et" \
    'BEGIN{printf "  %-12s %7.3f s (%s)  wrote %9.1f MiB   %6.2fx the modality alone'"'"'s bytes, %5.2fx its time\n", leg, t, tr, b/1048576, b/nb, t/nt}'
done
rm -rf "$W/emotion-only" "$W/copy" "$W/segments" "$W/old3"
fi

# Readers of a segmented version against its compacted twin (the goal:
# within 0.95x): the largest set converted from 80 % of its clips, grown
# in 4 appends of 5 % (5 segments), against a full convert of the list.
# shuffle in memory and on the external path (--mem 64MiB; both
# --no-fsync: the disk's flush of the shards is the same for both and
# its noise, 0.4-2.1 s a run here, hid the reads), the
# Python Dataset reading every clip's rows of every modality (a sum of
# each, so that the pages are read), and two epochs drawn at read time
# (Loader(dataset=...), windows of 30 frames, batches of 64 as float32,
# 2 threads; read=False: a memory map of each blob, read=True: a pread a
# window; the sha256 of every batch equal for both datasets, or the
# bench stops), rows interleaved, 3 rounds, warm.
S="$W/append-$last"
n=$(wc -l < "$S/clips.txt")
rm -rf "$W/seg" "$W/twin"
for pct in 80 85 90 95 100; do
  head -n $(( n * pct / 100 )) "$S/clips.txt" > "$S/grow.txt"
  "$B" convert --quiet --clips "$S/grow.txt" --root "$S" --out "$W/seg" "${mods[@]}" --segments >/dev/null
done
"$B" convert --quiet --clips "$S/clips.txt" --root "$S" --out "$W/twin" "${mods[@]}" >/dev/null
cat > "$W/read_ds.py" <<'PY'
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
import clipshard
t0 = time.perf_counter()
ds = clipshard.Dataset(sys.argv[1])
s = 0.0
for i in range(len(ds)):
    for a in ds[i].values():
        s += float(np.asarray(a, dtype=np.float32).sum())
print("%.3f" % (time.perf_counter() - t0))
PY
cat > "$W/read_drawn.py" <<'PY'
import hashlib, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
import clipshard
read = sys.argv[3] == "pread"
t0 = time.perf_counter()
ld = clipshard.Loader(dataset=sys.argv[1], epochs=[0, 1], window=30, batch_size=64, threads=2, dtype=np.float32, read=read)
h = hashlib.sha256()
for _ in ld.epochs:
    for b in ld:
        for k in sorted(b):
            h.update(np.ascontiguousarray(b[k]).view(np.uint8))
ld.close()
print("%.3f %s" % (time.perf_counter() - t0, h.hexdigest()[:16]))
PY
rm -f "$W"/r-*.rows "$W"/h-*.rows
l0=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$RUNS"); do
  for d in twin seg; do
    for mem in 2GiB 64MiB; do
      rm -rf "$W/ep"; t0=$(date +%s%N)
      "$B" shuffle --quiet --dataset "$W/$d" --out "$W/ep" --window 30 --epochs 1 --seed 1 --mem $mem --no-fsync >/dev/null
      t1=$(date +%s%N); awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f\n", (b-a)/1e9}' >> "$W/r-shuffle-$mem-$d.rows"
    done
    "$PY" "$W/read_ds.py" "$W/$d" "$PWD/python" >> "$W/r-dataset-$d.rows"
    for mode in map pread; do
      "$PY" "$W/read_drawn.py" "$W/$d" "$PWD/python" $mode | tee -a "$W/h-drawn-$mode-$d.rows" | cut -d' ' -f1 >> "$W/r-drawn-$mode-$d.rows"
    done
  done
done
echo "readers, $n clips: a version of 5 segments (4 appends of 5 %) against its compacted twin; $RUNS rounds, load average $l0-$(cut -d' ' -f1 /proc/loadavg):"
for mode in map pread; do
  if [ "$(cut -d' ' -f2 "$W/h-drawn-$mode-twin.rows" "$W/h-drawn-$mode-seg.rows" | sort -u | wc -l)" != 1 ]; then
    echo "drawn ($mode): the batches of the segmented version differ from its twin's"; exit 1
  fi
done
for what in shuffle-2GiB shuffle-64MiB dataset drawn-map drawn-pread; do
  a=$(med < "$W/r-$what-twin.rows"); b=$(med < "$W/r-$what-seg.rows")
  awk -v w="$what" -v a="$a" -v b="$b" -v ra="$(rng < "$W/r-$what-twin.rows")" -v rb="$(rng < "$W/r-$what-seg.rows")" \
    'BEGIN{printf "  %-14s one segment %.3f s (%s)   5 segments %.3f s (%s)   speed %.2fx\n", w, a, ra, b, rb, a/b}'
done
rm -rf "$W/seg" "$W/twin" "$W/ep"
