#!/usr/bin/env bash
# The trainer's read (just bench read):
#   1. cold epoch read per rank with R = 1, 2, 8 simulated ranks: format 2
#      (one global order, each rank reads its slices) against the per-rank
#      files of format 1 (built from commit fc32e5d, side by side, now), on
#      the ~330 MB set of bench-shuffle (bench/bench_ranks.py);
#   2. shuffle quality of clipshard epochs, replay, replay + mix, and
#      simulated WebDataset, FFCV and Mosaic orders, on 7000 clips of
#      1000-2000 frames (lengths only: frames of one value)
#      (bench/bench_quality.py).
# Usage: bench/bench_read.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy and git history)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
S="$W/shuf"
mkdir -p "$W/old"
go build -o "$W/" ./cmd/convert ./cmd/shuffle
if [ ! -x "$W/old/shuffle" ]; then
  git worktree add -q --detach "$W/old/src" fc32e5d
  (cd "$W/old/src" && go build -o "$W/old/" ./cmd/shuffle && cp python/clipshard_reader.py "$W/old/")
  git worktree remove --force "$W/old/src"
fi
[ -f "$S/clips.txt" ] || "$PY" bench/bench_gen.py "$S" 200 600 1000 1024
[ -f "$W/shuf-ds/dataset.json" ] || "$W/convert" --quiet --clips "$S/clips.txt" --out "$W/shuf-ds" -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' >/dev/null
args=(--dataset "$W/shuf-ds" --window 15 --epochs 1 --seed 1 --shard-samples 1024 --quiet)
rm -rf "$W/ranks-new" "$W"/ranks-old-*
"$W/shuffle" "${args[@]}" --out "$W/ranks-new"
for R in 1 2 8; do "$W/old/shuffle" "${args[@]}" --world-size $R --out "$W/ranks-old-$R"; done
sync; sleep 3
echo "cold read per rank, batch 256 ($(du -sh --apparent-size "$W/ranks-new/epoch-0000" | cut -f1) epoch):"
"$PY" bench/bench_ranks.py "$W/old" "$W/ranks-new" "$W/ranks-old-1" "$W/ranks-old-2" "$W/ranks-old-8"

Q="$W/quality"
if [ ! -f "$Q/src/clips.txt" ]; then
  mkdir -p "$Q/src/x"
  "$PY" - "$Q/src" <<'PYEOF'
import sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(0)
ids = []
for i in range(7000):
    np.save("%s/x/c%05d.npy" % (out, i), np.zeros((int(rng.integers(1000, 2000)), 1), np.float16))
    ids.append("c%05d" % i)
open(out + "/clips.txt", "w").write("\n".join(ids) + "\n")
PYEOF
fi
[ -f "$Q/ds/dataset.json" ] || "$W/convert" --quiet --clips "$Q/src/clips.txt" --out "$Q/ds" -m 'x=x/{clip}.npy' >/dev/null
[ -f "$Q/ep/epochs.json" ] || "$W/shuffle" --quiet --dataset "$Q/ds" --out "$Q/ep" --window 15 --epochs 2 --seed 1 --shard-samples 1024 --no-fsync
echo "shuffle quality, batch 256:"
"$PY" bench/bench_quality.py "$Q/ep" 256
