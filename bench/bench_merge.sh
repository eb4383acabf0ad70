#!/usr/bin/env bash
# Merge peak RSS against dataset size (just bench merge): the "large" set of
# bench_convert.sh (200 clips) and a 4x larger one (800 clips), each
# converted in 4 parts, then merged; the two merges in turn, 5 rounds: median
# (range), peak RSS from /usr/bin/time.
# Usage: bench/bench_merge.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
go build -o "$W/convert" ./cmd/convert
# the two sets, each converted in 4 parts
for spec in "merge1 200" "merge4 800"; do
  set -- $spec
  S="$W/$1"
  [ -f "$S/clips.txt" ] || "$PY" bench/bench_gen.py "$S" "$2" 400 400 1024
  for i in 0 1 2 3; do
    "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/$1-parts/part-{part}" --part "$i/4" \
      -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' >/dev/null
  done
done
# the merges in turn, a new output each run (rounds, bench/bench_lib.sh):
# copying the blobs, and by reference (--segments: hard links, #61)
rounds merge1 "$W/merge1-ds" "$W/convert" --quiet --merge "$W/merge1-parts"/part-* --out "$W/merge1-ds" -- \
  merge1-ref "$W/merge1-ref" "$W/convert" --quiet --merge "$W/merge1-parts"/part-* --out "$W/merge1-ref" --segments -- \
  merge4 "$W/merge4-ds" "$W/convert" --quiet --merge "$W/merge4-parts"/part-* --out "$W/merge4-ds" -- \
  merge4-ref "$W/merge4-ref" "$W/convert" --quiet --merge "$W/merge4-parts"/part-* --out "$W/merge4-ref" --segments
echo "datasets: merge1 $(du -sh --apparent-size "$W/merge1-ds" | cut -f1), merge4 $(du -sh --apparent-size "$W/merge4-ds" | cut -f1)"
# bytes each merge wrote: its files' sizes but for the hard links (a link
# keeps the part's mtime: find -newer the parts leaves them out)
for m in merge1-ds merge1-ref merge4-ds merge4-ref; do
  echo "  $m wrote $(find "$W/$m" -type f -newer "$W/${m%%-*}-parts/part-0003/dataset.json" -printf '%s\n' | awk '{s+=$1} END{printf "%.1f MiB", s/1048576}')"
done
