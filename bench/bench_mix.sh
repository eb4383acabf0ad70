#!/usr/bin/env bash
# Mixing three sources against one dataset of the same bytes (just
# bench-mix, #25): the mixed benchmark set (bench/bench_gen_mixed.py: four
# modalities, float16 and float32 features, mixed byte orders, one clip
# 20x the median) converted once whole ("one") and once as three datasets
# of its clips (1/2, 1/3 and 1/6 of them: "a", "b", "c"). Each shuffle
# writes 2 epochs of the same number of samples (one's own count; the mix
# weighs a=0.2, b=0.3, c=0.5, so a is subsampled and c upsampled 3x),
# in memory (--mem 8GiB) and on the external path (--mem 256MiB); the one
# and mix runs of a path alternate (bestpair: rounds). Wall time (median,
# range of RUNS rounds), the ratio of the two in each round, peak RSS.
# Usage: bench/bench_mix.sh [WORKDIR]   (default /tmp/clipshard-bench; needs python3-numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
M="$W/mix-src"
go build -o "$W/" ./cmd/clipshard
C="$W/clipshard"
[ -f "$M/clips.txt" ] || "$PY" bench/bench_gen_mixed.py "$M" "${CLIPS:-900}" 20
mods=(-m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy' -m 'w2v=w2v/{clip}.npy' -m 'emotion=emotion/{clip}.npy')
n=$(wc -l < "$M/clips.txt")
head -n $((n / 2)) "$M/clips.txt" > "$M/a.txt"
sed -n "$((n / 2 + 1)),$((n / 2 + n / 3))p" "$M/clips.txt" > "$M/b.txt"
tail -n +$((n / 2 + n / 3 + 1)) "$M/clips.txt" > "$M/c.txt"
for s in one a b c; do
  list="$M/$s.txt"; [ "$s" = one ] && list="$M/clips.txt"
  [ -f "$W/mix-$s/dataset.json" ] || "$C" convert --quiet --clips "$list" --root "$M" --out "$W/mix-$s" "${mods[@]}" >/dev/null
done
echo "datasets: one $(du -sh --apparent-size "$W/mix-one" | cut -f1) ($n clips); a $(du -sh --apparent-size "$W/mix-a" | cut -f1), b $(du -sh --apparent-size "$W/mix-b" | cut -f1), c $(du -sh --apparent-size "$W/mix-c" | cut -f1)"

common=(--window 15 --epochs 2 --seed 1 --shard-samples 1024 --quiet --force)
rm -rf "$W/mix-ep-one"
"$C" shuffle --dataset "$W/mix-one" --out "$W/mix-ep-one" "${common[@]}" --mem 8GiB
N=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["epochs"][0]["samples"])' "$W/mix-ep-one/epochs.json")
mix=(--source a="$W/mix-a" --source b="$W/mix-b" --source c="$W/mix-c" --weights a=0.2,b=0.3,c=0.5 --epoch-samples "$N")
echo "epochs: 2 x $N samples"
for path in in-memory:8GiB external:256MiB; do
  label=${path%%:*} mem=${path#*:}
  bestpair "one-$label" "$W/mix-ep-one" "$C" shuffle --dataset "$W/mix-one" --out "$W/mix-ep-one" "${common[@]}" --mem "$mem" -- \
    "mix3-$label" "$W/mix-ep-mix" "$C" shuffle "${mix[@]}" --out "$W/mix-ep-mix" "${common[@]}" --mem "$mem"
  echo "  $label: 3-source mix / one dataset, round by round: $(ratio "mix3-$label" "one-$label")x"
done
"$C" verify --deep "$W/mix-ep-mix" | tail -1
"$C" inspect "$W/mix-ep-mix" | grep -m3 "source "
du -sh --apparent-size "$W/mix-ep-one" "$W/mix-ep-mix"
