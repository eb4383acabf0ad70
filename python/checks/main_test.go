package checks_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/demodata"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/transform/shuffle"

	// Imported so the test cache is keyed on the shuffle command's sources.
	_ "github.com/clipshard/clipshard/internal/commands/shuffle"
)

// bin is the shuffle command, built from cmd/shuffle for these tests.
var bin string

func TestMain(m *testing.M) { clitest.MainOf(m, "shuffle", "../../cmd/shuffle", &bin) }

// demoDataset converts testdata/demo once for all tests (read-only).
func demoDataset(t *testing.T) string { return demodata.Dataset(t, filepath.Dir(bin)) } // (removed with the build)

// mixDatasets: demodata.Mix, once for all tests (read-only).
func mixDatasets(t *testing.T) map[string]string { return demodata.Mix(t, filepath.Dir(bin)) } // (removed with the build)

func shuffleRun(t *testing.T, env []string, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, env, append([]string{"--quiet"}, args...)...)
}

func base(ds, out string, extra ...string) []string {
	return append([]string{"--dataset", ds, "--out", out, "--window", "15", "--seed", "7", "--shard-samples", "5"}, extra...)
}

// TestPythonPackage (#27.3): pip installs python/ as a newcomer types it,
// offline: a fresh virtualenv (with the system's numpy: nothing to fetch)
// and "pip install --no-index ./python" builds it with the package's own
// backend (python/_build.py, the standard library alone) and leaves
// nothing in the tree; the installed package (with py.typed, its version,
// its numpy range) reads an epoch; an editable install imports from the
// tree. (CI also installs it from the registry into a venv of its own:
// .ci/run.)
func TestPythonPackage(t *testing.T) {
	numpytest.Module(t, "pip", "python3-pip")
	numpytest.Module(t, "ensurepip", "python3-venv")
	pkg, err := filepath.Abs(filepath.Join("..", "..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	before := clitest.List(t, pkg)
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "1")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	// One venv: the package installed, then installed again editable (pip
	// replaces the first; a venv is 6 s of CPU).
	venv := filepath.Join(t.TempDir(), "venv")
	numpytest.Run(t, "-m", "venv", "--system-site-packages", venv)
	py := filepath.Join(venv, "bin", "python")
	// numpy where CLIPSHARD_PYTHON has it: a venv made from a venv sees the
	// base interpreter's packages, not its maker's (a .pth of the maker's
	// site-packages; harmless for a system python).
	outer := numpytest.Run(t, "-c", `import site; print("\n".join(site.getsitepackages()))`)
	inner, err := exec.Command(py, "-c", `import sysconfig; print(sysconfig.get_paths()["purelib"])`).Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(strings.TrimSpace(string(inner)), "clipshard-test-outer.pth"), outer, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, editable := range []bool{false, true} {
		args := []string{"-m", "pip", "install", "--quiet", "--no-index", "--disable-pip-version-check"}
		if editable {
			args = append(args, "-e")
		}
		cmd := exec.Command(py, append(args, pkg)...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_CONFIG_FILE=/dev/null")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pip install (editable %v): %v\n%s", editable, err, b)
		}
		check := exec.Command(py, "-c", `import os, sys, importlib.metadata as md; import clipshard
where, editable = os.path.realpath(clipshard.__file__), sys.argv[3] == "true"
assert where.startswith(os.path.realpath(sys.argv[4])) == editable and ("site-packages" in where) != editable, where
assert os.path.exists(os.path.join(os.path.dirname(where), "py.typed"))
assert md.version("clipshard") == clipshard.__version__, (md.version("clipshard"), clipshard.__version__)
assert "numpy>=1.24,<3" in md.requires("clipshard"), md.requires("clipshard")
r = clipshard.Loader(sys.argv[1], 0, rank=1, world_size=2, batch_size=3)
print("ok", len(list(r)), r.state_dict()["consumed"], sys.argv[2])`, out, ds, fmt.Sprint(editable), pkg)
		check.Dir = t.TempDir() // not python/: the installed package is imported
		got, err := check.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(got), "ok ") {
			t.Fatalf("installed package (editable %v): %v %s", editable, err, got)
		}
	}
	if after := clitest.List(t, pkg); !slices.Equal(before, after) {
		t.Fatalf("pip install left files in python/:\nbefore %v\nafter  %v", before, after)
	}
}

// TestQualityJSON: shuffle --json reports each epoch's shuffle quality,
// and the Python helper measures the same figures from the epoch it reads.
func TestQualityJSON(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	r := shuffleRun(t, nil, base(ds, out, "--epochs", "2", "--json", "--quality-batch", "8")...)
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	var res struct {
		Quality map[string]shuffle.Quality `json:"quality"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil || len(res.Quality) != 2 {
		t.Fatalf("%v: %s", err, r.Stdout)
	}
	for e, q := range res.Quality {
		if q.Batch != 8 || q.Samples == 0 || q.DistinctClipsMean < 4 || q.Spearman > 0.6 {
			t.Errorf("epoch %s: %+v", e, q)
		}
		got := numpytest.Run(t, "-c", `import json, sys; sys.path.insert(0, sys.argv[1]); import clipshard, numpy as np
r = clipshard.EpochReader(sys.argv[2], int(sys.argv[3]), batch_size=1)
print(json.dumps(clipshard.quality.measure(np.concatenate([b["samples"] for b in r]), 8)))`, filepath.Join("..", "..", "python"), out, e)
		var py shuffle.Quality
		if err := json.Unmarshal(got, &py); err != nil || !reflect.DeepEqual(py, q) {
			t.Errorf("epoch %s: Go %+v, Python %+v (%v)", e, q, py, err)
		}
	}
}

// TestTorchReader: clipshard.torch with a real DataLoader: workers, state
// through torch.save, kill -9 and resume with another world size and
// batch size (testdata/check_torch.py).
func TestTorchReader(t *testing.T) {
	numpytest.Module(t, "torch", "python3-torch")
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "1", "--shard-samples", "4")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_torch.py"), out)
	if !strings.Contains(string(got), "ok: torch") {
		t.Fatalf("check_torch: %s", got)
	}
}

// TestLoader (#24.1, #24.2): clipshard.Loader's batches equal
// EpochReader's; exactly once over world sizes, batch sizes, prefetch
// depths and stop/resume points (a padded epoch's last batch, an epoch's
// end and past it) with another world size and batch size; batches never
// written again; no thread or fd left after a break, close() or an error
// of the thread; and clipshard.torch.Loader's tensors and casts where
// torch is installed (testdata/check_loader.py).
func TestLoader(t *testing.T) {
	got := checkThreeEpochs(t, "check_loader.py", "ok: loader")
	if os.Getenv("CI") != "" && !strings.Contains(got, "; torch ") {
		t.Fatalf("check_loader ran without torch in CI: %s", got)
	}
}

// checkThreeEpochs runs testdata/SCRIPT on three epochs of the demo set
// (W=5, shards of 8) and wants ok in its output, which it returns.
func checkThreeEpochs(t *testing.T, script, ok string) string {
	t.Helper()
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "3", "--window", "5", "--shard-samples", "8")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got := numpytest.Run(t, filepath.Join("..", "..", "testdata", script), out)
	if !strings.Contains(string(got), ok) {
		t.Fatalf("%s: %s", script, got)
	}
	return string(got)
}

// TestReaderDistrustsFiles (#24.4): the Python readers refuse hostile
// epochs folders and datasets within a second, naming the file: FIFOs,
// /dev/zero, oversized manifests, shards with other counts, dtypes or
// sizes than epochs.json says, paths outside the folder, impossible
// sample counts; and options that cannot take effect
// (testdata/check_hostile.py; before, the first case hung). In a mixed
// folder (#25): a source number that names no source, a samples file
// without the source column, sources missing or named twice.
func TestReaderDistrustsFiles(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "1", "--shard-samples", "8")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	mixed := filepath.Join(t.TempDir(), "mixed")
	d := mixDatasets(t)
	if r := shuffleRun(t, nil, "--source", "a="+d["a"], "--source", "b="+d["b"], "--window", "15", "--epochs", "1", "--shard-samples", "8", "--out", mixed); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_hostile.py"), out, ds, mixed)
	if !strings.Contains(string(got), "ok: hostile") {
		t.Fatalf("check_hostile: %s", got)
	}
}

// TestReaderFuzz: the Python readers against mutated copies of the folders
// they read (testdata/fuzz_readers.py): of a dataset (Dataset, epochs drawn
// from it, mapped and read, alone and mixed), a plain and a mixed epochs
// folder (load_epochs, EpochReader, Loader, a replay with shards mixed;
// where torch imports, in CI always, clipshard.torch's EpochDataset and
// Loader too),
// each case one file changed (a manifest's value, key or bytes; a .npy
// header; an offset or count of index.npy or a samples file); and of
// BLOCKSUMS files and Loader states. Every case is read through or refused
// with a ValueError naming the folder, within 20 s, under an 8 GiB
// address-space cap. 150 cases (seed 1), 1500 (seed 2) with
// CLIPSHARD_EXHAUSTIVE=1; CLIPSHARD_FUZZ_CASES and CLIPSHARD_FUZZ_SEED give
// others (just fuzz: a new seed each run). Before it: Dataset raised
// AttributeError, TypeError and int()'s message for dataset.json values of
// other types, source_names AttributeError for a "dataset" that is not an
// object, BlockSums TypeError for a file name that is not a string, drawn
// epochs mixing sources of other modalities named neither folder, and a
// .npy header numpy's parser had to tokenize (a double quote among 2000
// spaces) took it 1.4 s.
func TestReaderFuzz(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, "--dataset", ds, "--out", out, "--window", "5", "--seed", "7", "--shard-samples", "8", "--epochs", "2"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	mixed := filepath.Join(t.TempDir(), "mixed")
	d := mixDatasets(t)
	if r := shuffleRun(t, nil, "--source", "a="+d["a"], "--source", "b="+d["b"], "--window", "5", "--epochs", "2", "--shard-samples", "8", "--out", mixed); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	cases, seed := "150", "1"
	if clitest.Long() {
		cases, seed = "1500", "2"
	}
	if v := os.Getenv("CLIPSHARD_FUZZ_CASES"); v != "" {
		cases = v
	}
	if v := os.Getenv("CLIPSHARD_FUZZ_SEED"); v != "" {
		seed = v
	}
	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "fuzz_readers.py"), cases, seed, ds, out, mixed))
	if !strings.Contains(got, "ok: fuzz") {
		// (the last cases and the failure: the whole output is a line a case)
		lines := strings.Split(strings.TrimSpace(got), "\n")
		t.Fatalf("fuzz_readers: %s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if os.Getenv("CI") != "" && !strings.Contains(lines[len(lines)-1], "with torch") {
		t.Fatalf("fuzz_readers ran without torch in CI: %s", lines[len(lines)-1])
	}
	t.Log(lines[len(lines)-1])
}

// TestReaderPinsEpoch (round 4, point 2): a reader of an epoch while
// shuffle --force (another seed) rewrites the folder delivers the version
// it started on, or raises naming a shard; never a mix of both
// (testdata/check_rewrite.py: after one batch, and with the rewrite
// running concurrently; EpochReader, Loader, torch's Loader, EpochDataset
// with 0 and 2 DataLoader workers; the concurrent rewrite once a reader,
// 3 and 2 times with CLIPSHARD_EXHAUSTIVE=1). Before: "epoch 0" came out
// mixed.
func TestReaderPinsEpoch(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	argv := []string{bin, "--dataset", ds, "--out", out, "--window", "3", "--shard-samples", "8", "--epochs", "1", "--seed"}
	got := numpytest.Run(t, append([]string{filepath.Join("..", "..", "testdata", "check_rewrite.py"), out, "7", "8"}, argv...)...)
	if !strings.Contains(string(got), "ok: rewrite") {
		t.Fatalf("check_rewrite: %s", got)
	}
	if os.Getenv("CI") != "" && strings.Contains(string(got), "no torch") {
		t.Fatalf("check_rewrite ran without torch in CI: %s", got)
	}
	t.Logf("%s", got)
}

// TestReaderLimits (#63): no file of python/clipshard above 500 lines, no
// class above 250, no function above 80 (testdata/check_limits.py). The
// checker itself is checked: a file with a function of 82 lines and a
// class of 252 fails, naming both.
func TestReaderLimits(t *testing.T) {
	py := numpytest.Python(t)
	script := filepath.Join("..", "..", "testdata", "check_limits.py")
	out, err := exec.Command(py, script, filepath.Join("..", "clipshard")).CombinedOutput()
	if err != nil {
		t.Fatalf("python/clipshard is over its limits: %v\n%s", err, out)
	}
	bad := t.TempDir()
	long := "def f():\n" + strings.Repeat("    x = 1\n", 81) + "\n\nclass C:\n" + strings.Repeat("    y = 1\n", 251)
	if err := os.WriteFile(filepath.Join(bad, "long.py"), []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(py, script, bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "def long.f: 82 lines, over the limit 80") ||
		!strings.Contains(string(out), "class long.C: 252 lines, over the limit 250") {
		t.Fatalf("check_limits.py passed a function of 82 lines or a class of 252: %v\n%s", err, out)
	}
}
