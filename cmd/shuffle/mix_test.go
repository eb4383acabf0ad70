package main_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/demodata"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"
)

// mixDatasets: demodata.Mix, once for all tests (read-only).
func mixDatasets(t *testing.T) map[string]string { return demodata.Mix(t, filepath.Dir(bin)) } // (removed with the build)

// mixArgs is a 3-source run over 4 epochs with a curriculum: in epochs
// 0-1, b (800 samples of its own) is upsampled 4x and a (2400) and c
// (1400) subsampled; in 2-3 the weights change.
func mixArgs(t *testing.T, out string, extra ...string) []string {
	d := mixDatasets(t)
	return append([]string{"--source", "a=" + d["a"], "--source", "b=" + d["b"], "--source", "c=" + d["c"],
		"--weights", "0:2@a=0.1171875,b=0.625,c=0.2578125", "--weights", "2:@a=1,b=0.7,c=2.3",
		"--epoch-samples", "5120", "--sampling", "random", "--per-clip", "200", "--window", "3",
		"--seed", "11", "--shard-samples", "300", "--out", out}, extra...)
}

// readSamples reads every samples file of epoch e of the folder out, in
// order: int64 rows of cols columns.
func readSamples(t *testing.T, out string, e int) [][]int64 {
	t.Helper()
	man, err := manifests.LoadEpochs(out)
	if err != nil {
		t.Fatal(err)
	}
	x := man.Entry(e)
	if x == nil {
		t.Fatalf("%s: no epoch %d", out, e)
	}
	cols := man.SampleCols()
	var rows [][]int64
	for _, sh := range x.Shards {
		a, err := npy.ReadFile(filepath.Join(out, sh.Files["samples"]))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < sh.Samples; i++ {
			row := make([]int64, cols)
			for c := range row {
				row[c] = int64(binary.LittleEndian.Uint64(a.Data[8*(i*cols+c):]))
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// TestMix (#25): three sources of different sizes and weights, a
// curriculum over 4 epochs. Counts exact per epoch (the largest-remainder
// split, also worked out again in Python with fractions); every sample's
// bytes equal its own source's window (numpy, and verify --deep); every
// batch of 256 holds each source within 4 samples of its weight; the two
// paths and --mem agree byte for byte; sha256sum -c passes; the readers'
// source is the samples'.
func TestMix(t *testing.T) {
	want := map[int]map[string]int64{
		0: {"a": 600, "b": 3200, "c": 1320}, 1: {"a": 600, "b": 3200, "c": 1320},
		// 5120 * (1, 0.7, 2.3) / 4: 1280, 896, 2944
		2: {"a": 1280, "b": 896, "c": 2944}, 3: {"a": 1280, "b": 896, "c": 2944},
	}
	var trees []map[string][]byte
	for _, mem := range []string{"1GiB", "64KiB", "256KiB"} {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, nil, mixArgs(t, out, "--epochs", "4", "--mem", mem)...)
		if r.Code != 0 {
			t.Fatalf("--mem %s: exit %d %s", mem, r.Code, r.Stderr)
		}
		if ext := strings.Contains(r.Stdout, "external"); ext != (mem != "1GiB") {
			t.Fatalf("--mem %s: %s", mem, r.Stdout)
		}
		if !strings.Contains(r.Stdout, "epoch 0: a 600 (weight 0.1171875), b 3200 (weight 0.625), c 1320 (weight 0.2578125)") {
			t.Fatalf("summary: %s", r.Stdout)
		}
		trees = append(trees, tree(t, out))
		if mem != "1GiB" {
			continue
		}
		man, err := manifests.LoadEpochs(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range man.Epochs {
			if fmt.Sprint(x.Counts) != fmt.Sprint(want[x.Epoch]) {
				t.Errorf("epoch %d: counts %v, want %v", x.Epoch, x.Counts, want[x.Epoch])
			}
		}
		// An upsampled source is drawn again each pass (tile offsets
		// redrawn): b's 4 passes hold more distinct windows than one pass.
		tile := filepath.Join(t.TempDir(), "tile")
		d := mixDatasets(t)
		r = shuffleRun(t, nil, "--source", "a="+d["a"], "--source", "b="+d["b"], "--weights", "a=1,b=1", "--epoch-samples", "200", "--window", "15", "--seed", "3",
			"--epochs", "1", "--out", tile)
		if r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		tm, _ := manifests.LoadEpochs(tile)
		natural := manifests.MixNatural([]manifests.MixSource{{Lengths: []int64{79, 32, 79, 51, 38, 37, 43, 68, 33, 40, 57, 42}}, {Lengths: []int64{79, 32, 79, 51}}},
			manifests.Sampling{Window: 15, Mode: "tile", Short: "skip"}, 3, 0)
		distinct := map[[2]int64]bool{}
		for _, row := range readSamples(t, tile, 0) {
			if row[3] == 1 {
				distinct[[2]int64{row[0], row[1]}] = true
			}
		}
		if nb := tm.Epochs[0].Counts["b"]; nb < 3*natural[1] || int64(len(distinct)) <= natural[1] {
			t.Errorf("upsampled source b: %d samples, %d distinct windows, one pass has %d", nb, len(distinct), natural[1])
		}
		verifyOK(t, tile)
		verifyOK(t, out)
		numOut := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_mix.py"), out, "256", "4", "99")
		if !strings.Contains(string(numOut), "ok: mix 4 epochs") {
			t.Fatalf("check_mix: %s", numOut)
		}
		t.Log(strings.TrimSpace(string(numOut)))
		cmd := exec.Command("sha256sum", "--strict", "--quiet", "-c", "SHA256SUMS")
		cmd.Dir = out
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("sha256sum: %v %s", err, b)
		}
		// --json: the counts per source, and each source's share per batch.
		jout := filepath.Join(t.TempDir(), "ej")
		r = shuffleRun(t, nil, mixArgs(t, jout, "--epochs", "1", "--json")...)
		var js struct {
			Counts  map[string]map[string]int64 `json:"source_counts"`
			Quality map[string]struct {
				Sources []struct {
					Name           string
					Share          float64
					MeanShare      float64 `json:"mean_share"`
					WorstDeviation float64 `json:"worst_deviation"`
				}
			}
		}
		if err := json.Unmarshal([]byte(r.Stdout), &js); err != nil || r.Code != 0 {
			t.Fatalf("--json: %v %d %s", err, r.Code, r.Stdout)
		}
		if fmt.Sprint(js.Counts["0"]) != fmt.Sprint(want[0]) || len(js.Quality["0"].Sources) != 3 {
			t.Fatalf("--json: %s", r.Stdout)
		}
		for _, s := range js.Quality["0"].Sources {
			if s.WorstDeviation > 4 || s.MeanShare < s.Share-0.01 || s.MeanShare > s.Share+0.01 {
				t.Errorf("--json quality of source %s: %+v", s.Name, s)
			}
		}
	}
	// The schedule from a file (#-comments, blank lines) is the same run.
	sched := filepath.Join(t.TempDir(), "weights")
	os.WriteFile(sched, []byte("# the curriculum\n0:2@a=0.1171875,b=0.625,c=0.2578125\n\n2:@a=1,b=0.7,c=2.3  # from epoch 2 on\n"), 0o644)
	fromFile := filepath.Join(t.TempDir(), "file")
	var args []string
	given := false
	all := mixArgs(t, fromFile, "--epochs", "4")
	for i := 0; i < len(all); i++ {
		if all[i] == "--weights" {
			if !given {
				args = append(args, "--weights", "@"+sched)
				given = true
			}
			i++
			continue
		}
		args = append(args, all[i])
	}
	if r := shuffleRun(t, nil, args...); r.Code != 0 {
		t.Fatalf("--weights @FILE: %v: %s", args, r.Stderr)
	}
	sameTree(t, trees[0], tree(t, fromFile), "--weights flags vs @FILE")
	sameTree(t, trees[0], trees[1], "in-memory vs external (64KiB)")
	sameTree(t, trees[0], trees[2], "in-memory vs external (256KiB)")
}

// TestMixOneSource: one --source gives the samples, order and modality
// shard bytes of a plain --dataset run (and a fourth column of zeros);
// --dataset itself still writes format version 2.
func TestMixOneSource(t *testing.T) {
	ds := demoDataset(t)
	for _, cfg := range [][]string{{"--epochs", "2"}, {"--epochs", "2", "--sampling", "random", "--per-clip", "3", "--mem", "64KiB"}} {
		plain := filepath.Join(t.TempDir(), "plain")
		one := filepath.Join(t.TempDir(), "one")
		if r := shuffleRun(t, nil, base(ds, plain, cfg...)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		args := append([]string{"--source", "demo=" + ds}, base("", one, cfg...)[2:]...)
		if r := shuffleRun(t, nil, args...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		pm, _ := manifests.LoadEpochs(plain)
		om, _ := manifests.LoadEpochs(one)
		if pm.Version != 2 || om.Version != 3 {
			t.Fatalf("versions %d, %d", pm.Version, om.Version)
		}
		pt, ot := tree(t, plain), tree(t, one)
		n := 0
		for rel, b := range pt {
			if strings.HasPrefix(rel, "epoch-") && !strings.HasSuffix(rel, ".samples.npy") {
				if string(ot[rel]) != string(b) {
					t.Fatalf("%v: %s differs", cfg, rel)
				}
				n++
			}
		}
		for e := 0; e < 2; e++ {
			p, o := readSamples(t, plain, e), readSamples(t, one, e)
			if len(p) != len(o) {
				t.Fatalf("epoch %d: %d vs %d samples", e, len(p), len(o))
			}
			for i := range p {
				if fmt.Sprint(p[i]) != fmt.Sprint(o[i][:3]) || o[i][3] != 0 {
					t.Fatalf("%v epoch %d sample %d: %v vs %v", cfg, e, i, p[i], o[i])
				}
			}
		}
		verifyOK(t, one)
		t.Logf("%v: %d modality shard files the same", cfg, n)
	}
}

// TestMixRefused: sources that cannot mix, and weights that make no
// sense, are refused with one line naming the source or the weight, exit
// 2, nothing written; so is a run whose sources or weights differ from
// the folder's.
func TestMixRefused(t *testing.T) {
	d := mixDatasets(t)
	out := filepath.Join(t.TempDir(), "ep")
	two := []string{"--source", "a=" + d["a"], "--source", "b=" + d["b"], "--window", "3", "--out", out}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", "a=" + d["a"], "--source", "o=" + d["other"], "--window", "3", "--out", out, "--epochs", "1"},
			"source o (" + d["other"] + "): modality motion has frame shape"},
		{append(two, "--epochs", "1", "--weights", "a=1"), "no weight for source b (give b=0 to leave it out)"},
		{append(two, "--epochs", "1", "--weights", "a=1,b=1,z=1"), `no --source is named "z"`},
		{append(two, "--epochs", "1", "--weights", "a=-1,b=1"), "a=-1: want a decimal number >= 0"},
		{append(two, "--epochs", "1", "--weights", "a=0,b=0"), "every weight is 0"},
		{append(two, "--epochs", "3", "--weights", "0:2@a=1,b=1"), "epoch 2 has no weights"},
		{append(two, "--epochs", "3", "--weights", "0:2@a=1,b=1", "--weights", "1:@a=1,b=2"), "overlap"},
		{append(two, "--epochs", "1", "--weights", "a=1,b=1", "--weights", "a=1,b=2"), "each needs its epochs"},
		{append(two, "--epochs", "1", "--dataset", d["a"]), "not both"},
		{[]string{"--source", "a=" + d["a"], "--source", "a=" + d["b"], "--window", "3", "--out", out, "--epochs", "1"}, "--source a is given twice"},
		{[]string{"--source", "a/b=" + d["a"], "--window", "3", "--out", out, "--epochs", "1"}, "want letters, digits"},
		{[]string{"--dataset", d["a"], "--window", "3", "--out", out, "--epochs", "1", "--weights", "a=1"}, "weighs --source datasets"},
		// c's longest clip has 68 frames.
		{[]string{"--source", "a=" + d["a"], "--source", "c=" + d["c"], "--window", "70", "--out", out, "--epochs", "1", "--weights", "a=1,c=1"},
			"source c (" + d["c"] + ") is to give 1 of the epoch's 2 samples, but has none"},
	} {
		r := shuffleRun(t, nil, c.args...)
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) || strings.Count(r.Stderr, "\n") != 1 {
			t.Errorf("%v: exit %d %q; want 2 and %q on one line", c.args, r.Code, r.Stderr, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%v: wrote %s", c.args, out)
		}
	}
	// Inputs that are not what they claim: a FIFO as the weights file, a
	// source whose blob is a FIFO (named at once, not waited on), an
	// --out holding the user's files. One line naming the file, nothing
	// written.
	fifo := filepath.Join(t.TempDir(), "weights")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "b")
	copyTree(t, d["b"], bad)
	os.Remove(filepath.Join(bad, "motion.npy"))
	unix.Mkfifo(filepath.Join(bad, "motion.npy"), 0o644)
	users := filepath.Join(t.TempDir(), "mine")
	os.MkdirAll(users, 0o755)
	os.WriteFile(filepath.Join(users, "notes.txt"), []byte("the user's"), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{append(two, "--epochs", "1", "--weights", "@"+fifo), 2, []string{fifo, "FIFO"}},
		{[]string{"--source", "a=" + d["a"], "--source", "b=" + bad, "--window", "3", "--out", out, "--epochs", "1"}, 1, []string{filepath.Join(bad, "motion.npy"), "FIFO"}},
		{[]string{"--source", "a=" + d["a"], "--source", "b=" + d["b"], "--window", "3", "--out", users, "--epochs", "1"}, 2, []string{"notes.txt"}},
	} {
		done := make(chan clitest.Result, 1)
		go func() { done <- shuffleRun(t, nil, c.args...) }()
		var r clitest.Result
		select {
		case r = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%v: hung", c.args)
		}
		if r.Code != c.code || strings.Count(r.Stderr, "\n") != 1 {
			t.Errorf("%v: exit %d %q; want %d on one line", c.args, r.Code, r.Stderr, c.code)
		}
		for _, w := range c.want {
			if !strings.Contains(r.Stderr, w) {
				t.Errorf("%v: %q lacks %q", c.args, r.Stderr, w)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%v: wrote %s", c.args, out)
		}
	}
	if got := clitest.List(t, users); len(got) != 2 || !strings.HasSuffix(got[1], "/notes.txt") {
		t.Fatalf("--out holding the user's files: now %v", got)
	}
	// Into a folder of other weights, or other sources: refused like
	// other options (--force replaces).
	if r := shuffleRun(t, nil, append(two, "--epochs", "1", "--weights", "a=1,b=1")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	before := tree(t, out)
	// The same run again: up to date, nothing touched.
	if r := shuffleRun(t, nil, append(two, "--epochs", "1", "--weights", "a=1,b=1")...); r.Code != 0 || !strings.Contains(r.Stdout, "up to date") {
		t.Fatalf("the same run again: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	sameTree(t, before, tree(t, out), "after the same run again")
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(two, "--epochs", "1", "--weights", "a=1,b=2"), "weights and --epoch-samples"},
		{append(two, "--epochs", "1", "--weights", "a=1,b=1", "--epoch-samples", "100"), "weights and --epoch-samples"},
		{[]string{"--source", "a=" + d["a"], "--source", "c=" + d["c"], "--window", "3", "--out", out, "--epochs", "1", "--weights", "a=1,c=1"}, "another dataset (or other sources)"},
		{[]string{"--dataset", d["a"], "--window", "3", "--out", out, "--epochs", "1"}, "a mix of sources, or one --dataset"},
	} {
		r := shuffleRun(t, nil, c.args...)
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) || !strings.Contains(r.Stderr, "--force") {
			t.Errorf("%v: exit %d %q; want 2 and %q", c.args, r.Code, r.Stderr, c.want)
		}
	}
	sameTree(t, before, tree(t, out), "after refused runs")
	if r := shuffleRun(t, nil, append(two, "--epochs", "1", "--weights", "a=1,b=2", "--force")...); r.Code != 0 {
		t.Fatalf("--force: %s", r.Stderr)
	}
}

// TestMixKillAndResume: kill -9 at random points of a 3-source run, on
// both paths, and in pass 1; the resumed run ends byte-identical to an
// uninterrupted one. Two concurrent array tasks (epochs 0:2 and 2:4) into
// one folder end the same too.
func TestMixKillAndResume(t *testing.T) {
	ref := filepath.Join(t.TempDir(), "ref")
	if r := shuffleRun(t, nil, mixArgs(t, ref, "--epochs", "4")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := tree(t, ref)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 25))
	for _, mem := range []string{"1GiB", "64KiB"} {
		points := []string{"read"}
		for range 3 {
			// Before the last shards (the kill comes at a progress report,
			// which counts the samples of the epochs written together: all
			// 4 in memory, one at a time with 64KiB).
			n := 3 * 5120
			if mem == "64KiB" {
				n = 5120 - 600
			}
			points = append(points, fmt.Sprint(1+rng.IntN(n)))
		}
		for _, after := range points {
			out := filepath.Join(t.TempDir(), "ep")
			if !killRun(t, mem, after, mixArgs(t, out, "--epochs", "4", "--mem", mem)) {
				continue
			}
			if r := shuffleRun(t, nil, mixArgs(t, out, "--epochs", "4", "--mem", mem)...); r.Code != 0 {
				t.Fatalf("resume: %d %s", r.Code, r.Stderr)
			}
			sameTree(t, want, tree(t, out), "resumed with --mem "+mem+" after "+after)
		}
	}
	shared := filepath.Join(t.TempDir(), "shared")
	concurrentTasks(t, func(rg string) []string { return mixArgs(t, shared, "--epoch-range", rg, "--mem", "64KiB") }, "0:2", "2:4")
	sameTree(t, want, tree(t, shared), "--epochs 4 vs two concurrent tasks")
}

// TestMixVerify: verify notices a mixed folder whose counts, weights or
// sources were edited (sums updated to match), and a source rebuilt since.
func TestMixVerify(t *testing.T) {
	d := mixDatasets(t)
	src := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, mixArgs(t, src, "--epochs", "2")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	verifyOK(t, src)
	edit := func(t *testing.T, f func(m map[string]any)) string {
		out := filepath.Join(t.TempDir(), "ep")
		copyTree(t, src, out)
		p := filepath.Join(out, "epochs.json")
		var m map[string]any
		json.Unmarshal(must(os.ReadFile(p)), &m)
		f(m)
		b, _ := json.MarshalIndent(m, "", "  ")
		os.WriteFile(p, b, 0o644)
		clitest.Resum(t, out, "epochs.json")
		return out
	}
	epoch0 := func(m map[string]any) map[string]any { return m["epochs"].([]any)[0].(map[string]any) }
	for _, c := range []struct {
		name string
		f    func(m map[string]any)
		want string
	}{
		{"counts moved", func(m map[string]any) {
			c := epoch0(m)["counts"].(map[string]any)
			c["a"], c["b"] = c["a"].(float64)+1, c["b"].(float64)-1
		}, "source a gave 601 samples"},
		{"weights changed", func(m map[string]any) {
			epoch0(m)["weights"].(map[string]any)["a"] = 0.2
		}, "mix.weights says"},
		{"schedule and weights changed together", func(m map[string]any) {
			epoch0(m)["weights"].(map[string]any)["a"] = 0.2
			m["mix"].(map[string]any)["weights"].([]any)[0].(map[string]any)["weights"].(map[string]any)["a"] = 0.2
		}, "source a gave 600 samples; its weight 0.2"},
		{"sources swapped", func(m map[string]any) {
			s := m["sources"].([]any)
			s[0].(map[string]any)["dir"], s[1].(map[string]any)["dir"] = s[1].(map[string]any)["dir"], s[0].(map[string]any)["dir"]
			s[0].(map[string]any)["manifest_sha256"], s[1].(map[string]any)["manifest_sha256"] = s[1].(map[string]any)["manifest_sha256"], s[0].(map[string]any)["manifest_sha256"]
		}, "source a: fingerprint"}, // (found by the fingerprint now, before the clip counts)
	} {
		t.Run(c.name, func(t *testing.T) {
			out := edit(t, c.f)
			r := verifyReport(t, out, true)
			var all []string
			for _, p := range r.Problems {
				all = append(all, p.File+": "+p.What)
			}
			if r.OK() || !strings.Contains(strings.Join(all, "\n"), c.want) {
				t.Fatalf("want %q, got %v", c.want, all)
			}
		})
	}
	// A source rebuilt since shuffling: --deep says which.
	out := filepath.Join(t.TempDir(), "ep")
	copyTree(t, src, out)
	b := filepath.Join(t.TempDir(), "b")
	copyTree(t, d["b"], b)
	p := filepath.Join(out, "epochs.json")
	js := strings.Replace(string(must(os.ReadFile(p))), d["b"], b, 1)
	os.WriteFile(p, []byte(js), 0o644)
	clitest.Resum(t, out, "epochs.json")
	verifyOK(t, out) // the copy is the same dataset
	clitest.EditDataset(t, b, func(ds *manifests.Dataset) { ds.Created = "rebuilt" })
	r := verifyReport(t, out, true)
	if r.OK() || !strings.Contains(fmt.Sprint(r.Problems), "source b "+b+" is gone or changed") {
		t.Fatalf("rebuilt source: %v", r.Problems)
	}
}

// TestMixMemoryBounded: peak RSS of the external path with three sources
// (one with a 96 MB clip) stays under --mem plus 64 MiB.
func TestMixMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 3 datasets of ~100 MB; run without -short")
	}
	var args []string
	for i, frames := range []int{24 << 10, 8 << 10, 16 << 10} {
		ds := bigClipDataset(t, frames)
		args = append(args, "--source", fmt.Sprintf("s%d=%s", i, ds))
	}
	const mem = 64 << 20
	for _, extra := range [][]string{
		{"--window", "15", "--weights", "s0=1,s1=2,s2=1"},
		{"--window", "1", "--sampling", "random", "--per-clip", "3000", "--weights", "s0=0.2,s1=0.5,s2=0.3"},
	} {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, nil, append(append([]string{"--out", out, "--epochs", "1", "--mem", "64MiB", "--shard-samples", "256"}, args...), extra...)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "external") {
			t.Fatalf("%v: exit %d %s %s", extra, r.Code, r.Stdout, r.Stderr)
		}
		t.Logf("%v: peak RSS %d MiB in %v", extra, r.MaxRSS>>20, r.Elapsed)
		if r.MaxRSS > mem+64<<20 {
			t.Errorf("%v: peak RSS %d MiB > --mem 64 MiB + 64 MiB", extra, r.MaxRSS>>20)
		}
	}
}
