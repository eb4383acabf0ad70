#!/usr/bin/env bash
# just bench ab: the Python reader of BENCH_OLD (a git ref, default
# HEAD~1; a worktree of it is made under WORKDIR) against this checkout's,
# on the mixed bench set (bench/bench_gen_mixed.py, 400 clips, one 20x the
# median) converted and cut by this checkout's clipshard:
#   1. every batch's sha256, in order, in each mode of bench/bench_ab.py
#      (materialised float32 torch, an EpochReader, replayed and mixed
#      shards, drawn, two sources mixed, from a bucket, drawn from a
#      bucket): the two readers' must be equal;
#   2. a state saved by each reader a third of the way through, loaded by
#      the other: the rest must be the same batches;
#   3. samples/s of the materialised, drawn and bucket Loaders (float32
#      torch; the bucket's with a cold cache), the two readers' rows
#      interleaved in ROUNDS rounds (default 5), each a new process:
#      median (range), and new / old round by round.
# The bucket is a versitygw on 127.0.0.1 started here and stopped by PID.
#   bench/bench_ab.sh [WORKDIR]   (CLIPSHARD_PYTHON: a Python with numpy, torch, boto3;
#                                 CLIPSHARD_VERSITYGW: the server, else .ci/run's cache)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
OLD=${BENCH_OLD:-HEAD~1}
ROUNDS=${ROUNDS:-5}
"$PY" -c 'import numpy, torch, boto3' || { echo "bench ab needs numpy, torch and boto3 in $PY"; exit 1; }
VGW=${CLIPSHARD_VERSITYGW:-${XDG_CACHE_HOME:-$HOME/.cache}/clipshard-ci/bin/versitygw}
[ -x "$VGW" ] || { echo "bench ab needs versitygw: GOBIN=\$HOME/.cache/clipshard-ci/bin go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"; exit 1; }
A="$W/ab"
rm -rf "$A/old"
mkdir -p "$A"
git worktree add --detach --force "$A/old" "$OLD" >/dev/null 2>&1 || { git worktree prune; git worktree add --detach --force "$A/old" "$OLD" >/dev/null; }
trap 'git worktree remove --force "$A/old" 2>/dev/null || true' EXIT
echo "old: $(git -C "$A/old" log -1 --format='%h %s' | cut -c1-80)"
echo "new: $(git log -1 --format='%h' HEAD)$(git diff --quiet HEAD -- python || echo ' + the working tree')"
go build -o "$A/" ./cmd/clipshard
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" 400 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
if [ ! -f "$A/mix/epochs.json" ]; then
  rm -rf "$A/ds" "$A/ds2" "$A/ep" "$A/mix"
  "$A/clipshard" convert --quiet --clips "$M/clips.txt" --out "$A/ds" "${mods[@]}" >/dev/null
  head -200 "$M/clips.txt" > "$M/half.txt"  # (beside clips.txt: the templates are relative to the list's folder)
  "$A/clipshard" convert --quiet --clips "$M/half.txt" --out "$A/ds2" "${mods[@]}" >/dev/null
  "$A/clipshard" shuffle --quiet --dataset "$A/ds" --out "$A/ep" --window 15 --epochs 3 --seed 3 --shard-samples 512 >/dev/null
  "$A/clipshard" shuffle --quiet --source "a=$A/ds" --source "b=$A/ds2" --out "$A/mix" --window 15 --epochs 1 --seed 4 >/dev/null
fi

ROOT="$A/s3-root"; rm -rf "$ROOT"; mkdir -p "$ROOT/bench"
PORT=$(( 20000 + RANDOM % 20000 ))
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key "$VGW" --port "127.0.0.1:$PORT" posix "$ROOT" > "$A/vgw.log" 2>&1 &
VPID=$!
stop() { kill "$VPID" 2>/dev/null || true; sleep 0.5; kill -9 "$VPID" 2>/dev/null || true; git worktree remove --force "$A/old" 2>/dev/null || true; }
trap stop EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
"$A/clipshard" push --quiet "$A/ep" s3://bench/ep >/dev/null
"$A/clipshard" push --quiet "$A/ds" s3://bench/ds >/dev/null

old="$A/old/python" new="$PWD/python"
ab() { "$PY" bench/bench_ab.py "$@"; }
fail=0
echo "| mode | batches | old sha256 | new | the same | old state resumed by new | new state by old |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for mode in materialised reader replay drawn mixed bucket drawn-bucket; do
  o=$(ab hash "$mode" "$old" "$A"); n=$(ab hash "$mode" "$new" "$A")
  "$PY" -c 'import json, sys; json.dump(json.loads(sys.argv[1])["state"], open(sys.argv[2], "w"))' "$o" "$A/state-old.json"
  "$PY" -c 'import json, sys; json.dump(json.loads(sys.argv[1])["state"], open(sys.argv[2], "w"))' "$n" "$A/state-new.json"
  on=$(ab resume "$mode" "$new" "$A" "$A/state-old.json"); no=$(ab resume "$mode" "$old" "$A" "$A/state-new.json")
  "$PY" - "$mode" "$o" "$n" "$on" "$no" <<'PY' || fail=1
import json, sys
mode, o, n, on, no = sys.argv[1], *(json.loads(x) for x in sys.argv[2:])
same = o["sha256"] == n["sha256"] and o["batches"] == n["batches"]
r1 = on["rest_sha256"] == o["rest_sha256"]
r2 = no["rest_sha256"] == n["rest_sha256"]
print("| %s | %d | %s | %s | %s | %s (%d batches) | %s (%d) |" % (mode, o["batches"], o["sha256"][:12], n["sha256"][:12],
      "yes" if same else "**NO**", "yes" if r1 else "**NO**", on["resumed_batches"], "yes" if r2 else "**NO**", no["resumed_batches"]))
sys.exit(0 if same and r1 and r2 else 1)
PY
done

OUT="$A/speed.jsonl"; : > "$OUT"
echo "speed: $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for mode in materialised drawn bucket; do
    for side in old new; do
      pkg=$old; [ $side = new ] && pkg=$new
      ab speed "$mode" "$pkg" "$A" | sed "s/}$/, \"side\": \"$side\", \"round\": $r}/" >> "$OUT"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| mode (float32 torch, B=256) | old samples/s | new samples/s | new / old, round by round |")
print("| --- | --- | --- | --- |")
for mode in ("materialised", "drawn", "bucket"):
    got = {s: {r["round"]: r["samples_s"] for r in rows if r["mode"] == mode and r["side"] == s} for s in ("old", "new")}
    ratio = [got["new"][k] / got["old"][k] for k in got["old"] if k in got["new"]]
    cell = lambda v: "%.0f (%.0f–%.0f)" % (st.median(v), min(v), max(v))
    print("| %s%s | %s | %s | %.2f (%.2f–%.2f) |" % (mode, ", cold cache" if mode == "bucket" else ", warm",
          cell(list(got["old"].values())), cell(list(got["new"].values())), st.median(ratio), min(ratio), max(ratio)))
PY
[ "$fail" = 0 ] || { echo "bench ab: the readers' batches or states differ (above)"; exit 1; }
