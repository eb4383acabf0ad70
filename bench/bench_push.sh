#!/usr/bin/env bash
# just bench push: clipshard push before and after a change, side by side
# in one run, on versitygw over loopback (started here on 127.0.0.1,
# stopped by PID), rows interleaved in 3 rounds: push of the mixed bench
# set with one huge clip (bench/bench_gen_mixed.py: motion pickles, whisper
# stored float16, w2v and emotion float32; 4 modalities) and of one epoch
# cut from it (W=15), each into a fresh prefix, by the build of BENCH_OLD
# (a git revision, built from a worktree) and by this checkout's; the same
# push again (up to date); and the floor: a plain boto3 multipart upload of
# the same files (upload_file, 16 MiB parts, 4 threads: boto3 at its
# documented default concurrency and the part size push uses).
#   bench/bench_push.sh [WORKDIR]   (BENCH_OLD: the revision to compare, default
#                                  the first parent of HEAD; CLIPSHARD_VERSITYGW;
#                                  BENCH_CLIPS: clips of the set, default 400;
#                                  BENCH_PYTHON: a python3 with boto3)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-${BENCH_DIR:-/tmp/clipshard-bench}}
mkdir -p "$W"
PY=${BENCH_PYTHON:-python3}
"$PY" -c 'import boto3, numpy' 2>/dev/null || { echo "bench-push needs a python3 with numpy and boto3 (BENCH_PYTHON)"; exit 1; }
VGW=${CLIPSHARD_VERSITYGW:-${XDG_CACHE_HOME:-$HOME/.cache}/clipshard-ci/bin/versitygw}
[ -x "$VGW" ] || { echo "bench-push needs versitygw: GOBIN=\$HOME/.cache/clipshard-ci/bin go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"; exit 1; }
OLD=${BENCH_OLD:-HEAD~1}
OLDREV=$(git rev-parse --short "$OLD")
NEWREV=$(git rev-parse --short HEAD)$([ -z "$(git status --porcelain)" ] || echo "+changes")
mkdir -p "$W/push-new" "$W/push-old"
go build -o "$W/push-new/" ./cmd/clipshard
WT="$W/push-old-src"
rm -rf "$WT"; git worktree prune
git worktree add -q --detach "$WT" "$OLDREV"
(cd "$WT" && go build -o "$W/push-old/" ./cmd/clipshard)
git worktree remove --force "$WT"
M="$W/mixed-huge"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" "${BENCH_CLIPS:-400}" 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
DS="$W/mixed-huge-ds"
[ -f "$DS/dataset.json" ] || "$W/push-new/clipshard" convert --quiet --clips "$M/clips.txt" --out "$DS" "${mods[@]}" >/dev/null
EP="$W/push-ep"
[ -f "$EP/epochs.json" ] || "$W/push-new/clipshard" shuffle --quiet --dataset "$DS" --out "$EP" --window 15 --epochs 1 --seed 3 >/dev/null

ROOT="$W/push-root"; rm -rf "$ROOT"; mkdir -p "$ROOT/bench"
PORT=$(( 20000 + RANDOM % 20000 ))
ROOT_ACCESS_KEY=bench ROOT_SECRET_KEY=bench-secret-key "$VGW" --port "127.0.0.1:$PORT" posix "$ROOT" > "$W/vgw-push.log" 2>&1 &
VPID=$!
trap 'kill $VPID 2>/dev/null || true; sleep 0.5; kill -9 $VPID 2>/dev/null || true' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1
export AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
OUT="$W/push.jsonl"; : > "$OUT"
echo "old $OLDREV, new $NEWREV; $(nproc) cores; dataset $(du -sh --apparent-size "$DS" | cut -f1), epoch $(du -sh --apparent-size "$EP" | cut -f1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
now() { date +%s%N; }
row() { awk -v n="$1" -v w="$2" -v a="$3" -v b="$4" -v r="$5" 'BEGIN{printf "{\"row\": \"%s\", \"what\": \"%s\", \"round\": %d, \"seconds\": %.4f}\n", n, w, r, (b-a)/1e9}' >> "$OUT"; }
plain() { # plain boto3 multipart uploads of every file of folder $1 to prefix $2
  "$PY" - "$1" "$2" <<'EOF'
import os, sys, boto3
from boto3.s3.transfer import TransferConfig
c = boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)
for r, _, names in os.walk(sys.argv[1]):
    for n in sorted(names):
        c.upload_file(os.path.join(r, n), "bench", sys.argv[2] + "/" + os.path.relpath(os.path.join(r, n), sys.argv[1]), Config=cfg)
EOF
}
for round in 1 2 3; do
  for what in dataset epochs; do
    src=$DS; [ "$what" = epochs ] && src=$EP
    for b in old new; do
      p="$b-$what-$round"
      t=$(now); "$W/push-$b/clipshard" push --quiet "$src" "s3://bench/$p" >/dev/null; t2=$(now)
      row "push $b" "$what" "$t" "$t2" "$round"
      t=$(now); "$W/push-$b/clipshard" push --quiet "$src" "s3://bench/$p" >/dev/null; t2=$(now)
      row "again $b" "$what" "$t" "$t2" "$round"
      rm -rf "$ROOT/bench/$p"
    done
    t=$(now); plain "$src" "plain-$what-$round"; t2=$(now)
    row "plain boto3" "$what" "$t" "$t2" "$round"
    rm -rf "$ROOT/bench/plain-$what-$round"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT" "$DS" "$EP" <<'EOF'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
size = {w: sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(d) for n in ns) for w, d in (("dataset", sys.argv[2]), ("epochs", sys.argv[3]))}
print("| row | dataset s (MiB/s) | epochs s (MiB/s) |")
print("| --- | --- | --- |")
for name in ("push old", "push new", "plain boto3", "again old", "again new"):
    cells = []
    for w in ("dataset", "epochs"):
        s = sorted(r["seconds"] for r in rows if r["row"] == name and r["what"] == w)
        med = s[len(s) // 2]
        cells.append("%.3f (%.3f–%.3f)%s" % (med, s[0], s[-1], "" if name.startswith("again") else " (%.0f)" % (size[w] / (1 << 20) / med)))
    print("| %s | %s | %s |" % (name, cells[0], cells[1]))
EOF
