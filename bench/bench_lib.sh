# Shared by the bench/bench_*.sh scripts (sourced, not run, from the
# repository's root).

# PY: the Python with numpy (Debian's). W: the work folder, the script's
# first argument, else $BENCH_DIR, else /tmp/clipshard-bench.
PY=${CLIPSHARD_PYTHON:-/usr/bin/python3}
W=${1:-${BENCH_DIR:-/tmp/clipshard-bench}}
mkdir -p "$W"

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

# rounds LABEL FRESH COMMAND... [-- LABEL FRESH COMMAND...]...: the
# commands run in turn, one run of each per round, $RUNS rounds (default
# 5, at least 3), so that every row is timed in the same stretch of a
# machine whose speed drifts while the benchmark runs (a VM, a shared
# node). Each row prints the median and range of its wall times (to the
# ms, from date +%s%N around /usr/bin/time, whose own figure has a 10 ms
# resolution), its best, the peak RSS of its last run and the load
# average over the rounds, and stores its best time in $W/LABEL.best, its
# median in $W/LABEL.median and its times in order in $W/LABEL.times. FRESH (may be empty): paths removed,
# untimed, before each run, so that every run writes a new output rather
# than also paying for freeing the previous one.
rounds() {
  local labels=() freshes=() cmds=() n=0 cur=() i r
  while [ $# -gt 0 ]; do
    labels[n]=$1 freshes[n]=$2; shift 2
    cur=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do cur+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    cmds[n]=$(printf '%q ' "${cur[@]}")
    n=$((n + 1))
  done
  local runs=${RUNS:-5} times=() rss=() l0 l1
  [ "$runs" -ge 3 ] || runs=3
  l0=$(cut -d' ' -f1 /proc/loadavg)
  for r in $(seq "$runs"); do
    for i in $(seq 0 $((n - 1))); do
      eval "timed \"\${freshes[$i]}\" ${cmds[$i]}"
      times[i]="${times[i]:-} $T"; rss[i]=$RSS
    done
  done
  l1=$(cut -d' ' -f1 /proc/loadavg)
  for i in $(seq 0 $((n - 1))); do
    TIMES=${times[i]} report "${labels[i]}" "${times[i]}" "${rss[i]}" "$l0" "$l1"
  done
}

# best LABEL COMMAND...: rounds of one command (FRESH from the environment).
best() {
  local label=$1; shift
  rounds "$label" "${FRESH:-}" "$@"
}

# bestpair LABEL1 FRESH1 CMD1... -- LABEL2 FRESH2 CMD2...: rounds of two
# commands, alternating.
bestpair() {
  rounds "$@"
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

# report LABEL "T1 T2 ..." RSS_KIB LOAD0 LOAD1: prints a result line (the
# median, range and best of the times) and stores $W/LABEL.best,
# $W/LABEL.median and (TIMES from the environment) $W/LABEL.times.
report() {
  local stats
  stats=$(echo $2 | tr ' ' '\n' | sort -g | awk '{a[NR] = $1} END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.3f %.3f %.3f %d", m, a[1], a[NR], NR}')
  set -- "$1" $stats "$3" "$4" "$5"
  printf "  %-22s median %7.3f s (%.3f–%.3f, %d rounds), best %.3f s  peak RSS %6d MiB  load %s–%s\n" "$1" "$2" "$3" "$4" "$5" "$3" $(($6 / 1024)) "$7" "$8"
  echo "$3" > "$W/$1.best"
  echo "$2" > "$W/$1.median"
  echo $TIMES > "$W/$1.times"
}

# ratio A B: the ratios A/B of two rows' times round by round (rounds runs
# them in the same round): "median (min–max)".
ratio() {
  paste -d' ' <(tr ' ' '\n' < "$W/$1.times") <(tr ' ' '\n' < "$W/$2.times") | awk '{print $1 / $2}' | sort -g |
    awk '{a[NR] = $1} END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.2f (%.2f–%.2f)", m, a[1], a[NR]}'
}
