#!/usr/bin/env bash
# just bench s3: epochs in a bucket, on versitygw over loopback (started
# here on 127.0.0.1, stopped by PID), side by side in one run, rows
# interleaved in 3 rounds: the floor (plain boto3 ranged GETs of the same
# objects, the best of 1/2/4/8 threads), the checked floor (the same GETs
# written to files and hashed as they come, 4 threads), clipshard's Loader from the
# bucket with a cold cache and a warm one, 2 and 4 ranks each with a cache
# of its own (separate nodes: the cluster's egress), the Loader from the
# folder, Mosaic Streaming and LitData reading their own shards of the same
# windows from the same server (0 and 2 DataLoader workers), a 20 and a 60
# ms step's wait (cold), and clipshard push against a plain boto3
# multipart upload of the same files; with BENCH_LINKS="2gbit 4gbit none"
# (root) the floors and the cold Loader again behind a link of each rate
# (bench/bench_link.sh: the server in a network namespace of its own).
# Every row runs in one Python (a venv of the script's own, as bench-peers
# makes it: the peers, torch, boto3), with its client CPU and the
# server's. The mixed bench set with one huge
# clip (bench/bench_gen_mixed.py), W=15.
#   bench/bench_s3.sh [WORKDIR]   (CLIPSHARD_VERSITYGW: the server, else .ci/run's cache;
#                                 BENCH_CLIPS: clips of the set, default 400)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-${BENCH_DIR:-/tmp/clipshard-bench}}
mkdir -p "$W"
V="$W/peers-venv"
if [ ! -x "$V/bin/python" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install --quiet --disable-pip-version-check litdata mosaicml-streaming webdataset torch boto3
fi
PY="$V/bin/python"
VGW=${CLIPSHARD_VERSITYGW:-${XDG_CACHE_HOME:-$HOME/.cache}/clipshard-ci/bin/versitygw}
[ -x "$VGW" ] || { echo "bench-s3 needs versitygw: GOBIN=\$HOME/.cache/clipshard-ci/bin go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"; exit 1; }
go build -o "$W/" ./cmd/clipshard
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" "${BENCH_CLIPS:-400}" 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
[ -f "$W/mixed-huge-ds/dataset.json" ] || "$W/clipshard" convert --quiet --clips "$M/clips.txt" --out "$W/mixed-huge-ds" "${mods[@]}" >/dev/null
EP="$W/s3-ep"
[ -f "$EP/epochs.json" ] || "$W/clipshard" shuffle --quiet --dataset "$W/mixed-huge-ds" --out "$EP" --window 15 --epochs 1 --seed 3 >/dev/null
# The peers' shards of the same windows (their writers, bench_peers.py).
for t in mosaic litdata; do
  [ -d "$W/s3-$t" ] || "$PY" bench/bench_peers.py prepare "$t" "$M" "$EP" "$W/s3-$t" >/dev/null 2>&1
done

ROOT="$W/s3-root"; rm -rf "$ROOT"; mkdir -p "$ROOT/bench"
PORT=$(( 20000 + RANDOM % 20000 ))
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key "$VGW" --port "127.0.0.1:$PORT" posix "$ROOT" > "$W/vgw.log" 2>&1 &
VPID=$!
trap 'kill $VPID 2>/dev/null || true; sleep 0.5; kill -9 $VPID 2>/dev/null || true' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1
export BENCH_SERVER_PID=$VPID
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
OUT="$W/s3.jsonl"; : > "$OUT"
echo "$("$PY" -c 'import importlib.metadata as m, sys; print("python", sys.version.split()[0], *["%s %s" % (p, m.version(p)) for p in ("numpy", "boto3", "mosaicml-streaming", "litdata", "torch")])'); $(nproc) cores; epoch $(du -sh --apparent-size "$EP/epoch-0000" | cut -f1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$W/clipshard" push --quiet "$EP" s3://bench/ep >/dev/null
for t in mosaic litdata; do "$PY" bench/bench_s3.py put "$W/s3-$t" "s3://bench/$t" -; done
for round in 1 2 3; do
  # push against a plain multipart upload (fresh prefixes)
  t=$(date +%s%N); "$W/clipshard" push --quiet "$EP" "s3://bench/push-$round" >/dev/null; t2=$(date +%s%N)
  awk -v a="$t" -v b="$t2" -v r="$round" 'BEGIN{printf "{\"row\": \"push\", \"round\": %d, \"seconds\": %.4f}\n", r, (b-a)/1e9}' >> "$OUT"
  "$PY" bench/bench_s3.py upload "$EP" "s3://bench/plain-$round" - | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  for th in 1 2 4 8; do
    "$PY" bench/bench_s3.py "floor-$th" "$EP" s3://bench/ep - | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  done
  rm -rf "$W/s3-checked"
  "$PY" bench/bench_s3.py checked-4 "$EP" s3://bench/ep "$W/s3-checked" | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  rm -rf "$W/s3-checked" "$W/s3-cache"
  "$PY" bench/bench_s3.py loader "$EP" s3://bench/ep "$W/s3-cache" | sed "s/}$/, \"round\": $round, \"cache\": \"cold\"}/" >> "$OUT"
  "$PY" bench/bench_s3.py loader "$EP" s3://bench/ep "$W/s3-cache" | sed "s/}$/, \"round\": $round, \"cache\": \"warm\"}/" >> "$OUT"
  for R in 2 4; do
    rm -rf "$W/s3-rank-cache"*
    "$PY" bench/bench_s3.py "ranks-$R" "$EP" s3://bench/ep "$W/s3-rank-cache" | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  done
  "$PY" bench/bench_s3.py local "$EP" s3://bench/ep - | sed "s/}$/, \"round\": $round}/" >> "$OUT"
  for t in mosaic litdata; do
    for w in 0 2; do
      rm -rf "$W/s3-peer-cache"
      "$PY" bench/bench_s3.py "$t-$w" "$EP" "s3://bench/$t" "$W/s3-peer-cache" 0 "$(du -sb "$W/s3-$t" | cut -f1)" 2>"$W/s3-err.txt" \
        | sed "s/}$/, \"round\": $round}/" >> "$OUT" || { tail -5 "$W/s3-err.txt"; exit 1; }
    done
  done
  for S in 20 60; do
    rm -rf "$W/s3-cache"
    "$PY" bench/bench_s3.py loader "$EP" s3://bench/ep "$W/s3-cache" $S | sed "s/}$/, \"round\": $round, \"cache\": \"cold\"}/" >> "$OUT"
  done
  rm -rf "$ROOT/bench/push-$round" "$ROOT/bench/plain-$round"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
trap - EXIT; kill $VPID 2>/dev/null; wait $VPID 2>/dev/null || true
LOUT="$W/s3-link.jsonl"; : > "$LOUT"
if [ -n "${BENCH_LINKS:-}" ]; then
  # The link leg: the same bucket served from a network namespace over a
  # veth pair shaped to each rate of BENCH_LINKS (none: not shaped), rates
  # interleaved in 3 rounds: the floor (4 and 8 threads), the checked floor
  # and the Loader with a cold cache (bench/bench_link.sh).
  [ "$(id -u)" = 0 ] || { echo "BENCH_LINKS needs root (a network namespace, tc)"; exit 1; }
  . bench/bench_link.sh
  trap 'link_down' EXIT
  link_up
  ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key link_serve "$VGW" "$ROOT" "$W/vgw-link.log"
  export AWS_ENDPOINT_URL="$LINK_ENDPOINT" BENCH_SERVER_PID="$LINK_PID"
  echo "link leg: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for round in 1 2 3; do
    for rate in $BENCH_LINKS; do
      link_rate "$rate"
      for row in floor-4 floor-8 checked-4 loader; do
        rm -rf "$W/s3-checked" "$W/s3-cache"
        "$PY" bench/bench_s3.py "$row" "$EP" s3://bench/ep "$W/s3-$([ $row = loader ] && echo cache || echo checked)" \
          | sed "s/}$/, \"round\": $round, \"link\": \"$rate\"}/" >> "$LOUT"
      done
    done
  done
  echo "link leg: load average after $(cut -d' ' -f1-3 /proc/loadavg)"
  trap - EXIT; link_down
fi
"$PY" - "$OUT" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds = sorted({r["round"] for r in rows})
def pick(**kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]
def rng(xs, f="%.2f"):
    return (f + " (" + f + "–" + f + ")") % (st.median(xs), min(xs), max(xs)) if xs else "–"
# The floor of each round: the best thread count of the sweep.
floor = {k: max(r["MiB_per_s"] for r in rows if r["row"].startswith("floor-") and r["round"] == k) for k in rounds}
for th in (1, 2, 4, 8):
    print("floor sweep, %d threads: %s MiB/s" % (th, rng([r["MiB_per_s"] for r in pick(row="floor-%d" % th)], "%.0f")))
print()
print("| row | MiB/s median (range) | × the floor | samples/s | client CPU ms / MiB | server CPU ms / MiB |")
print("| --- | --- | --- | --- | --- | --- |")
def line(label, sel, ratio=True):
    rs = pick(**sel)
    if not rs:
        return
    xs = [r["MiB_per_s"] for r in rs]
    per = lambda r, k: 1000 * r[k] / (r["epoch_bytes"] / 2**20) if k in r else None
    cpu = [per(r, "cpu_s") for r in rs]
    srv = [per(r, "server_cpu_s") for r in rs if "server_cpu_s" in r]
    sps = [r["samples"] / r["seconds"] for r in rs if "samples" in r]
    print("| %s | %s | %s | %s | %s | %s |" % (label, rng(xs, "%.0f"), rng([x / floor[r["round"]] for x, r in zip(xs, rs)]) if ratio else "",
                                           rng(sps, "%.0f") if sps else "", rng(cpu, "%.1f"), rng(srv, "%.1f") if srv else ""))
best = {k: max((r for r in rows if r["row"].startswith("floor-") and r["round"] == k), key=lambda r: r["MiB_per_s"]) for k in rounds}
xs = [best[k]["MiB_per_s"] for k in rounds]
print("| floor: plain boto3 ranged GETs, the best of 1/2/4/8 threads | %s | 1 | | %s | %s |" % (
    rng(xs, "%.0f"), rng([1000 * best[k]["cpu_s"] / (best[k]["epoch_bytes"] / 2**20) for k in rounds], "%.1f"),
    rng([1000 * best[k]["server_cpu_s"] / (best[k]["epoch_bytes"] / 2**20) for k in rounds], "%.1f")))
line("checked floor: the same GETs (4 threads), written to local files and hashed (sha256) as they come", dict(row="checked-4"))
line("clipshard Loader, bucket, cold cache", dict(row="loader", cache="cold", step_ms=0.0))
line("clipshard Loader, bucket, warm cache", dict(row="loader", cache="warm"))
for R in (2, 4):
    line("clipshard Loader, %d ranks, a cache each (nodes), all at once" % R, dict(row="ranks-%d" % R))
line("clipshard Loader, the local folder", dict(row="local"))
for t, name in (("mosaic", "Mosaic Streaming"), ("litdata", "LitData")):
    for w in (0, 2):
        line("%s, its shards, cold cache, %d workers" % (name, w), dict(row="%s-%d" % (t, w)))
print()
for R in (2, 4):
    e = [r["egress"] for r in pick(row="ranks-%d" % R)]
    print("Cluster egress, %d ranks each with a cache of its own: %s × the bytes of the samples read" % (R, rng(e, "%.3f")))
for S in (20.0, 60.0):
    w = pick(row="loader", step_ms=S)
    if w:
        per_batch = w[0]["epoch_bytes"] / 1e6 / max(1, -(-w[0]["samples"] // 256))
        print("A step of %d ms, cold cache (a batch is %.1f MB: %.0f MB/s consumed): the wait for the next batch, median %s ms, p90 %s ms" % (
            S, per_batch, per_batch / (S / 1000), rng([r["wait_median_ms"] for r in w]), rng([r["wait_p90_ms"] for r in w])))
push = [r["seconds"] for r in pick(row="push")]
plain = [r["seconds"] for r in pick(row="upload")]
print("push: %s s; a plain boto3 multipart upload of the same files: %s s; push is %s × its speed" % (rng(push), rng(plain), rng([b / a for a, b in zip(push, plain)])))
PY
[ -s "$LOUT" ] && "$PY" - "$LOUT" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
def rng(xs, f="%.2f"):
    return (f + " (" + f + "–" + f + ")") % (st.median(xs), min(xs), max(xs)) if xs else "–"
print()
print("| link (each way) | floor MiB/s: the better of 4, 8 threads | checked floor MiB/s | × the floor | Loader, cold cache, MiB/s | × the floor | Loader client CPU ms / MiB |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for link in dict.fromkeys(r["link"] for r in rows):
    rs = [r for r in rows if r["link"] == link]
    rounds = sorted({r["round"] for r in rs})
    floor = {k: max(r["MiB_per_s"] for r in rs if r["row"].startswith("floor-") and r["round"] == k) for k in rounds}
    def of(row):
        return [r for r in rs if r["row"] == row]
    ck, ld = of("checked-4"), of("loader")
    print("| %s | %s | %s | %s | %s | %s | %s |" % (
        link, rng(list(floor.values()), "%.0f"), rng([r["MiB_per_s"] for r in ck], "%.0f"),
        rng([r["MiB_per_s"] / floor[r["round"]] for r in ck]), rng([r["MiB_per_s"] for r in ld], "%.0f"),
        rng([r["MiB_per_s"] / floor[r["round"]] for r in ld]), rng([1000 * r["cpu_s"] / (r["epoch_bytes"] / 2**20) for r in ld], "%.1f")))
PY
