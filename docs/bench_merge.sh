#!/usr/bin/env bash
# Merge peak RSS against dataset size (just bench-merge): the "large" set of
# bench_convert.sh (200 clips) and a 4x larger one (800 clips), each
# converted in 4 parts, then merged; best of 5, peak RSS from /usr/bin/time.
# Usage: docs/bench_merge.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
. docs/bench_lib.sh
go build -o "$W/convert" ./cmd/convert
for spec in "merge1 200" "merge4 800"; do
  set -- $spec
  S="$W/$1"
  [ -f "$S/clips.txt" ] || "$PY" docs/bench_gen.py "$S" "$2" 400 400 1024
  for i in 0 1 2 3; do
    "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/$1-parts/part-{part}" --part "$i/4" \
      -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' >/dev/null
  done
  best=999 rss=0
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o "$W/time.txt" "$W/convert" --quiet --merge "$W/$1-parts"/part-* --out "$W/$1-ds" >/dev/null
    read -r t r < "$W/time.txt"
    best=$(awk -v a="$t" -v b="$best" 'BEGIN{print (a<b)?a:b}'); rss=$r
  done
  printf "%s: dataset %s, merge %.2f s, peak RSS %d MiB\n" "$1" "$(du -sh --apparent-size "$W/$1-ds" | cut -f1)" "$best" $((rss / 1024))
done
