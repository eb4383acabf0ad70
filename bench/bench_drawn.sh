#!/usr/bin/env bash
# just bench drawn: epochs drawn at read time (clipshard.Loader(dataset=...))
# against the Loader over materialised epochs, on the mixed bench set
# (bench/bench_gen_mixed.py: 400 clips, one 20x the median, four modalities,
# float16 once converted, mixed byte orders in the sources): B=256, W=15,
# float16, threads 2, prefetch 4; warm (every file read first) and cold
# (the page cache dropped: the first epoch, and all), a step of S = 0 and
# 20 ms; the same on 4000 clips; rows interleaved in rounds (ROUNDS,
# default 3), the table the median and range.
# Then the quality of the orders, on the bench set and on 7000 clips of
# 1000-2000 frames (sparse blobs: orders only).
#   bench/bench_drawn.sh [WORKDIR]      (CLIPSHARD_PYTHON: a Python with numpy; cold needs root)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
"$PY" -c 'import numpy' || { echo "bench-drawn needs numpy in $PY (Debian: python3-numpy)"; exit 1; }
go build -o "$W/" ./cmd/convert ./cmd/shuffle
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" 400 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
DS="$W/mixed-huge-ds"
[ -f "$DS/dataset.json" ] || "$W/convert" --quiet --clips "$M/clips.txt" --out "$DS" "${mods[@]}" >/dev/null
EP="$W/drawn-ep"
[ -f "$EP/epochs.json" ] || "$W/shuffle" --quiet --dataset "$DS" --out "$EP" --window 15 --epochs 6 --seed 3 >/dev/null
echo "$("$PY" -c 'import numpy, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__)'); $(nproc) cores; dataset $(du -sh --apparent-size "$DS" | cut -f1), 6 materialised epochs $(du -sh --apparent-size "$EP" | cut -f1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
# A bigger set too: 4000 clips (2.4 GB converted), 3 materialised epochs
# (BENCH_SETS=400: the bench set alone).
SETS="${BENCH_SETS:-400 4000}"
sets=("400 $DS $EP 6")
if [[ " $SETS " == *" 4000 "* ]]; then
  M4="$W/mixed-4000"
  [ -f "$M4/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M4" 4000 20
  DS4="$W/mixed-4000-ds"
  [ -f "$DS4/dataset.json" ] || "$W/convert" --quiet --clips "$M4/clips.txt" --out "$DS4" "${mods[@]}" >/dev/null
  EP4="$W/drawn-4000-ep"
  [ -f "$EP4/epochs.json" ] || "$W/shuffle" --quiet --dataset "$DS4" --out "$EP4" --window 15 --epochs 3 --seed 3 >/dev/null
  sets+=("4000 $DS4 $EP4 3")
fi
OUT="$W/drawn.jsonl"
: > "$OUT"
cold=""
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then cold=1; else echo "(not root: no cold rows)"; fi
ROWS="materialised drawn-auto drawn-8MiB drawn-auto-read"
for round in $(seq "${ROUNDS:-3}"); do
  for set in "${sets[@]}"; do
    read -r n ds ep epochs <<< "$set"
    for S in 0 20; do
      [ "$S" = 20 ] && [ "$n" = 4000 ] && continue  # (the step bounds every row: the small set shows it)
      for row in $ROWS; do
        cat "$ep"/epoch-*/* "$ds"/*.npy > /dev/null  # warm: every file in the page cache
        "$PY" bench/bench_drawn.py speed "$row" "$n clips, warm, $epochs epochs" "$S" "$ds" "$ep" "$epochs" >> "$OUT"
      done
    done
    if [ -n "$cold" ]; then
      for e in 1 "$epochs"; do
        for row in $ROWS; do
          sync; echo 3 > /proc/sys/vm/drop_caches
          "$PY" bench/bench_drawn.py speed "$row" "$n clips, cold, $e epoch(s)" 0 "$ds" "$ep" "$e" >> "$OUT"
        done
      done
    fi
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" bench/bench_drawn.py table "$OUT"
echo
echo "== quality: the bench set"
"$PY" bench/bench_drawn.py quality "$DS" "$EP"
L="$W/drawn-long"
[ -f "$L/dataset.json" ] || "$PY" bench/bench_drawn.py fake "$L" 7000 1000 2000
echo
echo "== quality: 7000 clips of 1000-2000 frames (the bench set's modalities; orders only)"
"$PY" bench/bench_drawn.py quality "$L" -
