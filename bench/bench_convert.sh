#!/usr/bin/env bash
# Side-by-side convert benchmark (just bench convert):
#   convert  vs  cat of the same source files  vs  a plain numpy/pickle script
# on generated sets, warm page cache; the rows of each set run in turn, one
# run of each a round, 5 rounds (rounds, bench/bench_lib.sh): median (range),
# best, peak RSS, load average; the ratios are of the medians.
#   large: 200 clips, float32 [400, 1024] features (.npy) + motion pickles (~340 MB)
#   small: 5000 clips, float32 [30, 64] features (.npy) + motion pickles (many small files)
#   mixed: 400 clips, four modalities (float16 whisper, float32 w2v and emotion,
#          motion pickles), a quarter of the .npy files big-endian, Fortran or
#          float64 (~380 MB), against the floor: page-cache read + durable write
#   huge:  one 512 MiB float32 clip among 40 small ones (bench/bench_gen_huge.py)
# Usage: bench/bench_convert.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
go build -o "$W/convert" ./cmd/convert
go build -o "$W/verify" ./cmd/verify

gen() { # name clips T D
  [ -f "$W/$1/clips.txt" ] || "$PY" bench/bench_gen.py "$W/$1" "$2" "$3" "$3" "$4"
}

cat > "$W/numpy_convert.py" <<'PYEOF'
# The straightforward script: load every clip, astype(float16), concatenate, save.
import os, pickle, sys
import numpy as np
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
clips = [l.strip() for l in open(src + "/clips.txt") if l.strip()]
feat, motion, index, start = [], [], [], 0
for c in clips:
    f = np.load("%s/feat/%s.npy" % (src, c)).astype(np.float16)
    with open("%s/motion/%s.pkl" % (src, c), "rb") as g:
        m = pickle.load(g)
    motion.append(np.concatenate([m["exp"], m["pose"]], axis=-1).astype(np.float16))
    feat.append(f)
    index.append((start, len(f))); start += len(f)
np.save(out + "/feat.npy", np.concatenate(feat))
np.save(out + "/motion.npy", np.concatenate(motion))
np.save(out + "/index.npy", np.array(index, dtype=np.int64))
PYEOF


for set in large small; do
  case $set in
    large) gen large 200 400 1024 ;;
    small) gen small 5000 30 64 ;;
  esac
  S="$W/$set"
  du -sh --apparent-size "$S" | awk '{print "'"$set"': sources " $1}'
  cat "$S"/feat/*.npy "$S"/motion/*.pkl > /dev/null   # warm the page cache
  # Every run writes a new output (the previous one removed first,
  # untimed): freeing 200-300 MB of blocks is not conversion work, and on
  # this VM's discard-mounted disk it costs 30-40 ms. cat+fsync: cat made
  # as durable as convert's output (convert fsyncs what it writes).
  rounds cat "$W/cat.out" sh -c "cat '$S'/feat/*.npy '$S'/motion/*.pkl > '$W/cat.out'" -- \
    cat+fsync "$W/cat.out" sh -c "cat '$S'/feat/*.npy '$S'/motion/*.pkl > '$W/cat.out' && sync -f '$W/cat.out'" -- \
    convert "$W/$set-ds" "$W/convert" --clips "$S/clips.txt" --out "$W/$set-ds" --quiet -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' -- \
    numpy "$W/$set-np" "$PY" "$W/numpy_convert.py" "$S" "$W/$set-np"
  awk -v c="$(cat "$W/convert.median")" -v k="$(cat "$W/cat.median")" -v f="$(cat "$W/cat+fsync.median")" -v n="$(cat "$W/numpy.median")" \
    'BEGIN{printf "  medians: convert/cat %.2fx   convert/(cat+fsync) %.2fx   numpy/convert %.2fx\n", c/k, c/f, n/c}'
  cmp "$W/$set-ds/feat.npy" "$W/$set-np/feat.npy" >/dev/null 2>&1 || \
    "$PY" -c "import numpy as np,sys; a=np.load(sys.argv[1]); b=np.load(sys.argv[2]); assert (a.view('u2')==b.view('u2')).all(); print('  convert output == numpy output (bits)')" "$W/$set-ds/feat.npy" "$W/$set-np/feat.npy"
  rm -f "$W/cat.out"
done

# The mixed set, of the kind users have (bench/bench_gen_mixed.py): motion
# pickles, whisper stored as float16 [2T, 512], w2v float32 [T, 1024],
# emotion float32 [T, 8]; a quarter of the .npy files big-endian, Fortran
# or float64. The floor that bounds convert: reading the sources from the
# page cache plus a durable write (O_DIRECT, fsync) of the output's size.
M="$W/mixed"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" 400
cat > "$W/numpy_mixed.py" <<'PYEOF'
# The straightforward script for the mixed set: load, astype(float16), concatenate, save.
import os, pickle, sys
import numpy as np
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
clips = [l.strip() for l in open(src + "/clips.txt") if l.strip()]
mods = {"whisper": [], "w2v": [], "emotion": [], "motion": []}
for c in clips:
    for m in ("whisper", "w2v", "emotion"):
        mods[m].append(np.load("%s/%s/%s.npy" % (src, m, c)).astype(np.float16))
    with open("%s/motion/%s.pkl" % (src, c), "rb") as g:
        d = pickle.load(g)
    mods["motion"].append(np.concatenate([d["exp"], d["pose"]], axis=-1).astype(np.float16))
for m, parts in mods.items():
    np.save("%s/%s.npy" % (out, m), np.concatenate(parts))
PYEOF
echo "mixed: sources $(du -sh --apparent-size "$M" | cut -f1)"
cat "$M"/*/* > /dev/null
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
# One convert first (untimed): the floor's durable write is of its output's size.
"$W/convert" --clips "$M/clips.txt" --out "$W/mixed-ds" --quiet --force "${mods[@]}" >/dev/null
out=$(du -b "$W/mixed-ds" | cut -f1)
# Every row a goal compares runs in the same rounds: this VM's speed
# drifts by 10-20 % over minutes, which one block of runs after the other
# would add to the ratio.
rounds read-sources "" sh -c "cat '$M'/*/* > /dev/null" -- \
  write-direct+fsync "$W/dd.out" dd if=/dev/zero of="$W/dd.out" bs=4M count=$((out / 4194304)) oflag=direct conv=fsync status=none -- \
  convert-mixed "$W/mixed-ds" "$W/convert" --clips "$M/clips.txt" --out "$W/mixed-ds" --quiet "${mods[@]}" -- \
  numpy-mixed "$W/mixed-np" "$PY" "$W/numpy_mixed.py" "$M" "$W/mixed-np" -- \
  convert-float16 "$W/whisper-ds" "$W/convert" --clips "$M/clips.txt" --out "$W/whisper-ds" --quiet -m 'whisper@2=whisper/{clip}.npy' -- \
  cat-float16 "$W/cat.out" sh -c "cat '$M'/whisper/*.npy > '$W/cat.out'"
awk -v c="$(cat "$W/convert-mixed.median")" -v r="$(cat "$W/read-sources.median")" -v w="$(cat "$W/write-direct+fsync.median")" \
    -v n="$(cat "$W/numpy-mixed.median")" -v f="$(cat "$W/convert-float16.median")" -v k="$(cat "$W/cat-float16.median")" \
  'BEGIN{printf "  medians: mixed: convert/(read + durable write) %.2fx (goal <= 1.3x)   numpy/convert %.2fx (goal >= 3x)\n  float16 only: convert/cat %.2fx (goal <= 2x)\n", c/(r+w), n/c, f/k}'
rm -rf "$W/dd.out" "$W/cat.out" "$W/mixed-np" "$W/whisper-ds"

# One huge clip (512 MiB of float32) among 40 small ones (bench/bench_gen_huge.py):
# converted a piece at a time, at the default --mem.
H="$W/huge"
[ -f "$H/clips.txt" ] || "$PY" bench/bench_gen_huge.py "$H"
echo "huge clip: sources $(du -sh --apparent-size "$H" | cut -f1)"
cat "$H"/feat/*.npy > /dev/null
rounds cat-huge "$W/cat.out" sh -c "cat '$H'/feat/*.npy > '$W/cat.out'" -- \
  convert-huge "$W/huge-ds" "$W/convert" --clips "$H/clips.txt" --out "$W/huge-ds" --quiet -m 'feat=feat/{clip}.npy'
awk -v c="$(cat "$W/convert-huge.median")" -v k="$(cat "$W/cat-huge.median")" 'BEGIN{printf "  medians: huge clip: convert/cat %.2fx\n", c/k}'
rm -rf "$W/cat.out" "$W/huge-ds"

# verify (default level: structure + sha256 of every file) vs sha256sum of
# the same files, on the large dataset just written.
echo "verify vs sha256sum (large dataset, $(du -sh --apparent-size "$W/large-ds" | cut -f1))"
rounds sha256sum "" sh -c "cd '$W/large-ds' && sha256sum -c SHA256SUMS" -- \
  verify "" "$W/verify" --quiet "$W/large-ds"
awk -v v="$(cat "$W/verify.median")" -v s="$(cat "$W/sha256sum.median")" \
  'BEGIN{printf "  medians: verify throughput = %.2fx sha256sum\n", s/v}'
