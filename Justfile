# clipshard developer recipes. `just --list` shows them.
# Everything here is plain shell underneath: see README.md for the commands.

python := env_var_or_default("CLIPSHARD_PYTHON", "/usr/bin/python3")

# Run the test suite (the README's test command).
test:
    go test ./...

# The test suite with the exhaustive cases on (as CI runs it: e.g. 200 torn-read runs instead of 15).
test-long:
    CLIPSHARD_EXHAUSTIVE=1 go test ./...

# The wheel with the clipshard command for this machine into dist/ (pip install dist/clipshard-*.whl); `just wheel --all`: linux x86_64 and aarch64 too (into dist/linux-ARCH/).
wheel *ARGS:
    python3 python/_build.py wheels {{ARGS}}

# Fuzz every parser for FUZZTIME each (default 10m).
fuzz FUZZTIME="10m":
    cd formats/npy && go test -run '^$' -fuzz '^FuzzRead$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd formats/pickle && go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd formats/pickle && go test -run '^$' -fuzz '^FuzzFast$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzLoadDataset$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzReadWhere$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzReadClips$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzReadSums$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzLoadEpochs$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzWeights$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzParseBlockSums$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    cd manifests && go test -run '^$' -fuzz '^FuzzParseClaim$' -fuzztime {{FUZZTIME}} -fuzzminimizetime 10s
    # The Python readers (testdata/fuzz_readers.py), a new seed each run: 20000 cases, ~25 min here.
    CLIPSHARD_FUZZ_SEED=$(date +%s) CLIPSHARD_FUZZ_CASES=20000 go test -count=1 -timeout 0 -run '^TestReaderFuzz$' ./python/checks

# Regenerate the decoder fixtures with real numpy (Debian: python3-numpy).
fixtures:
    {{python}} testdata/formats/gen.py
    bash testdata/formats/gen_numpy2.sh
    {{python}} testdata/demo/gen.py
    {{python}} testdata/convert/gen.py

# Go benchmarks of the decoders, the byte-order kernels and the float16 kernels, numpy's astype beside them, in 3 rounds (docs/bench_go.sh).
bench:
    CLIPSHARD_PYTHON={{python}} docs/bench_go.sh

# The README's demo (its first command, exactly as written there).
demo:
    bash -c "$(sed -n '/^<!-- demo -->/,/^<!-- \/demo -->/p' README.md | sed '1,2d;$d' | sed '$d')"

# Build the clipshard command (and its old names, aliases) into bin/.
build:
    go build -v -o bin/ ./cmd/...

# convert vs cat vs a numpy script on generated sets (docs/BENCHMARKS.md).
bench-convert:
    docs/bench_convert.sh

# Incremental convert vs a full rebuild, warm and cold page cache (docs/BENCHMARKS.md).
bench-incremental:
    docs/bench_incremental.sh

# Appending 1 % of clips: convert --segments vs the same line without it, a full convert, and the new clips alone (docs/BENCHMARKS.md).
bench-append:
    docs/bench_append.sh

# external shuffle vs cp, and the training-read simulation (docs/BENCHMARKS.md).
bench-shuffle:
    docs/bench_shuffle.sh

# Merge the parts of a partitioned convert and check the result (docs/SCALING.md).
merge PARTS DATASET:
    go run ./cmd/clipshard convert --merge {{PARTS}}/part-* --out {{DATASET}}
    go run ./cmd/clipshard verify {{DATASET}}

# Merge peak RSS on a dataset and on one 4x larger (docs/BENCHMARKS.md).
bench-merge:
    docs/bench_merge.sh

# The trainer's loop: clipshard's loader vs EpochDataset, naive per-clip and preload+gather, warm, cold, capped, over sshfs (docs/BENCHMARKS.md).
bench-train:
    docs/bench_train.sh

# Shuffle time and peak RSS of a 3-source mix against one dataset of the same bytes, in memory and external (docs/BENCHMARKS.md).
bench-mix:
    docs/bench_mix.sh

# Epochs drawn at read time against materialised ones: speed warm and cold, and the quality of the orders (docs/BENCHMARKS.md).
bench-drawn:
    docs/bench_drawn.sh

# clipshard against LitData, Mosaic Streaming and WebDataset: prepare, read, resume, shuffle quality (docs/BENCHMARKS.md).
bench-peers:
    docs/bench_peers.sh

# Cold read per rank (R = 1, 2, 8) against format 1's per-rank files, and the shuffle-quality table (docs/BENCHMARKS.md).
bench-read:
    docs/bench_read.sh

# The Go S3 clients side by side on versitygw over loopback: minio-go v7 (clipshard's) and aws-sdk-go-v2 (docs/BENCHMARKS.md).
bench-s3-clients:
    docs/bench_s3_clients.sh

# clipshard push before and after a change (BENCH_OLD, default HEAD~1), against a plain boto3 multipart upload, on versitygw over loopback (docs/bench_push.sh).
bench-push:
    docs/bench_push.sh

# Epochs in a bucket on versitygw over loopback: the floor (boto3 ranged GETs), the Loader cold and warm, a 20 ms step's wait, push against a plain multipart upload; then (as root) the floors and the cold Loader behind links of 2, 4 and 6 Gbit/s and an unshaped one (docs/bench_link.sh; docs/BENCHMARKS.md).
bench-s3:
    if [ "$(id -u)" = 0 ]; then BENCH_LINKS="${BENCH_LINKS:-2gbit 4gbit 6gbit none}" docs/bench_s3.sh; else docs/bench_s3.sh; fi

# Peak RSS of convert and both shuffle paths at --mem 64 MiB / 256 MiB / 2 GiB (docs/BENCHMARKS.md).
bench-memory:
    docs/bench_memory.sh
