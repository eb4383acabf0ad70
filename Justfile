# clipshard developer recipes. `just --list` shows them.
# Everything here is plain shell underneath: see README.md for the commands.

python := env_var_or_default("CLIPSHARD_PYTHON", "/usr/bin/python3")

# Run the test suite (the README's test command).
test:
    go run ./internal/gotest ./...

# The test suite with the exhaustive cases on (as CI runs it: e.g. 200 torn-read runs instead of 15).
test-long:
    CLIPSHARD_EXHAUSTIVE=1 go run ./internal/gotest ./...

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

# A benchmark by NAME (bench/run: `just bench` lists them), side by side with its peers and the floor, rows interleaved; docs/BENCHMARKS.md has the current figures: just bench train, just bench s3 /tmp/w, ...
bench NAME="" *ARGS:
    bench/run {{NAME}} {{ARGS}}

# The GPU check (#62): the torch Loader on a CUDA device against the copy rates and DataLoader, every byte checked (a line and exit 0 without CUDA).
gpu-check:
    go build -o bin/ ./cmd/clipshard
    {{python}} python/checks/gpu_check.py bin/clipshard

# The README's demo (its first command, exactly as written there).
demo:
    bash -c "$(sed -n '/^<!-- demo -->/,/^<!-- \/demo -->/p' README.md | sed '1,2d;$d' | sed '$d')"

# Build the clipshard command (and its old names, aliases) into bin/.
build:
    go build -v -o bin/ ./cmd/...

# Merge the parts of a partitioned convert and check the result (docs/SCALING.md).
merge PARTS DATASET:
    go run ./cmd/clipshard convert --merge {{PARTS}}/part-* --out {{DATASET}}
    go run ./cmd/clipshard verify {{DATASET}}
