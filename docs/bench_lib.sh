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
  local best=999999
  for _ in $(seq "${RUNS:-5}"); do
    timed "${FRESH:-}" "$@"
    best=$(awk -v a="$T" -v b="$best" 'BEGIN{print (a<b)?a:b}')
  done
  report "$label" "$best" "$RSS"
}

# bestpair LABEL1 FRESH1 CMD1... -- LABEL2 FRESH2 CMD2...: best for two
# commands run alternately, one run of each per round, so that both are
# timed in the same conditions on a machine whose speed drifts while the
# benchmark runs (a VM, a shared node): run one after the other, each
# command's five runs took a different stretch of it.
bestpair() {
  local l1=$1 f1=$2; shift 2
  local a=()
  while [ "$1" != "--" ]; do a+=("$1"); shift; done
  shift
  local l2=$1 f2=$2; shift 2
  local b1=999999 b2=999999 r1
  for _ in $(seq "${RUNS:-5}"); do
    timed "$f1" "${a[@]}"; r1=$RSS
    b1=$(awk -v a="$T" -v b="$b1" 'BEGIN{print (a<b)?a:b}')
    timed "$f2" "$@"
    b2=$(awk -v a="$T" -v b="$b2" 'BEGIN{print (a<b)?a:b}')
  done
  report "$l1" "$b1" "$r1"
  report "$l2" "$b2" "$RSS"
}

# timed FRESH COMMAND...: one run of COMMAND after removing FRESH (if not
# empty) and a sync; sets T (seconds) and RSS (KiB).
timed() {
  local fresh=$1; shift
  local t0 t1
  [ -z "$fresh" ] || rm -rf $fresh
  sync
  t0=$(date +%s%N)
  /usr/bin/time -f "%M" -o "$W/time.txt" "$@" >/dev/null 2>"$W/err.txt" || { cat "$W/err.txt"; exit 1; }
  t1=$(date +%s%N)
  read -r RSS < "$W/time.txt"
  T=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", (b-a)/1e9}')
}

# report LABEL SECONDS RSS_KIB: prints a result line and stores $W/LABEL.best.
report() {
  printf "  %-22s %7.3f s  peak RSS %6d MiB\n" "$1" "$2" $(($3 / 1024))
  echo "$2" > "$W/$1.best"
}
