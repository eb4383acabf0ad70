package main_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/demodata"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"

	// Imported so the test cache is keyed on the binary's sources.
	_ "github.com/clipshard/clipshard/internal/ui"
)

var bin string

func TestMain(m *testing.M) { clitest.Main(m, "shuffle", &bin) }

// demoDataset converts testdata/demo once for all tests (read-only).
func demoDataset(t *testing.T) string { return demodata.Dataset(t, filepath.Dir(bin)) } // (removed with the build)

func shuffleRun(t *testing.T, env []string, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, env, append([]string{"--quiet"}, args...)...)
}

func tree(t *testing.T, dir string) map[string][]byte { return clitest.Tree(t, dir) }

func sameTree(t *testing.T, a, b map[string][]byte, what string) { clitest.SameTree(t, a, b, what) }

func copyTree(t *testing.T, from, to string) { clitest.CopyTree(t, from, to) }

func base(ds, out string, extra ...string) []string {
	return append([]string{"--dataset", ds, "--out", out, "--window", "15", "--seed", "7", "--shard-samples", "5"}, extra...)
}

// TestPathsAgree: the in-memory gather and the external two-pass shuffle
// (forced with a tiny --mem) write the same bytes, and numpy finds every
// sample equal to its dataset window.
func TestPathsAgree(t *testing.T) {
	ds := demoDataset(t)
	for _, cfg := range [][]string{
		{"--epochs", "3"},
		{"--epochs", "2", "--sampling", "random", "--per-clip", "3"},
		{"--epochs", "2", "--short", "pad", "--window", "40"},
		// W=1: ~600 samples an epoch, so with 64KiB the epochs go one group
		// at a time through the external path.
		{"--epochs", "3", "--window", "1", "--shard-samples", "64"},
		// Shards of 500 samples, piles of a few dozen: each shard is cut
		// into piles that one worker writes in turn.
		{"--epochs", "2", "--window", "1", "--shard-samples", "500"},
		// ~300 shards of 2 samples: more shard files than a pass-1 writer
		// keeps open at once (it closes them and opens them again).
		{"--epochs", "1", "--window", "1", "--shard-samples", "2"},
	} {
		t.Run(strings.Join(cfg, " "), func(t *testing.T) {
			mem := filepath.Join(t.TempDir(), "mem")
			ext := filepath.Join(t.TempDir(), "ext")
			r := shuffleRun(t, nil, base(ds, mem, append(cfg, "--mem", "1GiB")...)...)
			if r.Code != 0 || !strings.Contains(r.Stdout, "in-memory") {
				t.Fatalf("in-memory: %d %s %s", r.Code, r.Stdout, r.Stderr)
			}
			r = shuffleRun(t, nil, base(ds, ext, append(cfg, "--mem", "64KiB")...)...)
			if r.Code != 0 || !strings.Contains(r.Stdout, "external") {
				t.Fatalf("external: %d %s %s", r.Code, r.Stdout, r.Stderr)
			}
			sameTree(t, tree(t, mem), tree(t, ext), "in-memory vs external")
			out := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_epochs.py"), ext)
			if !strings.Contains(string(out), "ok: ") {
				t.Fatalf("check_epochs: %s", out)
			}
			// The Python reader on the configs of W > 1, which have the
			// fewest samples (its checks take a second per thousand; 8 s of
			// CPU a config: the first config, all of them with
			// CLIPSHARD_EXHAUSTIVE=1).
			if i := slices.Index(cfg, "--window"); (i < 0 && cfg[1] == "3") || (clitest.Long() && (i < 0 || cfg[i+1] != "1")) {
				out = numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_reader.py"), ext)
				if !strings.Contains(string(out), "ok: reader") {
					t.Fatalf("check_reader: %s", out)
				}
			}
			cmd := exec.Command("sha256sum", "--strict", "--quiet", "-c", "SHA256SUMS")
			cmd.Dir = ext
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("sha256sum: %v %s", err, b)
			}
		})
	}
}

// TestWorkersAndNoFsync: the shard writers' count and --no-fsync change
// nothing in the output, on either path.
func TestWorkersAndNoFsync(t *testing.T) {
	ds := demoDataset(t)
	cfg := []string{"--epochs", "2", "--window", "3", "--shard-samples", "7"}
	clitest.AllSame(t, []string{
		"--mem 1GiB --workers 1",
		"--mem 1GiB --workers 5 --no-fsync",
		"--mem 64KiB --workers 1",
		"--mem 64KiB --workers 3",
		"--mem 64KiB --workers 2 --no-fsync",
	}, func(extra string) map[string][]byte {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, nil, base(ds, out, append(cfg, strings.Fields(extra)...)...)...)
		if r.Code != 0 {
			t.Fatalf("%s: %d %s", extra, r.Code, r.Stderr)
		}
		return tree(t, out)
	})
}

func TestRerunAndEpochRanges(t *testing.T) {
	ds := demoDataset(t)
	whole := filepath.Join(t.TempDir(), "whole")
	if r := shuffleRun(t, nil, base(ds, whole, "--epochs", "3")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	r := shuffleRun(t, nil, base(ds, whole, "--epochs", "3")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "up to date") {
		t.Fatalf("re-run: %d %q", r.Code, r.Stdout)
	}
	// Epoch by epoch, as a rolling job would, gives the same bytes.
	parts := filepath.Join(t.TempDir(), "parts")
	for _, rg := range []string{"0:1", "1:3"} {
		if r := shuffleRun(t, nil, base(ds, parts, "--epoch-range", rg)...); r.Code != 0 {
			t.Fatalf("%s: %s", rg, r.Stderr)
		}
	}
	sameTree(t, tree(t, whole), tree(t, parts), "--epochs 3 vs ranges 0:1 + 1:3")
	// Two array tasks writing different epochs into one directory at once
	// end with the same bytes as one run.
	shared := filepath.Join(t.TempDir(), "shared")
	concurrentTasks(t, func(rg string) []string { return base(ds, shared, "--epoch-range", rg, "--mem", "64KiB") }, "0:2", "2:3")
	sameTree(t, tree(t, whole), tree(t, shared), "--epochs 3 vs two concurrent tasks")
	// Other options into the same directory are refused without --force.
	r = shuffleRun(t, nil, base(ds, whole, "--epochs", "3", "--seed", "8")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "--force") || !strings.Contains(r.Stderr, "seed 7, this run's 8") || strings.Contains(r.Stderr, "ranks") {
		t.Fatalf("other seed: %d %q", r.Code, r.Stderr)
	}
	if r = shuffleRun(t, nil, base(ds, whole, "--epochs", "3", "--seed", "8", "--force")...); r.Code != 0 {
		t.Fatalf("--force: %d %s", r.Code, r.Stderr)
	}
	// A rebuilt dataset makes the epochs stale: they are replaced.
	ds2 := filepath.Join(t.TempDir(), "ds2")
	copyTree(t, ds, ds2)
	b, _ := os.ReadFile(filepath.Join(ds2, "dataset.json"))
	os.WriteFile(filepath.Join(ds2, "dataset.json"), bytes.Replace(b, []byte(`"created": "`), []byte(`"created": "x`), 1), 0o644)
	stale := filepath.Join(t.TempDir(), "stale")
	if r := shuffleRun(t, nil, base(ds, stale, "--epochs", "2")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	// A run over the rebuilt dataset that names only some of them may
	// not remove the others (a trainer may be reading them): refused.
	before := tree(t, stale)
	for _, rg := range []string{"1:2", "2:3"} {
		r = shuffleRun(t, nil, base(ds2, stale, "--epoch-range", rg)...)
		if r.Code != 2 || !strings.Contains(r.Stderr, "--force") || !strings.Contains(r.Stderr, "another build of the dataset") || strings.Count(r.Stderr, "\n") != 1 {
			t.Fatalf("rebuilt dataset, epochs %s: %d %q %q", rg, r.Code, r.Stdout, r.Stderr)
		}
		sameTree(t, before, tree(t, stale), "epochs dir after a refused run over a rebuilt dataset")
	}
	// One that names them all replaces them; so does --force.
	r = shuffleRun(t, nil, base(ds2, stale, "--epochs", "2")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "replaced 2 stale epochs") {
		t.Fatalf("rebuilt dataset, all its epochs: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	r = shuffleRun(t, nil, base(ds, stale, "--epoch-range", "1:2", "--force")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "replaced 2 stale epochs") {
		t.Fatalf("--force: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(stale, "epoch-0000")); err == nil {
		t.Fatal("stale epoch 0 is still there")
	}
}

// concurrentTasks runs shuffle with args(range) for each epoch range at
// once, as array tasks into one folder, and fails unless all succeed.
func concurrentTasks(t *testing.T, args func(rg string) []string, ranges ...string) {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]clitest.Result, len(ranges))
	for i, rg := range ranges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = shuffleRun(t, nil, args(rg)...)
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r.Code != 0 {
			t.Fatalf("concurrent task: %d %s", r.Code, r.Stderr)
		}
	}
}

// killRun runs shuffle with args, killed with SIGKILL once after samples
// of the write phase are done ("read": in pass 1 of the external path,
// after its first read), and fails unless it was. It returns false, and
// runs nothing, for "read" on the in-memory path (--mem 1GiB), which has
// no pass 1.
func killRun(t *testing.T, mem, after string, args []string) bool {
	t.Helper()
	env := []string{"CLIPSHARD_KILL_AFTER_SAMPLES=" + after}
	if after == "read" {
		if mem == "1GiB" {
			return false
		}
		env = []string{"CLIPSHARD_KILL_AFTER_SAMPLES=1", "CLIPSHARD_KILL_PHASE=read"}
	}
	if r := shuffleRun(t, env, args...); r.Code != -1 {
		t.Fatalf("mem %s after %s: not killed: exit %d %s", mem, after, r.Code, r.Stderr)
	}
	return true
}

func TestKillAndResume(t *testing.T) {
	ds := demoDataset(t)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := shuffleRun(t, nil, base(ds, ref, "--epochs", "3")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := tree(t, ref)
	// Progress is reported at every shard (5 samples here): kill in the
	// first epoch, in the middle of the second, and near the end; and, on
	// the external path, in pass 1 (after its first read, with the piles
	// half written into the shard files).
	for _, mem := range []string{"1GiB", "64KiB"} {
		for _, after := range []string{"5", "40", "80", "read"} {
			out := filepath.Join(t.TempDir(), "ep")
			if !killRun(t, mem, after, base(ds, out, "--epochs", "3", "--mem", mem)) {
				continue
			}
			// The epochs committed before the kill (workers finish shards in
			// any order, so which ones depends on the run).
			var done []int
			if man, err := manifests.LoadEpochs(out); err == nil {
				for _, e := range man.Epochs {
					done = append(done, e.Epoch)
				}
			}
			if len(done) > 0 && (after == "5" || after == "read") {
				t.Fatalf("epochs %v committed after 5 samples or in pass 1", done)
			}
			r := shuffleRun(t, nil, base(ds, out, "--epochs", "3", "--mem", mem)...)
			if r.Code != 0 {
				t.Fatalf("resume: %d %s", r.Code, r.Stderr)
			}
			if len(done) > 0 && !strings.Contains(r.Stdout, fmt.Sprintf("already done: epochs %v\n", done)) {
				t.Errorf("mem %s after %s: epochs %v were committed, the resume says %q", mem, after, done, r.Stdout)
			}
			if len(done) == 0 && after == "80" {
				t.Logf("mem %s: no epoch committed after 80 of 88 samples (a worker was slow)", mem)
			}
			sameTree(t, want, tree(t, out), "resumed with --mem "+mem+" after "+after)
		}
	}
}

// TestInterrupt: ^C (SIGINT) in the middle of a run: one line, exit 1,
// the epochs committed before it stay, nothing else is left, and a re-run
// ends as an uninterrupted run.
func TestInterrupt(t *testing.T) {
	ds := demoDataset(t)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := shuffleRun(t, nil, base(ds, ref, "--epochs", "3")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, mem := range []string{"1GiB", "64KiB"} {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, []string{"CLIPSHARD_KILL_AFTER_SAMPLES=70", "CLIPSHARD_KILL_SIGNAL=INT"}, base(ds, out, "--epochs", "3", "--mem", mem)...)
		want := "shuffle: interrupted; the epochs committed before stay, a re-run writes the others\n"
		if r.Code != 1 || r.Stderr != want {
			t.Fatalf("mem %s: exit %d, stderr %q; want 1, %q", mem, r.Code, r.Stderr, want)
		}
		entries, err := os.ReadDir(out)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		got := strings.Join(names, " ")
		if strings.Contains(" "+got, " .") || !strings.Contains(got, "epoch-0000 ") ||
			strings.Contains(got, "epoch-0002") {
			t.Fatalf("mem %s: left %s (want committed epochs, before epoch 2, and nothing hidden)", mem, got)
		}
		if r := shuffleRun(t, nil, base(ds, out, "--epochs", "3", "--mem", mem)...); r.Code != 0 {
			t.Fatalf("re-run: %d %s", r.Code, r.Stderr)
		}
		a, b := tree(t, ref), tree(t, out)
		for _, tr := range []map[string][]byte{a, b} {
			delete(tr, "epochs.json") // holds the run's time
			delete(tr, "SHA256SUMS")
		}
		sameTree(t, a, b, "re-run after ^C with --mem "+mem)
	}
}

// TestEpochClaimed: an epoch another run is writing is refused, not
// overwritten.
func TestEpochClaimed(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	os.MkdirAll(out, 0o755)
	f, err := os.Create(filepath.Join(out, ".lock-epoch-0001"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "epoch 1 is being written by another shuffle") {
		t.Fatalf("%d %q", r.Code, r.Stderr)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...); r.Code != 0 {
		t.Fatalf("after release: %d %s", r.Code, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(out, ".lock-epoch-0001")); err == nil {
		t.Fatal("lock file left behind")
	}
}

func TestUsage(t *testing.T) {
	ds := demoDataset(t)
	// A blob shorter than dataset.json says: refused before anything is
	// written, naming the file and the first clip it lacks.
	short := filepath.Join(t.TempDir(), "short")
	copyTree(t, ds, short)
	st, err := os.Stat(filepath.Join(short, "whisper.npy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(short, "whisper.npy"), st.Size()-3000); err != nil {
		t.Fatal(err)
	}
	shortOut := filepath.Join(t.TempDir(), "x")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--window", "15"}, 2, "--epochs"},
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--epochs", "1"}, 2, "--window"},
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--epochs", "1", "--window", "5", "--sampling", "random"}, 2, "--per-clip"},
		// #26.10: these were silently taken as 2 GiB and as nothing.
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--epochs", "1", "--window", "5", "--mem", "0"}, 2, "--mem: 0: want a positive SIZE"},
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--epochs", "1", "--window", "5", "--per-clip", "4"}, 2, "--per-clip 4: only with --sampling random"},
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--epochs", "1", "--window", "5", "--mem", "lots"}, 2, "bad size"},
		// #64.10: a folder of sources given as the dataset is the user's
		// mistake (exit 2, as verify says), naming the convert to run.
		{[]string{"--dataset", t.TempDir(), "--out", t.TempDir() + "/x", "--epochs", "1", "--window", "5"}, 2, "holds no dataset.json: not a clipshard dataset (a folder of sources? convert it first: clipshard convert"},
		{[]string{"--dataset", ds, "--out", t.TempDir() + "/x", "--epochs", "1", "--window", "5", "--workers", "-3"}, 2, "--workers -3"},
		{[]string{"--dataset", short, "--out", shortOut, "--epochs", "1", "--window", "5", "--mem", "64KiB"}, 1, "whisper.npy: 154440 bytes, dataset.json needs 157440: the rows of clip 11 on"},
		{[]string{"--dataset", short, "--out", shortOut, "--epochs", "1", "--window", "5"}, 1, "the rows of clip 11 on"},
	} {
		r := shuffleRun(t, nil, c.args...)
		if r.Code != c.code || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Errorf("%v: exit %d %q, want %d and %q", c.args, r.Code, r.Stderr, c.code, c.want)
		}
	}
	if _, err := os.Stat(shortOut); !os.IsNotExist(err) {
		t.Errorf("a refused run left %s behind (%v)", shortOut, err)
	}
}

// TestShortClipsSaid (#64.2): the clips shorter than --window are counted
// in the summary and --json, with what became of them (left out by
// default, padded with --short pad).
func TestShortClipsSaid(t *testing.T) {
	ds := demoDataset(t)
	for _, short := range []string{"skip", "pad"} {
		out := filepath.Join(t.TempDir(), "ep")
		r := clitest.Run(t, bin, nil, "--dataset", ds, "--out", out, "--window", "50", "--epochs", "1", "--shard-samples", "8", "--short", short)
		want := "7 clips shorter than --window 50: left out"
		if short == "pad" {
			want = "7 clips shorter than --window 50: padded with zeros"
		}
		if r.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Fatalf("--short %s: %d %q %s", short, r.Code, r.Stdout, r.Stderr)
		}
		out = filepath.Join(t.TempDir(), "ep")
		r = shuffleRun(t, nil, "--json", "--dataset", ds, "--out", out, "--window", "50", "--epochs", "1", "--shard-samples", "8", "--short", short)
		if r.Code != 0 || !strings.Contains(r.Stdout, `"short_clips": 7`) || !strings.Contains(r.Stdout, `"short": "`+short+`"`) {
			t.Fatalf("--json --short %s: %d %s %s", short, r.Code, r.Stdout, r.Stderr)
		}
	}
}
