# Shared by the docs/bench_*.sh scripts (sourced, not run, from the
# repository's root).

# PY: the Python with numpy (Debian's). W: the work folder, the script's
# first argument, else $BENCH_DIR, else /tmp/clipshard-bench.
PY=${CLIPSHARD_PYTHON:-/usr/bin/python3}
W=${1:-${BENCH_DIR:-/tmp/clipshard-bench}}
mkdir -p "$W"

# best LABEL COMMAND...: runs COMMAND $RUNS times (default 5) after a sync,
# prints the best wall time (to the ms, from date +%s%N around
# /usr/bin/time, whose own figure has a 10 ms resolution) and the peak RSS
# of the last run, and stores the best time in $W/LABEL.best. If $FRESH is set, those paths are removed (untimed) before
# each run, so that every run writes a new output rather than also paying
# for freeing the previous one.
best() {
  local label=$1; shift
  local t best=999999 rss t0 t1
  for _ in $(seq "${RUNS:-5}"); do
    [ -z "${FRESH:-}" ] || rm -rf $FRESH
    sync
    t0=$(date +%s%N)
    /usr/bin/time -f "%M" -o "$W/time.txt" "$@" >/dev/null 2>"$W/err.txt" || { cat "$W/err.txt"; exit 1; }
    t1=$(date +%s%N)
    read -r rss < "$W/time.txt"
    t=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", (b-a)/1e9}')
    best=$(awk -v a="$t" -v b="$best" 'BEGIN{print (a<b)?a:b}')
  done
  printf "  %-22s %7.3f s  peak RSS %6d MiB\n" "$label" "$best" $((rss / 1024))
  echo "$best" > "$W/$label.best"
}
