#!/usr/bin/env bash
# Incremental convert vs a full rebuild (just bench incremental), side by
# side in one run: after 2 of the sources changed, with the page cache
# warm, and cold (echo 3 > /proc/sys/vm/drop_caches before each run, as a
# first read over NFS would be; needs root, else only the warm figures).
#   small: 5000 clips, float32 [30, 64] .npy + motion pickles
#   mixed: 400 clips, four modalities (bench/bench_gen_mixed.py)
#   huge:  one float32 [131072, 1024] clip (512 MiB) among 40 small ones (bench/bench_gen_huge.py)
# Both outputs are checked byte-identical (sha256 of blobs and manifests).
# 3 rounds of a full rebuild then an incremental one: each round printed,
# then the median and range, and the load average.
# Usage: bench/bench_incremental.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
go build -o "$W/convert" ./cmd/convert
[ -f "$W/small/clips.txt" ] || "$PY" bench/bench_gen.py "$W/small" 5000 30 30 64
[ -f "$W/mixed/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$W/mixed" 400
[ -f "$W/huge/clips.txt" ] || "$PY" bench/bench_gen_huge.py "$W/huge"
cold=no
if [ -w /proc/sys/vm/drop_caches ]; then cold=yes; fi
export SOURCE_DATE_EPOCH=1700000000

for set in small mixed huge; do
  S="$W/$set"
  case $set in
    small) mods=(-m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose'); touched=feat ;;
    mixed) mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy'); touched=w2v ;;
    huge) mods=(-m 'feat=feat/{clip}.npy'); touched=feat ;;
  esac
  echo "$set: $(wc -l < "$S/clips.txt") clips, sources $(du -sh --apparent-size "$S" | cut -f1)"
  "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/$set-inc" "${mods[@]}" --force >/dev/null
  for cache in warm cold; do
    [ $cache = warm ] || [ $cold = yes ] || continue
    l0=$(cut -d' ' -f1 /proc/loadavg); : > "$W/inc.times"
    for run in 1 2 3; do
      # full: a new output every run; incremental: 2 sources touched, then over the previous dataset
      rm -rf "$W/$set-full"; sync; [ $cache = warm ] && cat "$S"/*/* > /dev/null || echo 3 > /proc/sys/vm/drop_caches
      t0=$(date +%s%N); "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/$set-full" "${mods[@]}" >/dev/null; t1=$(date +%s%N)
      n=$(wc -l < "$S/clips.txt")
      for k in 1 2; do touch "$S/$touched/$(sed -n "$(( (run * 17 + k * 7) % n + 1 ))p" "$S/clips.txt").npy"; done
      sync; [ $cache = warm ] && cat "$S"/*/* > /dev/null || echo 3 > /proc/sys/vm/drop_caches
      t2=$(date +%s%N); "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/$set-inc" "${mods[@]}" >/dev/null; t3=$(date +%s%N)
      awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v s="$cache" \
        'BEGIN{printf "  %s cache: full %.3f s   incremental (2 sources changed) %.3f s   %.2fx\n", s, (b-a)/1e9, (d-c)/1e9, (b-a)/(d-c)}'
      awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN{printf "%.3f %.3f %.3f\n", (b-a)/1e9, (d-c)/1e9, (b-a)/(d-c)}' >> "$W/inc.times"
    done
    # The rounds' median and range (each round: a full rebuild, then an incremental one).
    for col in 1 2 3; do cut -d' ' -f$col "$W/inc.times" | sort -g | awk '{a[NR]=$1} END{printf "%s (%s–%s)\n", a[int((NR+1)/2)], a[1], a[NR]}'; done |
      { read -r f; read -r i; read -r x; echo "  $cache cache, 3 rounds, load average $l0–$(cut -d' ' -f1 /proc/loadavg): full $f s, incremental $i s, full / incremental $x"; }
  done
  rm -rf "$W/$set-full"
  "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/$set-full" "${mods[@]}" >/dev/null
  diff <(cd "$W/$set-full" && sha256sum -- *.npy clips.parquet dataset.json) <(cd "$W/$set-inc" && sha256sum -- *.npy clips.parquet dataset.json) >/dev/null \
    && echo "  incremental output == full rebuild (sha256 of blobs and manifests)" || { echo "  OUTPUTS DIFFER"; exit 1; }
  rm -rf "$W/$set-full" "$W/$set-inc"
done
