#!/usr/bin/env bash
# just bench-s3: epochs in a bucket, on versitygw over loopback (started
# here on 127.0.0.1, stopped by PID), side by side in one run, rows
# interleaved in 3 rounds: the floor (plain boto3 ranged GETs of the same
# objects), clipshard's Loader from the bucket with a cold cache and a
# warm one, the Loader from the folder, a 20 ms step's wait (cold), and
# clipshard push against a plain boto3 multipart upload of the same files.
# The mixed bench set with one huge clip (docs/bench_gen_mixed.py), W=15.
#   docs/bench_s3.sh [WORKDIR]   (CLIPSHARD_PYTHON: a Python with numpy and boto3;
#                                 CLIPSHARD_VERSITYGW: the server, else .ci/run's cache)
# Not here yet: Mosaic Streaming and LitData reading their own shards from
# the same server (bench-peers has them on a filesystem).
set -euo pipefail
cd "$(dirname "$0")/.."
. docs/bench_lib.sh
"$PY" -c 'import numpy, boto3' || { echo "bench-s3 needs numpy and boto3 in $PY (Debian: python3-numpy python3-boto3)"; exit 1; }
VGW=${CLIPSHARD_VERSITYGW:-${XDG_CACHE_HOME:-$HOME/.cache}/clipshard-ci/bin/versitygw}
[ -x "$VGW" ] || { echo "bench-s3 needs versitygw: GOBIN=\$HOME/.cache/clipshard-ci/bin go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"; exit 1; }
go build -o "$W/" ./cmd/clipshard
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" docs/bench_gen_mixed.py "$M" 400 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
[ -f "$W/mixed-huge-ds/dataset.json" ] || "$W/clipshard" convert --quiet --clips "$M/clips.txt" --out "$W/mixed-huge-ds" "${mods[@]}" >/dev/null
EP="$W/s3-ep"
[ -f "$EP/epochs.json" ] || "$W/clipshard" shuffle --quiet --dataset "$W/mixed-huge-ds" --out "$EP" --window 15 --epochs 1 --seed 3 >/dev/null

ROOT="$W/s3-root"; rm -rf "$ROOT"; mkdir -p "$ROOT/bench"
PORT=$(( 20000 + RANDOM % 20000 ))
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key "$VGW" --port "127.0.0.1:$PORT" posix "$ROOT" > "$W/vgw.log" 2>&1 &
VPID=$!
trap 'kill $VPID 2>/dev/null; sleep 0.5; kill -9 $VPID 2>/dev/null; true' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
OUT="$W/s3.jsonl"; : > "$OUT"
echo "$("$PY" -c 'import numpy, boto3, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__, "boto3", boto3.__version__)'); $(nproc) cores; epoch $(du -sh --apparent-size "$EP/epoch-0000" | cut -f1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$W/clipshard" push --quiet "$EP" s3://bench/ep >/dev/null
for round in 1 2 3; do
  # push against a plain multipart upload (fresh prefixes)
  t=$(date +%s%N); "$W/clipshard" push --quiet "$EP" "s3://bench/push-$round" >/dev/null; t2=$(date +%s%N)
  awk -v a="$t" -v b="$t2" -v r="$round" 'BEGIN{printf "{\"row\": \"push\", \"round\": %d, \"seconds\": %.4f}\n", r, (b-a)/1e9}' >> "$OUT"
  "$PY" docs/bench_s3.py upload "$EP" "s3://bench/plain-$round" - | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  for th in 1 2 4 8; do "$PY" docs/bench_s3.py "floor-$th" "$EP" s3://bench/ep - | sed "s/}$/, \"round\": $round}/" >> "$OUT"; done
  rm -rf "$W/s3-cache"
  "$PY" docs/bench_s3.py loader "$EP" s3://bench/ep "$W/s3-cache" | sed "s/}$/, \"round\": $round, \"cache\": \"cold\"}/" >> "$OUT"
  "$PY" docs/bench_s3.py loader "$EP" s3://bench/ep "$W/s3-cache" | sed "s/}$/, \"round\": $round, \"cache\": \"warm\"}/" >> "$OUT"
  "$PY" docs/bench_s3.py local "$EP" s3://bench/ep - | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  for S in 20 60; do
    rm -rf "$W/s3-cache"
    "$PY" docs/bench_s3.py loader "$EP" s3://bench/ep "$W/s3-cache" $S | sed "s/}$/, \"round\": $round, \"cache\": \"cold\"}/" >> "$OUT"
  done
  rm -rf "$ROOT/bench/push-$round" "$ROOT/bench/plain-$round"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
trap - EXIT; kill $VPID 2>/dev/null; wait $VPID 2>/dev/null || true
"$PY" - "$OUT" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
def pick(**kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]
def rng(xs):
    return "%.2f (%.2f-%.2f)" % (st.median(xs), min(xs), max(xs)) if xs else "-"
# The floor of each round: the best thread count of the sweep.
floor = [max(r["MiB_per_s"] for r in rows if r["row"].startswith("floor-") and r["round"] == k) for k in (1, 2, 3)]
for th in (1, 2, 4, 8):
    print("floor sweep, %d threads: %s MiB/s" % (th, rng([r["MiB_per_s"] for r in pick(row="floor-%d" % th)])))
print()
print("| row | MiB/s median (range, 3 rounds) | x the floor | a step of S ms: the wait for the next batch, median / p90 ms |")
print("| --- | --- | --- | --- |")
print("| floor: boto3 ranged GETs, the best of 1/2/4/8 threads | %s | 1 | |" % rng(floor))
for label, sel in (("Loader, bucket, cold cache", dict(row="loader", cache="cold", step_ms=0.0)),
                   ("Loader, bucket, warm cache", dict(row="loader", cache="warm")), ("Loader, local folder", dict(row="local"))):
    xs = [r["MiB_per_s"] for r in pick(**sel)]
    ratio = [x / f for x, f in zip(xs, floor)]
    print("| %s | %s | %s | |" % (label, rng(xs), rng(ratio) if label[:5] != "floor" else "1"))
for S in (20.0, 60.0):
    w = pick(row="loader", step_ms=S)
    print("| Loader, bucket, cold cache, S = %d ms (a batch is %.1f MB: %.0f MB/s consumed) | | | %s / %s |" % (
        S, w[0]["epoch_bytes"] / 1e6 / max(1, -(-w[0]["samples"] // 256)), w[0]["epoch_bytes"] / 1e6 / max(1, -(-w[0]["samples"] // 256)) / (S / 1000),
        rng([r["wait_median_ms"] for r in w]), rng([r["wait_p90_ms"] for r in w])))
push = [r["seconds"] for r in pick(row="push")]
plain = [r["seconds"] for r in pick(row="upload")]
print("| push (seconds) | %s | plain multipart upload: %s s; push is %s x its speed | |" % (rng(push), rng(plain), rng([b / a for a, b in zip(push, plain)])))
PY
