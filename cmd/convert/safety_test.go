package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
)

// TestReplaceOnlyOurs: --out is replaced only when it is a clipshard
// dataset holding nothing its manifest does not list; otherwise the run
// refuses (exit 2), naming the files, and touches nothing, --force or not.
func TestReplaceOnlyOurs(t *testing.T) {
	src := copyDemo(t)
	user := map[string]string{"precious.txt": "keep me", "notes/today.md": "and me"}
	putUser := func(t *testing.T, dir string) {
		for name, body := range user {
			os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	checkUser := func(t *testing.T, dir string) {
		for name, body := range user {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != body {
				t.Errorf("%s: %v %q: the user's file was touched", name, err, b)
			}
		}
	}
	touched := time.Now()
	cases := []struct {
		name  string
		setup func(t *testing.T, out string)
		want  []string
	}{
		{"empty dataset.json beside the user's files", func(t *testing.T, out string) {
			putUser(t, out)
			os.WriteFile(filepath.Join(out, "dataset.json"), nil, 0o644)
		}, []string{"is not a clipshard dataset", "refusing to replace it"}},
		{"someone else's dataset.json", func(t *testing.T, out string) {
			putUser(t, out)
			os.WriteFile(filepath.Join(out, "dataset.json"), []byte(`{"format": "hf.dataset", "version": 1}`), 0o644)
		}, []string{"is not a clipshard dataset", `format "hf.dataset"`}},
		{"a clipshard dataset with the user's files added", func(t *testing.T, out string) {
			if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			putUser(t, out)
		}, []string{"holds files that are not clipshard's: notes/, precious.txt", "refusing to replace it"}},
	}
	for _, c := range cases {
		for _, force := range []bool{false, true} {
			name := c.name
			var extra []string
			if force {
				name += ", --force"
				extra = []string{"--force"}
			}
			t.Run(name, func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "ds")
				os.Mkdir(out, 0o755)
				c.setup(t, out)
				before := clitest.Tree(t, out)
				// Touch a source so that the re-run is not "up to date".
				touched = touched.Add(time.Minute)
				os.Chtimes(filepath.Join(src, "emotion", "clip005.npy"), touched, touched)
				r := runConvert(t, nil, demoArgs(src, out, extra...)...)
				if r.Code != 2 {
					t.Fatalf("exit %d, want 2: %s %s", r.Code, r.Stdout, r.Stderr)
				}
				if n := strings.Count(strings.TrimSpace(r.Stderr), "\n"); n != 0 {
					t.Errorf("want one line on stderr: %q", r.Stderr)
				}
				for _, w := range c.want {
					if !strings.Contains(r.Stderr, w) {
						t.Errorf("stderr %q lacks %q", r.Stderr, w)
					}
				}
				checkUser(t, out)
				clitest.SameTree(t, before, clitest.Tree(t, out), "refused --out")
				// The refusal holds for a merge too.
				r = runConvert(t, nil, "--merge", out, "--out", out)
				if r.Code == 0 {
					t.Fatalf("merge into it: exit 0")
				}
				checkUser(t, out)
			})
		}
	}
	t.Run("files added while the run converts", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "ds")
		if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		// The run is paused (killed) after its clips; the user's file
		// arrives; the resumed run must not replace the folder.
		r := runConvert(t, []string{"CLIPSHARD_KILL_AFTER_CLIPS=12"}, demoArgs(src, out, "--force")...)
		if r.Code != -1 {
			t.Fatalf("not killed: %d %s", r.Code, r.Stderr)
		}
		putUser(t, out)
		r = runConvert(t, nil, demoArgs(src, out, "--force")...)
		if r.Code != 2 || !strings.Contains(r.Stderr, "not clipshard's") {
			t.Fatalf("exit %d: %s", r.Code, r.Stderr)
		}
		checkUser(t, out)
	})
	t.Run("an intact dataset is replaced, and nothing is left beside it", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "ds")
		if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		if r := runConvert(t, nil, demoArgs(src, out, "--force")...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 1 {
			t.Fatalf("left beside the dataset: %v", entries)
		}
	})
	t.Run("a symlinked --out is refused, the folder it points to untouched", func(t *testing.T) {
		real := filepath.Join(t.TempDir(), "real")
		if r := runConvert(t, nil, demoArgs(src, real)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		before := clitest.Tree(t, real)
		link := filepath.Join(t.TempDir(), "link")
		os.Symlink(real, link)
		r := runConvert(t, nil, demoArgs(src, link, "--force")...)
		if r.Code != 2 || !strings.Contains(r.Stderr, "is a symbolic link") {
			t.Fatalf("exit %d: %s", r.Code, r.Stderr)
		}
		clitest.SameTree(t, before, clitest.Tree(t, real), "the link's folder")
	})
	t.Run("a staging folder that is not ours is left alone", func(t *testing.T) {
		parent := t.TempDir()
		out := filepath.Join(parent, "ds")
		staging := filepath.Join(parent, ".clipshard-partial-ds")
		putUser(t, staging)
		r := runConvert(t, nil, demoArgs(src, out)...)
		if r.Code != 2 || !strings.Contains(r.Stderr, "not a staging folder") {
			t.Fatalf("exit %d: %s", r.Code, r.Stderr)
		}
		checkUser(t, staging)
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestClipIDsInsideRoot: ids that would read outside --root are refused,
// naming the line, unless --allow-outside-root.
func TestClipIDsInsideRoot(t *testing.T) {
	src := copyDemo(t)
	// An id "../../outside/x" names these with the templates below.
	outside := filepath.Join(filepath.Dir(src), "outside")
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "x.pkl"), must(os.ReadFile(filepath.Join(src, "motion", "clip000.pkl"))), 0o644)
	os.WriteFile(filepath.Join(outside, "x.npy"), must(os.ReadFile(filepath.Join(src, "emotion", "clip000.npy"))), 0o644)
	mods := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "emotion=emotion/{clip}.npy"}
	for _, c := range []struct{ list, want string }{
		{"clip000\n../../outside/x\n", `line 2: clip id "../../outside/x": has a ".." component`},
		{"# absolute\nclip000\n" + filepath.Join(outside, "x") + "\n", "line 3: clip id \"" + filepath.Join(outside, "x") + "\": is an absolute path"},
		{"clip000\nsub/../../outside/x\n", `line 2: clip id "sub/../../outside/x": has a ".." component`},
	} {
		list := filepath.Join(src, "list.txt")
		os.WriteFile(list, []byte(c.list), 0o644)
		out := filepath.Join(t.TempDir(), "ds")
		args := append([]string{"--clips", list, "--out", out, "--quiet"}, mods...)
		r := runConvert(t, nil, args...)
		if r.Code != 1 || !strings.Contains(r.Stderr, c.want) || !strings.Contains(r.Stderr, "--allow-outside-root") {
			t.Errorf("%q: exit %d, stderr %q; want %q", c.list, r.Code, r.Stderr, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%q: output made", c.list)
		}
		if !strings.HasPrefix(c.list, "clip000\n../") {
			continue
		}
		// Absolute templates are the user's to give; such ids with
		// --allow-outside-root too.
		r = runConvert(t, nil, append(args, "--allow-outside-root")...)
		if r.Code != 0 {
			t.Errorf("--allow-outside-root: exit %d %s", r.Code, r.Stderr)
		}
	}
}

// TestReservedNames: a modality may not take a name clipshard's own files
// or columns use.
func TestReservedNames(t *testing.T) {
	src := copyDemo(t)
	for _, name := range []string{"samples", "index", "Clips", "dataset", "epochs", "shards", "skipped", "SHA256SUMS"} {
		out := filepath.Join(t.TempDir(), "ds")
		r := runConvert(t, nil, "--clips", filepath.Join(src, "clips.txt"), "--out", out, "-m", name+"=emotion/{clip}.npy")
		if r.Code != 2 || !strings.Contains(r.Stderr, "is reserved") || !strings.Contains(r.Stderr, "samples, sha256sums") {
			t.Errorf("%s: exit %d %q", name, r.Code, r.Stderr)
		}
	}
}

// faultPoints runs the command once with CLIPSHARD_FAULT_LOG and returns
// the kill points it reached, in order.
func faultPoints(t *testing.T, run func(env []string) clitest.Result) []string {
	t.Helper()
	log := filepath.Join(t.TempDir(), "points")
	if r := run([]string{"CLIPSHARD_FAULT_LOG=" + log}); r.Code != 0 {
		t.Fatalf("counting run: exit %d: %s", r.Code, r.Stderr)
	}
	return strings.Fields(string(must(os.ReadFile(log))))
}

// TestKillAtFaultPoints: kill -9 at 12 points (20 with
// CLIPSHARD_EXHAUSTIVE=1, CI) spread over a run (the
// manifests' atomic writes, the commit's renames, between clips), on a
// fresh --out and over a previous dataset: --out holds the previous
// dataset, none, or the new one complete; the re-run then gives the same
// bytes as an uninterrupted run, verify passes, and nothing is left
// beside --out.
func TestKillAtFaultPoints(t *testing.T) {
	for _, replace := range []bool{false, true} {
		name := "fresh"
		if replace {
			name = "replacing"
		}
		t.Run(name, func(t *testing.T) {
			src := copyDemo(t)
			ref := filepath.Join(t.TempDir(), "ref")
			if r := runConvert(t, nil, demoArgs(src, ref, "--workers", "1")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			want := clitest.Tree(t, ref)
			// The previous dataset: the same sources, emotion kept in float64.
			var old map[string][]byte
			makeOld := func(t *testing.T, out string) {
				if r := runConvert(t, nil, demoArgs(src, out, "--workers", "1", "--keep-dtype", "emotion")...); r.Code != 0 {
					t.Fatal(r.Stderr)
				}
				old = clitest.Tree(t, out)
			}
			args := func(out string) []string { return demoArgs(src, out, "--workers", "1", "--checkpoint", "0") }
			points := faultPoints(t, func(env []string) clitest.Result {
				out := filepath.Join(t.TempDir(), "ds")
				if replace {
					makeOld(t, out)
				}
				r := runConvert(t, env, args(out)...)
				// Over the previous dataset the run copies the unchanged
				// modalities' rows (emotion, kept in float64 there, is
				// converted): the kills below land in that path too.
				if replace && !strings.Contains(r.Stdout, "some modalities of 12 more clips") {
					t.Fatalf("the run over the previous dataset reused nothing: %s", r.Stdout)
				}
				return r
			})
			for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(12, 20)) {
				t.Run(fmt.Sprintf("%d-%s", k, points[k-1]), func(t *testing.T) {
					parent := t.TempDir()
					out := filepath.Join(parent, "ds")
					if replace {
						makeOld(t, out)
					}
					r := runConvert(t, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, args(out)...)
					if r.Code != -1 {
						t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
					}
					var now map[string][]byte
					if _, err := os.Stat(out); err == nil {
						now = clitest.Tree(t, out)
					}
					switch {
					case len(now) == 0 && !replace:
					case replace && sameFiles(now, old):
					case sameFiles(now, want):
					default:
						t.Fatalf("after the kill --out is neither the previous dataset, nor none, nor the new one: %d files", len(now))
					}
					r = runConvert(t, nil, args(out)...)
					if r.Code != 0 {
						t.Fatalf("re-run: exit %d: %s", r.Code, r.Stderr)
					}
					clitest.SameTree(t, want, clitest.Tree(t, out), "after kill and re-run")
					if entries, _ := os.ReadDir(parent); len(entries) != 1 {
						t.Fatalf("left beside --out: %v", entries)
					}
					verifyOK(t, out)
				})
			}
		})
	}
}

func sameFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || string(v) != string(w) {
			return false
		}
	}
	return true
}

// verifyOK checks dir with verify --deep.
func verifyOK(t *testing.T, dir string) {
	t.Helper()
	r, err := manifests.VerifyDataset(dir, manifests.VerifyOptions{Deep: true})
	if err != nil || !r.OK() {
		t.Fatalf("verify: %v %v", err, r.Problems)
	}
}

// TestCleanLeftovers: a failed run that started afresh and ran less than a
// minute keeps nothing beside --out (it says so); a longer one (here:
// CLIPSHARD_KEEP_AFTER=0s), or one that resumed work, says where its work
// is kept and how to drop it; convert --clean removes it (and nothing
// else).
func TestCleanLeftovers(t *testing.T) {
	src := copyDemo(t)
	b := must(os.ReadFile(filepath.Join("..", "..", "testdata", "convert", "nan_emotion.npy")))
	os.WriteFile(filepath.Join(src, "emotion", "clip007.npy"), b, 0o644)
	parent := t.TempDir()
	out := filepath.Join(parent, "ds")
	os.WriteFile(filepath.Join(parent, "mine.txt"), []byte("keep"), 0o644)
	r := runConvert(t, nil, demoArgs(src, out, "--workers", "1", "--checkpoint", "0")...)
	if entries := must(os.ReadDir(parent)); r.Code != 1 || !strings.Contains(r.Stderr, "nothing kept: a re-run starts over") || len(entries) != 1 {
		t.Fatalf("a quick failed run: exit %d: %q, left %v", r.Code, r.Stderr, entries)
	}
	keep := []string{"CLIPSHARD_KEEP_AFTER=0s"}
	r = runConvert(t, keep, demoArgs(src, out, "--workers", "1", "--checkpoint", "0")...)
	staging := filepath.Join(parent, ".clipshard-partial-ds")
	if r.Code != 1 || !strings.Contains(r.Stderr, "kept in "+staging) || !strings.Contains(r.Stderr, "convert --clean --out "+out) {
		t.Fatalf("exit %d: %q", r.Code, r.Stderr)
	}
	// A quick failure of a run that resumed: the earlier work stays.
	if r := runConvert(t, nil, demoArgs(src, out, "--workers", "1", "--checkpoint", "0")...); r.Code != 1 || !strings.Contains(r.Stderr, "kept in "+staging) {
		t.Fatalf("a resumed run's quick failure: exit %d: %q", r.Code, r.Stderr)
	}
	r = runConvert(t, nil, "--clean", "--out", out)
	if r.Code != 0 || !strings.Contains(r.Stdout, "removed") {
		t.Fatalf("--clean: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	entries := must(os.ReadDir(parent))
	if len(entries) != 1 || entries[0].Name() != "mine.txt" {
		t.Fatalf("left: %v", entries)
	}
	if r := runConvert(t, nil, "--clean", "--out", out); r.Code != 0 || !strings.Contains(r.Stdout, "nothing to clean") {
		t.Fatalf("second --clean: %d %q", r.Code, r.Stdout)
	}
}

// TestMaxTrim: --align trim cuts at most --max-trim frames (default 2); a
// clip that needs more is bad input, and then strict mode does not suggest
// --align trim but checking the keys and rates.
func TestMaxTrim(t *testing.T) {
	src := copyDemo(t)
	b := must(os.ReadFile(filepath.Join("..", "..", "testdata", "convert", "short5_emotion.npy")))
	os.WriteFile(filepath.Join(src, "emotion", "clip003.npy"), b, 0o644)
	for _, c := range []struct {
		extra []string
		code  int
		want  string
	}{
		{nil, 1, "disagree on length by 5 frames (rows: motion=51 whisper=102(@2) emotion=46); more than trimming would cut (--max-trim 2): check the keys and the rates"},
		{[]string{"--align", "trim"}, 1, "trimming would cut 5 frames, more than --max-trim 2"},
		{[]string{"--align", "trim", "--max-trim", "5"}, 0, ""},
		{[]string{"--align", "trim", "--max-trim", "-1"}, 0, ""},
	} {
		r := runConvert(t, nil, demoArgs(src, filepath.Join(t.TempDir(), "ds"), c.extra...)...)
		if r.Code != c.code || !strings.Contains(r.Stderr, c.want) || (c.code == 1 && strings.Contains(r.Stderr, "use --align trim")) {
			t.Errorf("%v: exit %d %q; want %d and %q", c.extra, r.Code, r.Stderr, c.code, c.want)
		}
	}
}
