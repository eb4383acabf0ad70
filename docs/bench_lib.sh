# Shared by the docs/bench_*.sh scripts (sourced, not run).

# best LABEL COMMAND...: runs COMMAND 3 times after a sync, prints the best
# wall time and the peak RSS of the last run, and stores the best time in
# $W/LABEL.best. If $FRESH is set, those paths are removed (untimed) before
# each run, so that every run writes a new output rather than also paying
# for freeing the previous one.
best() {
  local label=$1; shift
  local t best=999999 rss
  for _ in 1 2 3; do
    [ -z "${FRESH:-}" ] || rm -rf $FRESH
    sync
    /usr/bin/time -f "%e %M" -o "$W/time.txt" "$@" >/dev/null 2>"$W/err.txt" || { cat "$W/err.txt"; exit 1; }
    read -r t rss < "$W/time.txt"
    best=$(awk -v a="$t" -v b="$best" 'BEGIN{print (a<b)?a:b}')
  done
  printf "  %-22s %7.2f s  peak RSS %6d MiB\n" "$label" "$best" $((rss / 1024))
  echo "$best" > "$W/$label.best"
}
