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
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"

	// The binary under test is built from these: importing them keys the
	// test cache on their sources too.
	_ "github.com/clipshard/clipshard/internal/ui"
	_ "github.com/clipshard/clipshard/transform/convert"
)

var bin string

func TestMain(m *testing.M) { clitest.Main(m, "convert", &bin) }

var demoMods = []string{
	"-m", "motion=motion/{clip}.pkl:exp+pose",
	"-m", "shape@clip=motion/{clip}.pkl:shape", // one vector [100] per clip
	"-m", "whisper@2=whisper/{clip}.npy",
	"-m", "emotion=emotion/{clip}.npy",
}

// copyDemo copies testdata/demo to a temp dir, so a test may change sources.
func copyDemo(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo"), dst)
	return dst
}

func runConvert(t *testing.T, env []string, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, env, args...)
}

func demoArgs(src, out string, extra ...string) []string {
	args := append([]string{"--clips", filepath.Join(src, "clips.txt"), "--out", out, "--quiet"}, demoMods...)
	return append(args, extra...)
}

func snapshot(t *testing.T, dir string) map[string][]byte { return clitest.Tree(t, dir) }

func sameTree(t *testing.T, a, b map[string][]byte, what string) { clitest.SameTree(t, a, b, what) }

func TestDemoMatchesNumpy(t *testing.T) {
	src := copyDemo(t)
	out := filepath.Join(t.TempDir(), "ds")
	r := runConvert(t, nil, demoArgs(src, out)...)
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	if !strings.Contains(r.Stdout, "converted 12 clips") {
		t.Fatalf("summary: %s", r.Stdout)
	}
	numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_dataset.py"), out, filepath.Join(src, "clips.txt"), src)
	cmd := exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
	cmd.Dir = out
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, b)
	}
	for name := range snapshot(t, out) {
		if st, _ := os.Stat(filepath.Join(out, name)); st.Mode().Perm() != 0o644 {
			t.Errorf("%s has mode %v", name, st.Mode())
		}
	}
}

func TestWorkersSameBytes(t *testing.T) {
	src := copyDemo(t)
	clitest.AllSame(t, []string{"1", "2", "8"}, func(w string) map[string][]byte {
		out := filepath.Join(t.TempDir(), "ds")
		r := runConvert(t, nil, demoArgs(src, out, "--workers", w, "--mem", "1MiB")...)
		if r.Code != 0 {
			t.Fatalf("workers %s: exit %d: %s", w, r.Code, r.Stderr)
		}
		return snapshot(t, out)
	})
}

func TestNoOpThenRebuild(t *testing.T) {
	src := copyDemo(t)
	out := filepath.Join(t.TempDir(), "ds")
	if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	st1, _ := os.Stat(filepath.Join(out, "dataset.json"))
	time.Sleep(10 * time.Millisecond)
	r := runConvert(t, nil, demoArgs(src, out)...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "up to date") {
		t.Fatalf("re-run: exit %d, %q", r.Code, r.Stdout)
	}
	st2, _ := os.Stat(filepath.Join(out, "dataset.json"))
	if !st2.ModTime().Equal(st1.ModTime()) {
		t.Fatal("no-op run rewrote dataset.json")
	}
	// A touched source rebuilds.
	future := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(src, "emotion", "clip005.npy"), future, future)
	r = runConvert(t, nil, demoArgs(src, out)...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "converted 12 clips") {
		t.Fatalf("after touch: exit %d, %q %s", r.Code, r.Stdout, r.Stderr)
	}
	// --force rebuilds too.
	r = runConvert(t, nil, demoArgs(src, out, "--force")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "converted 12 clips") {
		t.Fatalf("--force: exit %d, %q", r.Code, r.Stdout)
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 {
		t.Fatalf("left behind in the parent: %v", entries)
	}
}

// TestUpToDateChecks (#26.9): "up to date" only for a dataset whose
// files, sizes, headers and manifest sums agree, and it says what it did
// not read. Before, a dataset.json claiming 10^12 clips (sums to match)
// and a blob with a rewritten header were "up to date … nothing to do".
func TestUpToDateChecks(t *testing.T) {
	src := copyDemo(t)
	out := filepath.Join(t.TempDir(), "ds")
	if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := snapshot(t, out)
	resum := func() { clitest.Resum(t, out) }
	// A rotted blob byte: the check cannot see it, and says so.
	f, _ := os.OpenFile(filepath.Join(out, "whisper.npy"), os.O_RDWR, 0)
	f.WriteAt([]byte{0xff}, 5000)
	f.Close()
	r := runConvert(t, nil, demoArgs(src, out)...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "up to date") || !strings.Contains(r.Stdout, "verify --deep "+out) {
		t.Fatalf("rotted blob: exit %d %q", r.Code, r.Stdout)
	}
	for name, damage := range map[string]func(){
		"10^12 clips": func() {
			b, _ := os.ReadFile(filepath.Join(out, "dataset.json"))
			os.WriteFile(filepath.Join(out, "dataset.json"), bytes.Replace(b, []byte(`"clips": 12,`), []byte(`"clips": 1000000000000,`), 1), 0o644)
			resum()
		},
		"blob header rewritten": func() {
			f, _ := os.OpenFile(filepath.Join(out, "emotion.npy"), os.O_RDWR, 0)
			b := make([]byte, 128)
			f.ReadAt(b, 0)
			f.WriteAt(bytes.Replace(b, []byte("(599, 8)"), []byte("(599, 2)"), 1), 0)
			f.Close()
			resum()
		},
		"sums stale": func() {
			b, _ := os.ReadFile(filepath.Join(out, "dataset.json"))
			os.WriteFile(filepath.Join(out, "dataset.json"), bytes.Replace(b, []byte(`"created": "`), []byte(`"created": "x`), 1), 0o644)
		},
	} {
		damage()
		r := runConvert(t, nil, demoArgs(src, out)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "converted 12 clips") || !strings.Contains(r.Stdout, "not reused: the previous dataset") {
			t.Fatalf("%s: exit %d %q %s", name, r.Code, r.Stdout, r.Stderr)
		}
		sameTree(t, want, snapshot(t, out), name+": rebuilt")
	}
}

func TestKillAndResume(t *testing.T) {
	src := copyDemo(t)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := runConvert(t, nil, demoArgs(src, ref)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := snapshot(t, ref)
	for kill, resumed := range map[string]int{
		"CLIPSHARD_KILL_AFTER_CLIPS=1": 1, "CLIPSHARD_KILL_AFTER_CLIPS=5": 5, "CLIPSHARD_KILL_AFTER_CLIPS=12": 12,
		"CLIPSHARD_KILL_AT_PHASE=finish": 12, "CLIPSHARD_KILL_AT_PHASE=checksum": 12,
	} {
		t.Run(kill, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "ds")
			r := runConvert(t, []string{kill}, demoArgs(src, out, "--workers", "2", "--checkpoint", "0")...)
			if r.Code != -1 {
				t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
			}
			if _, err := os.Stat(filepath.Join(out, "dataset.json")); err == nil {
				t.Fatal("dataset.json exists after a kill")
			}
			r = runConvert(t, nil, demoArgs(src, out)...)
			if r.Code != 0 {
				t.Fatalf("resume: exit %d: %s", r.Code, r.Stderr)
			}
			line := fmt.Sprintf("resumed: %d clips already done", resumed)
			if resumed == 1 {
				line = "resumed: 1 clip already done"
			}
			if !strings.Contains(r.Stdout, line) {
				t.Errorf("resume did not take over %d clips: %q", resumed, r.Stdout)
			}
			sameTree(t, want, snapshot(t, out), "resumed")
			if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 1 {
				t.Fatalf("left behind: %v", entries)
			}
		})
	}
	// A kill while replacing an older dataset leaves the old one intact.
	out := filepath.Join(t.TempDir(), "ds")
	if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	old := snapshot(t, out)
	r := runConvert(t, []string{"CLIPSHARD_KILL_AFTER_CLIPS=3"}, demoArgs(src, out, "--force")...)
	if r.Code != -1 {
		t.Fatalf("not killed: %d", r.Code)
	}
	sameTree(t, old, snapshot(t, out), "previous dataset after a killed --force")
}

// TestBadInput: each broken source fails with one line naming the file, the
// clip and the key, exit 1, and leaves no dataset behind.
func TestBadInput(t *testing.T) {
	broken := filepath.Join("..", "..", "testdata", "convert")
	evil := filepath.Join("..", "..", "testdata", "formats", "pickle", "evil_os_system_p4.pkl")
	cases := []struct {
		replace, with string
		extra         []string
		want          []string
	}{
		{"emotion/clip003.npy", filepath.Join(broken, "nan_emotion.npy"), nil, []string{"emotion/clip003.npy", `clip "clip003"`, "NaN", "first at row 5", "--allow-nonfinite"}},
		{"emotion/clip003.npy", filepath.Join(broken, "overflow_emotion.npy"), nil, []string{"emotion/clip003.npy", `clip "clip003"`, "overflow", "first at row 2"}},
		{"emotion/clip003.npy", filepath.Join(broken, "int_emotion.npy"), nil, []string{`modality "emotion"`, "int64", "--allow-int"}},
		{"emotion/clip003.npy", filepath.Join(broken, "short_emotion.npy"), nil, []string{`clip "clip003"`, "disagree", "emotion=50", "motion=51", "whisper=102(@2)"}},
		{"emotion/clip003.npy", filepath.Join(broken, "wide_emotion.npy"), nil, []string{`clip "clip003"`, "frame shape [9] differs from [8] of clip \"clip000\""}},
		{"emotion/clip003.npy", filepath.Join(broken, "zerowidth_emotion.npy"), nil, []string{"emotion/clip003.npy", `clip "clip003"`, "frames hold no values"}},
		{"motion/clip003.pkl", filepath.Join(broken, "nopose_motion.pkl"), nil, []string{"motion/clip003.pkl", `clip "clip003"`, `(keys "exp+pose")`, `key "pose" not found`, `"exp", "fps"`}},
		{"motion/clip003.pkl", filepath.Join(broken, "truncated_motion.pkl"), nil, []string{"motion/clip003.pkl", `clip "clip003"`, "truncated", "offset"}},
		{"motion/clip003.pkl", evil, nil, []string{"motion/clip003.pkl", `clip "clip003"`, "refused", "posix.system"}},
		{"emotion/clip003.npy", filepath.Join("..", "..", "testdata", "formats", "npy", "lying_header.npy"), nil, []string{"emotion/clip003.npy", "declares"}},
		{"emotion/clip003.npy", "", nil, []string{"emotion/clip003.npy", "no such file"}},
		{"whisper/clip003.npy", "fifo", nil, []string{"whisper/clip003.npy", `clip "clip003"`, "not a regular file"}},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.with)+"/"+c.replace, func(t *testing.T) {
			src := copyDemo(t)
			target := filepath.Join(src, c.replace)
			switch c.with {
			case "":
				os.Remove(target)
			case "fifo": // (stat first, to choose streaming: never opened, nothing waits for a writer)
				os.Remove(target)
				if err := syscall.Mkfifo(target, 0o644); err != nil {
					t.Fatal(err)
				}
			default:
				b, err := os.ReadFile(c.with)
				if err != nil {
					t.Fatal(err)
				}
				os.WriteFile(target, b, 0o644)
			}
			out := filepath.Join(t.TempDir(), "ds")
			r := runConvert(t, nil, demoArgs(src, out, c.extra...)...)
			if r.Code != 1 {
				t.Fatalf("exit %d, want 1; stderr %q", r.Code, r.Stderr)
			}
			lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
			if len(lines) != 1 {
				t.Fatalf("stderr has %d lines: %q", len(lines), r.Stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("stderr %q lacks %q", lines[0], w)
				}
			}
			if strings.Contains(r.Stderr, "panic") || strings.Contains(r.Stderr, "goroutine") {
				t.Fatalf("stack trace: %s", r.Stderr)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatal("output directory exists after a failed run")
			}
			// --on-error skip converts the rest and lists the clip.
			r = runConvert(t, nil, demoArgs(src, out, append(c.extra, "--on-error", "skip")...)...)
			if r.Code != 0 || !strings.Contains(r.Stdout, "skipped 1 clip (see skipped.tsv)") || !strings.Contains(r.Stdout, "clip003") {
				t.Fatalf("skip: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
			}
			tsv, err := os.ReadFile(filepath.Join(out, "skipped.tsv"))
			if err != nil || !strings.Contains(string(tsv), "clip003\t") {
				t.Fatalf("skipped.tsv: %v %q", err, tsv)
			}
			numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_dataset.py"), out, filepath.Join(src, "clips.txt"), src)
		})
	}
}

func TestAllowFlags(t *testing.T) {
	broken := filepath.Join("..", "..", "testdata", "convert")
	for _, c := range []struct{ file, flag, stat string }{
		{"nan_emotion.npy", "--allow-nonfinite", `"nan": 1`},
		{"overflow_emotion.npy", "--allow-overflow", `"overflow": 1`},
		{"int_emotion.npy", "--allow-int", `"max_abs"`},
		{"short_emotion.npy", "--align=trim", `"trimmed": 1`},
	} {
		t.Run(c.flag, func(t *testing.T) {
			src := copyDemo(t)
			b, _ := os.ReadFile(filepath.Join(broken, c.file))
			os.WriteFile(filepath.Join(src, "emotion", "clip003.npy"), b, 0o644)
			out := filepath.Join(t.TempDir(), "ds")
			r := runConvert(t, nil, demoArgs(src, out, c.flag)...)
			if r.Code != 0 {
				t.Fatalf("exit %d: %s", r.Code, r.Stderr)
			}
			js, _ := os.ReadFile(filepath.Join(out, "dataset.json"))
			if !strings.Contains(string(js), c.stat) {
				t.Fatalf("dataset.json lacks %s:\n%s", c.stat, js)
			}
			numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_dataset.py"), out, filepath.Join(src, "clips.txt"), src)
		})
	}
}

func TestUsageErrors(t *testing.T) {
	src := copyDemo(t)
	notDataset := t.TempDir()
	os.WriteFile(filepath.Join(notDataset, "precious.txt"), []byte("keep me"), 0o644)
	dup := filepath.Join(t.TempDir(), "dup.txt")
	os.WriteFile(dup, []byte("clip000\nclip001\nclip000\n"), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--clips", filepath.Join(src, "clips.txt"), "--out", "x", "-m", "motion=motion/c.pkl"}, 2, "has no {clip}"},
		{[]string{"--clips", filepath.Join(src, "clips.txt"), "--out", "x", "-m", "m@0=a/{clip}.npy"}, 2, "rate"},
		{[]string{"--clips", filepath.Join(src, "clips.txt"), "--out", "x", "-m", "m=a/{clip}.h5"}, 2, "unknown file extension"},
		{[]string{"--clips", filepath.Join(src, "clips.txt"), "--out", "x"}, 2, "no --modality"},
		{append([]string{"--clips", filepath.Join(src, "clips.txt"), "--out", notDataset}, demoMods...), 2, "refusing to replace"},
		{append([]string{"--clips", dup, "--root", src, "--out", filepath.Join(t.TempDir(), "o")}, demoMods...), 1, `line 3: duplicate clip id "clip000" (first at line 1)`},
		{append([]string{"--clips", filepath.Join(src, "clips.txt"), "--out", "x", "--keep-dtype", "nope"}, demoMods...), 2, "names no --modality"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
	} {
		r := runConvert(t, nil, c.args...)
		if r.Code != c.code || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, r.Code, r.Stderr, c.code, c.want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(notDataset, "precious.txt")); string(b) != "keep me" {
		t.Fatal("non-dataset --out was touched")
	}
	for _, h := range []string{"--help", "-h"} {
		r := runConvert(t, nil, h)
		if r.Code != 0 || r.Stderr != "" || !strings.Contains(r.Stdout, "Example:") || !strings.Contains(r.Stdout, "Exit status") ||
			!strings.Contains(r.Stdout, "--clips FILE") || !strings.Contains(r.Stdout, "--mem SIZE") || !strings.Contains(r.Stdout, "-m NAME[@RATE|@clip]") {
			t.Fatalf("%s: %d %q %q", h, r.Code, r.Stdout, r.Stderr)
		}
	}
	// One size parser: a bare number is refused, saying what to write.
	r := runConvert(t, nil, demoArgs(src, filepath.Join(t.TempDir(), "o"), "--mem", "64")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, `size "64" has no unit: write 64MiB`) {
		t.Fatalf("--mem 64: %d %q", r.Code, r.Stderr)
	}
	// A bad flag: one line and a pointer to --help, not the usage.
	r = runConvert(t, nil, "--bogus")
	if r.Code != 2 || r.Stderr != "convert: flag provided but not defined: --bogus (see --help)\n" {
		t.Fatalf("--bogus: %d %q", r.Code, r.Stderr)
	}
}

// TestPartsAndMerge: four parts as separate processes (by I/N, by Slurm's
// array variables, by a Kubernetes Indexed Job's index), then a merge: the
// same bytes as one process, and verify --deep passes.
func TestPartsAndMerge(t *testing.T) {
	src := copyDemo(t)
	single := filepath.Join(t.TempDir(), "single")
	if r := runConvert(t, nil, demoArgs(src, single)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	partsDir := t.TempDir()
	outTmpl := filepath.Join(partsDir, "part-{part}")
	envs := [][]string{
		nil,
		{"SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT=4"},
		{"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=1"},
		{"JOB_COMPLETION_INDEX=3"},
	}
	args := [][]string{{"--part", "0/4"}, {"--part", "auto"}, {"--part", "auto"}, {"--part", "auto", "--parts", "4"}}
	var wg sync.WaitGroup
	res := make([]clitest.Result, 4)
	for i := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = runConvert(t, envs[i], demoArgs(src, outTmpl, args[i]...)...)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.Code != 0 {
			t.Fatalf("part task %d: %d %s", i, r.Code, r.Stderr)
		}
	}
	parts, _ := filepath.Glob(filepath.Join(partsDir, "part-*"))
	if len(parts) != 4 {
		t.Fatalf("parts: %v", parts)
	}
	merged := filepath.Join(t.TempDir(), "merged")
	r := runConvert(t, nil, append([]string{"--merge"}, append(parts, "--out", merged)...)...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "merged 4 parts") {
		t.Fatalf("merge: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	sameTree(t, snapshot(t, single), snapshot(t, merged), "merge of 4 parts vs one process")
	rep, err := manifests.VerifyDataset(merged, manifests.VerifyOptions{Deep: true, Sources: true})
	if err != nil || !rep.OK() {
		t.Fatalf("verify --deep --sources: %v %v", err, rep.Problems)
	}
	// A missing part, a repeated one, and a part of another job are refused.
	for _, c := range []struct {
		parts []string
		want  string
	}{
		{parts[:3], "3 parts given, the job has 4"},
		{[]string{parts[0], parts[1], parts[1], parts[3]}, "part 1 given twice"},
		{[]string{single}, "is not a part"},
	} {
		r := runConvert(t, nil, append([]string{"--merge"}, append(c.parts, "--out", filepath.Join(t.TempDir(), "m"))...)...)
		if r.Code != 1 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%v: %d %q, want %q", c.parts, r.Code, r.Stderr, c.want)
		}
	}
	other := copyDemo(t)
	os.WriteFile(filepath.Join(other, "clips.txt"), []byte("clip000\nclip001\nclip002\nclip003\n"), 0o644)
	otherPart := filepath.Join(t.TempDir(), "other")
	if r := runConvert(t, nil, demoArgs(other, otherPart, "--part", "2/4")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	r = runConvert(t, nil, append([]string{"--merge", parts[0], parts[1], otherPart, parts[3]}, "--out", filepath.Join(t.TempDir(), "m"))...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "part of another job") {
		t.Errorf("other job: %d %q", r.Code, r.Stderr)
	}
	r = runConvert(t, nil, demoArgs(src, filepath.Join(t.TempDir(), "x"), "--part", "auto")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "SLURM_ARRAY_TASK_ID") {
		t.Errorf("auto without variables: %d %q", r.Code, r.Stderr)
	}
}

// TestResumeRechecksSources: a source changed between a killed run and its
// resume is converted again, not taken over from the journal; here the
// changed clip now holds a NaN, so the resume fails on it, naming it.
func TestResumeRechecksSources(t *testing.T) {
	src := copyDemo(t)
	out := filepath.Join(t.TempDir(), "ds")
	r := runConvert(t, []string{"CLIPSHARD_KILL_AFTER_CLIPS=6"}, demoArgs(src, out, "--checkpoint", "0")...)
	if r.Code != -1 {
		t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
	}
	bad, err := os.ReadFile(filepath.Join("..", "..", "testdata", "convert", "nan_emotion.npy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "emotion", "clip003.npy"), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	r = runConvert(t, nil, demoArgs(src, out)...)
	if r.Code != 1 || !strings.Contains(r.Stderr, `clip "clip003"`) || !strings.Contains(r.Stderr, "NaN") {
		t.Fatalf("resume over a changed source: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "dataset.json")); err == nil {
		t.Fatal("dataset.json written")
	}
}

// TestAllSkippedSaysWhy (#64.4): --on-error skip when every clip fails (a
// forgotten @2: every clip's modalities disagree on length) exits 1 with
// one line giving the reasons counted (the clip's id and numbers aside:
// one cause, one entry) with their first clips, and keeps skipped.tsv,
// each clip's reason, in the staging folder it names (nothing under
// --out); convert --clean removes it; the run with the cause mended
// converts every clip and leaves nothing beside --out. On a segmented
// run over a dataset too.
func TestAllSkippedSaysWhy(t *testing.T) {
	src := copyDemo(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "ds")
	bad := []string{"--clips", filepath.Join(src, "clips.txt"), "--out", out, "--quiet", "-m", "whisper=whisper/{clip}.npy", "-m", "motion=motion/{clip}.pkl:exp+pose", "--on-error", "skip"}
	r := runConvert(t, nil, bad...)
	tsv := filepath.Join(parent, ".clipshard-partial-ds", "skipped.tsv")
	for _, w := range []string{"no clip could be converted: all 12 clips skipped (--on-error skip), for 12 like ", "modalities disagree on length", "(clip000, clip001, clip002, ...)", "each clip's reason: " + tsv, "convert --clean --out " + out} {
		if r.Code != 1 || !strings.Contains(r.Stderr, w) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Fatalf("all skipped: exit %d, %q does not say %q", r.Code, r.Stderr, w)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("all skipped: %s made (%v)", out, err)
	}
	b, err := os.ReadFile(tsv)
	if err != nil || strings.Count(string(b), "\n") != 13 || !strings.HasPrefix(string(b), "clip\treason\nclip000\tclip \"clip000\": modalities disagree") {
		t.Fatalf("skipped.tsv: %v\n%s", err, b)
	}
	if r := runConvert(t, nil, "--clean", "--out", out); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Fatalf("after --clean: %v", entries)
	}
	runConvert(t, nil, bad...)
	good := append([]string{}, bad...)
	good[slices.Index(good, "whisper=whisper/{clip}.npy")] = "whisper@2=whisper/{clip}.npy"
	if r := runConvert(t, nil, good...); r.Code != 0 {
		t.Fatalf("mended: %s", r.Stderr)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 1 {
		t.Fatalf("mended: left beside --out: %v", entries)
	}
	// Over the dataset, segmented: the same line, the same reasons.
	seg := append(append([]string{}, bad...), "--segments")
	seg[slices.Index(seg, "--clips")+1] = filepath.Join(src, "l3.txt")
	if err := os.WriteFile(seg[slices.Index(seg, "--clips")+1], []byte("clip000\nclip001\nclip002\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	seg[slices.Index(seg, "motion=motion/{clip}.pkl:exp+pose")] = "motion=motion/{clip}.pkl:pose"
	if r := runConvert(t, nil, seg...); r.Code != 1 || !strings.Contains(r.Stderr, "all 3 clips skipped") {
		t.Fatalf("segmented, all skipped: exit %d %s", r.Code, r.Stderr)
	}
	verifyOK(t, out)
}
