#!/usr/bin/env bash
# just bench go: the Go benchmarks of the decoders, the byte-order and layout
# kernels and the float16 kernels (formats/...), and numpy's
# astype(float16) beside them (bench/bench_numpy_astype.py), in ROUNDS
# rounds (default 3, at least 3): each round runs every benchmark once, in
# turn, so that a machine whose speed drifts drifts under every row. The
# table: each benchmark's MB/s, median (range) of the rounds, and the load
# average before and after.
#   bench/bench_go.sh [WORKDIR]   (CLIPSHARD_PYTHON: a Python with numpy; BENCHTIME: go test's, default 1s;
#                                BENCH_FILTER: go test's -bench, default .)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
rounds=${ROUNDS:-3}
[ "$rounds" -ge 3 ] || rounds=3
OUT="$W/bench-go.txt"
: > "$OUT"
B=$(mktemp -d "$W/go-bench.XXXXXX")  # (a folder of its own: removed at the end)
trap 'rm -rf "$B"' EXIT
go test -c -o "$B/" ./formats/... >/dev/null  # (built once: the rounds time the benchmarks, not the builds)
l0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$rounds"); do
  for t in "$B"/*.test; do
    (cd "formats/$(basename "$t" .test)" 2>/dev/null || cd formats; "$t" -test.run '^$' -test.bench "${BENCH_FILTER:-.}" -test.benchtime "${BENCHTIME:-1s}") |
      awk -v p="$(basename "$t" .test)" '/^Benchmark/ { for (i = 2; i <= NF; i++) if ($i == "MB/s") print p, $1, $(i - 1) }' >> "$OUT"
  done
  "$PY" bench/bench_numpy_astype.py | sed -n 's/^numpy astype \([^ ]*\) *\([^ ]*\) *\([0-9.]*\) MB\/s/numpy astype-\2-\1 \3/p' >> "$OUT"
done
echo "$("$PY" -c 'import numpy, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__)'); $(go version | cut -d' ' -f3); $(nproc) cores; $rounds rounds; load average before $l0, after $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| package | benchmark | MB/s, median (range) of the rounds |"
echo "| --- | --- | --- |"
awk '{k = $1 " " $2; if (!(k in n)) order[m++] = k; v[k, n[k]++] = $3}
  END {
    for (i = 0; i < m; i++) {
      k = order[i]; c = n[k]
      for (a = 0; a < c; a++) s[a] = v[k, a]
      for (a = 0; a < c; a++) for (b = a + 1; b < c; b++) if (s[b] + 0 < s[a] + 0) { t = s[a]; s[a] = s[b]; s[b] = t }
      med = (c % 2) ? s[int(c / 2)] : (s[c / 2 - 1] + s[c / 2]) / 2
      split(k, p, " ")
      printf "| %s | `%s` | %.0f (%.0f–%.0f) |\n", p[1], p[2], med, s[0], s[c - 1]
    }
  }' "$OUT"
