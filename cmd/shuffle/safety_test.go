package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
)

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// verifyCode runs the epochs verification (verify DIR) and returns its
// report.
func verifyReport(t *testing.T, dir string, deep bool) *manifests.Report {
	t.Helper()
	r, err := manifests.VerifyEpochs(dir, manifests.VerifyOptions{Deep: deep})
	if err != nil {
		t.Fatalf("verify %s: %v", dir, err)
	}
	return r
}

func verifyOK(t *testing.T, dir string) {
	t.Helper()
	if r := verifyReport(t, dir, true); !r.OK() {
		t.Fatalf("verify %s: %v", dir, r.Problems)
	}
}

// TestOutOnlyOurs: shuffle writes into, replaces (--force, a rebuilt
// dataset) or drops from an epochs directory only what its manifest lists
// or its own names; anything else makes it refuse (exit 2), naming the
// files, and nothing is touched.
func TestOutOnlyOurs(t *testing.T) {
	ds := demoDataset(t)
	cases := []struct {
		name  string
		setup func(t *testing.T, out string)
		args  []string
		want  string
	}{
		{"not ours epochs.json beside the user's files", func(t *testing.T, out string) {
			os.MkdirAll(out, 0o755)
			os.WriteFile(filepath.Join(out, "epochs.json"), []byte(`{}`), 0o644)
			os.WriteFile(filepath.Join(out, "precious.txt"), []byte("keep"), 0o644)
		}, []string{"--epochs", "1", "--force"}, "is not a clipshard epochs directory"},
		{"the user's file beside our epochs, --force with other options", func(t *testing.T, out string) {
			if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			os.WriteFile(filepath.Join(out, "precious.txt"), []byte("keep"), 0o644)
		}, []string{"--epochs", "2", "--seed", "8", "--force"}, "holds files that are not clipshard's: precious.txt"},
		{"the user's file in an epoch folder, --force with other options", func(t *testing.T, out string) {
			if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			os.MkdirAll(filepath.Join(out, "epoch-0001", "mine"), 0o755)
			os.WriteFile(filepath.Join(out, "epoch-0001", "mine", "notes.txt"), []byte("keep"), 0o644)
		}, []string{"--epochs", "2", "--seed", "8", "--force"}, "epoch-0001/mine/"},
		{"the user's file in an epoch folder, --force, same options", func(t *testing.T, out string) {
			if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			os.WriteFile(filepath.Join(out, "epoch-0001", "notes.txt"), []byte("keep"), 0o644)
		}, []string{"--epochs", "2", "--force"}, "holds files that are not clipshard's: epoch-0001/notes.txt"},
		{"the user's file in an epoch folder, --drop", func(t *testing.T, out string) {
			if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			os.WriteFile(filepath.Join(out, "epoch-0000", "notes.txt"), []byte("keep"), 0o644)
		}, []string{"--drop", "0:1"}, "epoch-0000 holds files that are not clipshard's: notes.txt"},
		{"a folder of the user's named like a partial epoch", func(t *testing.T, out string) {
			os.MkdirAll(filepath.Join(out, ".partial-epoch-0000"), 0o755)
			os.WriteFile(filepath.Join(out, ".partial-epoch-0000", "mine.txt"), []byte("keep"), 0o644)
		}, []string{"--epochs", "1"}, ".partial-epoch-0000/mine.txt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "ep")
			c.setup(t, out)
			before := clitest.Tree(t, out)
			var r clitest.Result
			if c.args[0] == "--drop" {
				r = shuffleRun(t, nil, append([]string{"--out", out}, c.args...)...)
			} else {
				r = shuffleRun(t, nil, base(ds, out, c.args...)...)
			}
			if r.Code != 2 || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", r.Code, r.Stderr, c.want)
			}
			clitest.SameTree(t, before, clitest.Tree(t, out), "refused run")
		})
	}
}

// TestConcurrentOptions: runs with different options into one directory
// at the same time never both succeed into an inconsistent directory: one
// of them refuses (exit 2, saying why), and what is left verifies.
func TestConcurrentOptions(t *testing.T) {
	ds := demoDataset(t)
	pairs := []struct{ a, b []string }{
		{[]string{"--epoch-range", "0:2"}, []string{"--epoch-range", "2:4", "--seed", "8"}},
		{[]string{"--epoch-range", "0:2"}, []string{"--epoch-range", "0:2", "--seed", "8", "--force"}},
		{[]string{"--epoch-range", "0:2", "--mem", "64KiB"}, []string{"--epoch-range", "2:3", "--window", "10"}},
	}
	// Every fault point sleeps, so that the runs overlap.
	env := []string{"CLIPSHARD_FAULT_DELAY=15ms"}
	for _, p := range pairs {
		t.Run(strings.Join(p.a, " ")+" vs "+strings.Join(p.b, " "), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "ep")
			var wg sync.WaitGroup
			res := make([]clitest.Result, 2)
			for i, args := range [][]string{p.a, p.b} {
				wg.Go(func() { res[i] = shuffleRun(t, env, base(ds, out, args...)...) })
			}
			wg.Wait()
			ok := 0
			for i, r := range res {
				switch r.Code {
				case 0:
					ok++
				case 2:
					if !strings.Contains(r.Stderr, "other options") {
						t.Errorf("run %d refused without saying why: %q", i, r.Stderr)
					}
				default:
					t.Errorf("run %d: exit %d %s", i, r.Code, r.Stderr)
				}
			}
			t.Logf("exits %d (%s) and %d (%s)", res[0].Code, strings.TrimSpace(res[0].Stderr), res[1].Code, strings.TrimSpace(res[1].Stderr))
			if ok == 2 {
				t.Fatalf("both runs succeeded:\n%s\n%s", res[0].Stdout, res[1].Stdout)
			}
			if ok == 1 {
				verifyOK(t, out)
			}
		})
	}
	// A live run of other options (its claim held) makes a run refuse at
	// once, whatever epochs it wants.
	out := filepath.Join(t.TempDir(), "ep")
	os.MkdirAll(out, 0o755)
	f := must(os.Create(filepath.Join(out, ".lock-epoch-0005")))
	defer f.Close()
	unix.Flock(int(f.Fd()), unix.LOCK_EX)
	f.WriteString("dataset=x seed=1 window=3 sampling=tile per_clip=0 short=skip world_size=1 shard_samples=5")
	r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "another shuffle is writing") || !strings.Contains(r.Stderr, "other options") {
		t.Fatalf("live run of other options: %d %q", r.Code, r.Stderr)
	}
}

// TestRolling: --drop rewrites the manifests and removes the epochs; an
// epoch whose files were removed or cut short by hand is written again
// by a re-run (not "up to date"), with the same bytes.
func TestRolling(t *testing.T) {
	ds := demoDataset(t)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := shuffleRun(t, nil, base(ds, ref, "--epochs", "3")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := tree(t, ref)
	noTime := func(m map[string][]byte) map[string][]byte {
		delete(m, "epochs.json") // holds the time of the last commit
		delete(m, "SHA256SUMS")
		return m
	}
	out := filepath.Join(t.TempDir(), "ep")
	copyTree(t, ref, out)
	r := shuffleRun(t, nil, "--out", out, "--drop", "0:2")
	if r.Code != 0 || !strings.Contains(r.Stdout, "dropped epochs [0 1]") {
		t.Fatalf("drop: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	man := must(manifests.LoadEpochs(out))
	if len(man.Epochs) != 1 || man.Epochs[0].Epoch != 2 {
		t.Fatalf("after drop the manifest lists %+v", man.Epochs)
	}
	if _, err := os.Stat(filepath.Join(out, "epoch-0000")); err == nil {
		t.Fatal("epoch-0000 is still there")
	}
	verifyOK(t, out)
	if r := shuffleRun(t, nil, "--out", out, "--drop", "0:2"); r.Code != 0 || !strings.Contains(r.Stdout, "nothing to drop") {
		t.Fatalf("second drop: %d %q", r.Code, r.Stdout)
	}
	r = shuffleRun(t, nil, base(ds, out, "--epochs", "3")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "wrote epochs [0 1]") {
		t.Fatalf("re-run after drop: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	clitest.SameTree(t, noTime(want), noTime(tree(t, out)), "dropped and written again")

	// rm -r of an epoch, and a shard cut short: re-written by a re-run.
	os.RemoveAll(filepath.Join(out, "epoch-0001"))
	shard := filepath.Join(out, "epoch-0002", "shard-00001.whisper.npy")
	st := must(os.Stat(shard))
	os.Truncate(shard, st.Size()-10)
	if r := verifyReport(t, out, false); r.OK() {
		t.Fatal("verify passes a removed epoch")
	}
	r = shuffleRun(t, nil, base(ds, out, "--epochs", "3")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "wrote epochs [1 2]") || !strings.Contains(r.Stdout, "already done: epochs [0]") {
		t.Fatalf("re-run after rm: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	clitest.SameTree(t, noTime(want), noTime(tree(t, out)), "removed by hand and written again")
	verifyOK(t, out)
	// A live run's epoch is not dropped.
	f := must(os.Create(filepath.Join(out, ".lock-epoch-0001")))
	defer f.Close()
	unix.Flock(int(f.Fd()), unix.LOCK_EX)
	if r := shuffleRun(t, nil, "--out", out, "--drop", "1:2"); r.Code != 2 || !strings.Contains(r.Stderr, "epoch 1 is being written") {
		t.Fatalf("drop of a live epoch: %d %q", r.Code, r.Stderr)
	}
}

// TestDatasetDisagrees: a dataset.json whose rows (or index.npy) disagree
// with the blob is refused on both paths with one line naming the file
// and the numbers: no panic, no exit 0, nothing written.
func TestDatasetDisagrees(t *testing.T) {
	ds := demoDataset(t)
	cases := []struct {
		name   string
		mutate func(d *manifests.Dataset)
		want   string
	}{
		{"fewer rows", func(d *manifests.Dataset) { d.Modality("whisper").Rows -= 40 }, "dataset.json says 1158 rows, but 599 frames at rate 2 make 1198"},
		{"fewer rows and frames", func(d *manifests.Dataset) {
			d.Frames -= 20
			for i := range d.Modalities {
				d.Modalities[i].Rows -= 20 * int64(d.Modalities[i].Rate)
			}
		}, "index.npy's lengths add up to 599 frames, dataset.json says 579"},
		{"more rows", func(d *manifests.Dataset) { d.Modality("emotion").Rows += 5 }, "dataset.json says 604 rows"},
	}
	for _, c := range cases {
		for _, mem := range []string{"1GiB", "64KiB"} {
			t.Run(c.name+" "+mem, func(t *testing.T) {
				bad := filepath.Join(t.TempDir(), "ds")
				copyTree(t, ds, bad)
				d := must(manifests.LoadDataset(bad))
				c.mutate(d)
				if err := d.Write(bad); err != nil {
					t.Fatal(err)
				}
				out := filepath.Join(t.TempDir(), "ep")
				r := shuffleRun(t, nil, base(bad, out, "--epochs", "1", "--mem", mem)...)
				if r.Code != 1 || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
					t.Fatalf("exit %d, stderr %q; want 1 and %q", r.Code, r.Stderr, c.want)
				}
				if _, err := os.Stat(out); err == nil {
					t.Fatal("output made")
				}
			})
		}
	}
	// A dataset (of an earlier version) with a modality named "samples".
	bad := filepath.Join(t.TempDir(), "ds")
	copyTree(t, ds, bad)
	d := must(manifests.LoadDataset(bad))
	d.Modality("emotion").Name = "samples"
	d.Write(bad)
	out := filepath.Join(t.TempDir(), "ep")
	r := shuffleRun(t, nil, base(bad, out, "--epochs", "1")...)
	if r.Code != 1 || !strings.Contains(r.Stderr, `modality "samples" collides`) {
		t.Fatalf("samples: %d %q", r.Code, r.Stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("output made")
	}
	// The blob's header disagreeing with dataset.json.
	bad = filepath.Join(t.TempDir(), "ds")
	copyTree(t, ds, bad)
	p := filepath.Join(bad, "emotion.npy")
	b := must(os.ReadFile(p))
	copy(b[strings.Index(string(b[:200]), "(599,"):], "(598,")
	os.WriteFile(p, b, 0o644)
	r = shuffleRun(t, nil, base(bad, filepath.Join(t.TempDir(), "ep"), "--epochs", "1")...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "emotion.npy: npy: invalid file: 16 trailing bytes after the 9568 data bytes of <f2 [598, 8] (run verify)") {
		t.Fatalf("header: %d %q", r.Code, r.Stderr)
	}
}

// TestEmpty: a run that would write an empty epoch fails, saying
// which option to change, unless --allow-empty.
func TestEmpty(t *testing.T) {
	ds := demoDataset(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--epochs", "1", "--window", "500"}, "every clip is shorter than --window 500 (the longest has 79 frames); lower --window or use --short pad"},
	} {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, nil, base(ds, out, c.args...)...)
		if r.Code != 1 || !strings.Contains(r.Stderr, c.want) || !strings.Contains(r.Stderr, "--allow-empty") {
			t.Errorf("%v: exit %d %q; want 1 and %q", c.args, r.Code, r.Stderr, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: output made", c.args)
		}
		if r := shuffleRun(t, nil, base(ds, out, append(c.args, "--allow-empty")...)...); r.Code != 0 {
			t.Errorf("%v --allow-empty: exit %d %s", c.args, r.Code, r.Stderr)
		}
	}
}

// TestVerifyLiveRun: a live run's partial epoch folder is reported as in
// progress (exit 0 for the committed part); a dead run's, and a temp
// file a killed run left, are problems until the next run removes them.
func TestVerifyLiveRun(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "1")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	part := filepath.Join(out, ".partial-epoch-0001")
	os.MkdirAll(part, 0o755)
	os.WriteFile(filepath.Join(part, "shard-00000.whisper.npy"), []byte("half"), 0o644)
	f := must(os.Create(filepath.Join(out, ".lock-epoch-0001")))
	unix.Flock(int(f.Fd()), unix.LOCK_EX)
	r := verifyReport(t, out, true)
	if !r.OK() || len(r.InProgress) != 1 || r.InProgress[0] != ".partial-epoch-0001" {
		t.Fatalf("live run: problems %v, in progress %v", r.Problems, r.InProgress)
	}
	f.Close() // the run is gone
	r = verifyReport(t, out, false)
	if r.OK() || !strings.Contains(fmt.Sprint(r.Problems), "left by a killed shuffle") {
		t.Fatalf("dead run: %v", r.Problems)
	}
	os.WriteFile(filepath.Join(out, ".clipshard-tmp-epochs.json.123"), []byte("{"), 0o644)
	r = verifyReport(t, out, false)
	if !strings.Contains(fmt.Sprint(r.Problems), "temporary file") {
		t.Fatalf("temp file: %v", r.Problems)
	}
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	verifyOK(t, out)
	entries := must(os.ReadDir(out))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left: %s", e.Name())
		}
	}
}

// TestKillAtFaultPoints: kill -9 at 12 points (20 with
// CLIPSHARD_EXHAUSTIVE=1, CI) spread over a run (the
// commit's renames, the manifests' atomic writes, between shards, in
// pass 1), on both paths, writing new epochs beside committed ones: the
// re-run gives the same bytes as an uninterrupted run, verify passes, and
// no stray file is left.
func TestKillAtFaultPoints(t *testing.T) {
	ds := demoDataset(t)
	for _, mem := range []string{"1GiB", "64KiB"} {
		t.Run("mem "+mem, func(t *testing.T) {
			args := func(out string) []string {
				return base(ds, out, "--epoch-range", "1:4", "--mem", mem, "--workers", "2")
			}
			prepare := func(t *testing.T, out string) {
				if r := shuffleRun(t, nil, base(ds, out, "--epoch-range", "0:1")...); r.Code != 0 {
					t.Fatal(r.Stderr)
				}
			}
			ref := filepath.Join(t.TempDir(), "ref")
			prepare(t, ref)
			if r := shuffleRun(t, nil, args(ref)...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			want := tree(t, ref)
			log := filepath.Join(t.TempDir(), "points")
			counted := filepath.Join(t.TempDir(), "ep")
			prepare(t, counted)
			if r := shuffleRun(t, []string{"CLIPSHARD_FAULT_LOG=" + log}, args(counted)...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			points := strings.Fields(string(must(os.ReadFile(log))))
			for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(12, 20)) {
				t.Run(fmt.Sprintf("%d-%s", k, points[k-1]), func(t *testing.T) {
					out := filepath.Join(t.TempDir(), "ep")
					prepare(t, out)
					r := shuffleRun(t, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, args(out)...)
					if r.Code != -1 {
						t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
					}
					// epochs.json (the commit point) lists only whole
					// epochs, even now.
					if man, err := manifests.LoadEpochs(out); err == nil {
						for _, e := range man.Epochs {
							for _, sh := range e.Shards {
								for _, f := range sh.Files {
									if _, err := os.Stat(filepath.Join(out, f)); err != nil {
										t.Errorf("after the kill epochs.json lists %s: %v", f, err)
									}
								}
							}
						}
					}
					r = shuffleRun(t, nil, args(out)...)
					if r.Code != 0 {
						t.Fatalf("re-run: exit %d: %s", r.Code, r.Stderr)
					}
					got := tree(t, out)
					// The manifest's time is the last commit's: the same
					// SOURCE_DATE_EPOCH in both.
					clitest.SameTree(t, want, got, "after kill and re-run")
					verifyOK(t, out)
					for _, e := range must(os.ReadDir(out)) {
						if strings.HasPrefix(e.Name(), ".") {
							t.Errorf("left: %s", e.Name())
						}
					}
					var m map[string]any
					json.Unmarshal(got["epochs.json"], &m)
				})
			}
		})
	}
}

// TestSymlinkedOut: an epochs directory reached through a symbolic link is
// written into (it is never replaced whole); convert refuses a symlinked
// --out, which its commit would replace by a folder.
func TestSymlinkedOut(t *testing.T) {
	ds := demoDataset(t)
	real := filepath.Join(t.TempDir(), "real")
	os.Mkdir(real, 0o755)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(real, link)
	if r := shuffleRun(t, nil, base(ds, link, "--epochs", "1")...); r.Code != 0 {
		t.Fatalf("symlinked EDIR: %d %s", r.Code, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(real, "epochs.json")); err != nil {
		t.Fatal(err)
	}
	verifyOK(t, link)
}

// TestTotalsAgree: the bytes the plan line announces on stderr are the
// bytes the summary reports on stdout.
func TestTotalsAgree(t *testing.T) {
	ds := demoDataset(t)
	r := clitest.Run(t, bin, nil, base(ds, filepath.Join(t.TempDir(), "ep"), "--epochs", "2")...)
	_, planned, _ := strings.Cut(strings.SplitN(r.Stderr, "\n", 2)[0], " samples, ")
	_, wrote, _ := strings.Cut(r.Stdout, "s: ")
	wrote, _, _ = strings.Cut(wrote, " (")
	if r.Code != 0 || planned == "" || planned != wrote {
		t.Fatalf("exit %d: planned %q, wrote %q\n%s%s", r.Code, planned, wrote, r.Stderr, r.Stdout)
	}
}
