#!/usr/bin/env bash
# Peak RSS of convert and of both shuffle paths at --mem 64 MiB, 256 MiB
# and 2 GiB (just bench-memory), on a set of the kind that broke the bounds:
# 400 clips of float16 features [1000, 1024] plus one clip of [160000, 1024]
# (328 MB, larger than any --mem below 2 GiB), and motion pickles: a
# dataset of 1.15 GB. Best of 3 wall time, peak RSS from /usr/bin/time.
# Usage: docs/bench_memory.sh [WORKDIR]   (default /tmp/clipshard-bench-mem; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_DIR=${BENCH_DIR:-/tmp/clipshard-bench-mem}
. docs/bench_lib.sh
go build -o "$W/" ./cmd/convert ./cmd/shuffle
S="$W/src"
if [ ! -f "$S/clips.txt" ]; then
  "$PY" - "$S" <<'PYEOF'
import os, pickle, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out + "/feat", exist_ok=True); os.makedirs(out + "/motion", exist_ok=True)
rng = np.random.default_rng(0)
clips = []
for i in range(401):
    c = "c%05d" % i
    t = 160000 if i == 200 else 1000
    np.save("%s/feat/%s.npy" % (out, c), rng.standard_normal((t, 1024), dtype=np.float32).astype(np.float16))
    with open("%s/motion/%s.pkl" % (out, c), "wb") as g:
        pickle.dump({"exp": rng.standard_normal((t, 50), dtype=np.float32),
                     "pose": rng.standard_normal((t, 6), dtype=np.float32)}, g, protocol=4)
    clips.append(c)
open(out + "/clips.txt", "w").write("\n".join(clips) + "\n")
PYEOF
fi
du -sh --apparent-size "$S" | awk '{print "sources " $1 " (one feature clip of 328 MB)"}'
RUNS=${RUNS:-3}
echo "convert (2 workers): features only (.npy, converted in pieces when large)"
for mem in 64MiB 256MiB 2GiB; do
  FRESH="$W/feat-$mem" best "--mem $mem" "$W/convert" --clips "$S/clips.txt" --out "$W/feat-$mem" --quiet --mem "$mem" \
    -m 'feat=feat/{clip}.npy'
done
rm -rf "$W"/feat-*
echo "convert (2 workers): features and motion pickles (a pickle is decoded whole)"
for mem in 64MiB 256MiB 2GiB; do
  FRESH="$W/ds-$mem" best "--mem $mem" "$W/convert" --clips "$S/clips.txt" --out "$W/ds-$mem" --quiet --mem "$mem" \
    -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose'
done
DS="$W/ds-2GiB"
du -sh --apparent-size "$DS" | awk '{print "dataset " $1}'
echo "shuffle (window 15, 1 epoch; external below 4/3 of the dataset)"
for mem in 64MiB 256MiB 2GiB; do
  for fs in "" --no-fsync; do
    FRESH="$W/ep" best "--mem $mem $fs" "$W/shuffle" --dataset "$DS" --out "$W/ep" --window 15 --epochs 1 --seed 1 --mem "$mem" $fs --quiet
  done
done
