#!/usr/bin/env bash
# Peak RSS of convert and of both shuffle paths at --mem 64 MiB, 256 MiB
# and 2 GiB (just bench memory), on a set of the kind that broke the bounds:
# 400 clips of float16 features [1000, 1024] plus one clip of [160000, 1024]
# (328 MB, larger than any --mem below 2 GiB), and motion pickles: a
# dataset of 1.15 GB. The rows of each table in turn, 3 rounds (RUNS):
# the median, range and best wall time, peak RSS from /usr/bin/time.
# Usage: bench/bench_memory.sh [WORKDIR]   (default /tmp/clipshard-bench-mem; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_DIR=${BENCH_DIR:-/tmp/clipshard-bench-mem}
. bench/bench_lib.sh
go build -o "$W/" ./cmd/convert ./cmd/shuffle ./cmd/verify
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
rows=()
for mem in 64MiB 256MiB 2GiB; do
  rows+=("--mem $mem" "$W/feat-$mem" "$W/convert" --clips "$S/clips.txt" --out "$W/feat-$mem" --quiet --mem "$mem" \
    -m 'feat=feat/{clip}.npy' --)
done
rounds "${rows[@]}"
rm -rf "$W"/feat-*
echo "convert (2 workers): features and motion pickles (a pickle is decoded whole)"
rows=()
for mem in 64MiB 256MiB 2GiB; do
  rows+=("--mem $mem" "$W/ds-$mem" "$W/convert" --clips "$S/clips.txt" --out "$W/ds-$mem" --quiet --mem "$mem" \
    -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' --)
done
rounds "${rows[@]}"
echo "verify --sources (the 328 MB feature clip is compared a piece at a time)"
rounds "verify --mem 64MiB" "" "$W/verify" --sources --quiet --mem 64MiB "$W/ds-2GiB" -- \
  "verify --mem 256MiB" "" "$W/verify" --sources --quiet --mem 256MiB "$W/ds-2GiB"
DS="$W/ds-2GiB"
du -sh --apparent-size "$DS" | awk '{print "dataset " $1}'
echo "shuffle (window 15, 1 epoch; external below 4/3 of the dataset)"
rows=()
for mem in 64MiB 256MiB 2GiB; do
  for fs in "" --no-fsync; do
    rows+=("--mem $mem $fs" "$W/ep" "$W/shuffle" --dataset "$DS" --out "$W/ep" --window 15 --epochs 1 --seed 1 --mem "$mem" $fs --quiet --)
  done
done
rounds "${rows[@]}"

# Many modalities, thousands of clips (#26.8): 4,000 clips of 8 float32
# modalities [40..89, 128] (1 GB of sources); the blobs' write buffers
# come out of --mem.
MS="$W/many"
if [ ! -f "$MS/clips.txt" ]; then
  "$PY" - "$MS" <<'PYEOF'
import os, sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(0)
for m in "abcdefgh":
    os.makedirs("%s/%s" % (out, m), exist_ok=True)
for i in range(4000):
    for m in "abcdefgh":
        np.save("%s/%s/c%d.npy" % (out, m, i), rng.standard_normal((40 + i % 50, 128), dtype=np.float32))
open(out + "/clips.txt", "w").write("".join("c%d\n" % i for i in range(4000)))
PYEOF
fi
echo "convert (2 workers): 4,000 clips of 4 and 8 modalities"
rows=()
for n in 4 8; do
  mods=()
  for m in a b c d e f g h; do
    [ ${#mods[@]} -lt $((2 * n)) ] && mods+=(-m "$m=$m/{clip}.npy")
  done
  for mem in 64MiB 256MiB; do
    rows+=("$n modalities --mem $mem" "$W/many-ds" "$W/convert" --clips "$MS/clips.txt" --out "$W/many-ds" --quiet --mem "$mem" "${mods[@]}" --)
  done
done
rounds "${rows[@]}"
rm -rf "$W/many-ds"
