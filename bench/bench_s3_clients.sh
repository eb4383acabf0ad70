#!/usr/bin/env bash
# just bench s3-clients: the two Go S3 clients clipshard push could use,
# minio-go v7 (what it uses) and aws-sdk-go-v2 (its transfer manager), on
# versitygw over loopback (started here on 127.0.0.1, stopped by PID): a
# 256 MiB multipart upload (16 MiB parts, 4 at once) and its 8 MiB ranged
# GETs (2 at once), the clients interleaved in ROUNDS rounds (default 5);
# the checksum headers each sends; create-only writes (412 the second
# time). bench/bench_s3_clients/ is a module of its own: clipshard itself
# depends on one client only.
#   bench/bench_s3_clients.sh [WORKDIR]   (CLIPSHARD_VERSITYGW: the server, else .ci/run's cache)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
VGW=${CLIPSHARD_VERSITYGW:-${XDG_CACHE_HOME:-$HOME/.cache}/clipshard-ci/bin/versitygw}
[ -x "$VGW" ] || { echo "bench-s3-clients needs versitygw: GOBIN=\$HOME/.cache/clipshard-ci/bin go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"; exit 1; }
F="$W/clients-256M"
[ -f "$F" ] || head -c 268435456 /dev/urandom > "$F"
ROOT="$W/clients-root"; rm -rf "$ROOT"; mkdir -p "$ROOT/bench"
PORT=$(( 20000 + RANDOM % 20000 ))
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key "$VGW" --port "127.0.0.1:$PORT" posix "$ROOT" > "$W/vgw-clients.log" 2>&1 &
VPID=$!
trap 'kill $VPID 2>/dev/null; sleep 0.5; kill -9 $VPID 2>/dev/null; rm -rf "$ROOT"; true' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
echo "$(go version | cut -d' ' -f3-); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
OUT="$W/clients.jsonl"
(cd bench/bench_s3_clients && go run . "$F" bench "${ROUNDS:-5}") > "$OUT"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
for p in mc awsc; do
  echo "$p: $(cd bench/bench_s3_clients && go list -deps -f '{{if .Module}}{{.Module.Path}}{{end}}' ./$p | sort -u | grep -vc '^github.com/clipshard') modules"
done
python3 - "$OUT" <<'PY'
import json, sys, statistics as st
print("| client | upload MiB/s, median (range) | ranged GET MiB/s, median (range) | checksum headers sent | If-None-Match: * twice |")
print("| --- | --- | --- | --- | --- |")
for l in open(sys.argv[1]):
    r = json.loads(l)
    rng = lambda xs: "%.0f (%.0f-%.0f)" % (st.median(xs), min(xs), max(xs)) if xs else "-"
    hs = sorted({h.split(":")[0] + (": aws-chunked" if "aws-chunked" in h else "") for h in r["checksum_headers"] or []})
    print("| %s | %s | %s | %s | %s |" % (r["client"], rng(r["upload_MiB_s"]), rng(r["get_MiB_s"]), ", ".join(hs) or "none", " then ".join(map(str, r["create_only"]))))
PY
