package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
)

var bin string

// Built with version control information (GOFLAGS may say -buildvcs=false),
// as the README's build command does.
func TestMain(m *testing.M) { clitest.Main(m, "clipshard", &bin, "-buildvcs=true") }

func clip(t *testing.T, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, nil, args...)
}

func oneLine(t *testing.T, r clitest.Result, code int, prefix string) {
	t.Helper()
	clitest.OneLine(t, r, code, prefix)
}

// TestHelp: help goes to stdout with exit 0, for the command and for each
// subcommand, named as it was called; no arguments is a usage error.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		r := clip(t, args...)
		if r.Code != 0 || !strings.HasPrefix(r.Stdout, "usage: clipshard COMMAND") || r.Stderr != "" {
			t.Fatalf("%v: %d %q %q", args, r.Code, r.Stdout, r.Stderr)
		}
		for _, c := range []string{"convert", "shuffle", "verify", "help", "version"} {
			if !strings.Contains(r.Stdout, "\n  "+c+" ") {
				t.Errorf("%v: help does not list %s", args, c)
			}
		}
	}
	r := clip(t)
	if r.Code != 2 || r.Stdout != "" || !strings.HasPrefix(r.Stderr, "usage: clipshard COMMAND") {
		t.Fatalf("no arguments: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	for _, c := range []string{"convert", "shuffle", "verify"} {
		for _, args := range [][]string{{"help", c}, {c, "--help"}} {
			r := clip(t, args...)
			if r.Code != 0 || !strings.HasPrefix(r.Stdout, "usage: clipshard "+c+" ") || r.Stderr != "" {
				t.Fatalf("%v: %d %q %q", args, r.Code, r.Stdout[:min(len(r.Stdout), 200)], r.Stderr)
			}
			if !strings.Contains(r.Stdout, "Flags:") || !strings.Contains(r.Stdout, "Exit status") {
				t.Errorf("%v: no flags or exit status in the help", args)
			}
			// The examples are named as called; the old name stays in prose only.
			for _, l := range strings.Split(r.Stdout, "\n") {
				if strings.HasPrefix(strings.TrimSpace(l), c+" --") {
					t.Errorf("%v: example line %q not named clipshard %s", args, l, c)
				}
			}
		}
	}
}

// TestErrors: unknown commands and flags, bad input: one line each,
// naming "clipshard COMMAND" once, and the documented exit status.
func TestErrors(t *testing.T) {
	oneLine(t, clip(t, "nope"), 2, `clipshard: "nope" is not a command`)
	oneLine(t, clip(t, "help", "nope"), 2, `clipshard help: "nope" is not a command`)
	oneLine(t, clip(t, "version", "x"), 2, "clipshard version: takes no arguments")
	oneLine(t, clip(t, "shuffle", "--bogus"), 2, "clipshard shuffle: flag provided but not defined: --bogus")
	oneLine(t, clip(t, "convert", "--clips", "x", "--out", t.TempDir(), "-m", "a=b"), 2, `clipshard convert: usage: modality "a=b"`)
	missing := filepath.Join(t.TempDir(), "nothing")
	oneLine(t, clip(t, "verify", missing), 2, "clipshard verify: ")
	clips := filepath.Join(t.TempDir(), "clips.txt")
	if err := os.WriteFile(clips, []byte("c1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := clip(t, "convert", "--quiet", "--clips", clips, "--out", filepath.Join(t.TempDir(), "ds"), "-m", "x={clip}.npy")
	oneLine(t, r, 1, "clipshard convert: ")
	if !strings.Contains(r.Stderr, "c1") || strings.Contains(r.Stderr, "convert: convert:") {
		t.Fatalf("the error should name the clip, once prefixed: %q", r.Stderr)
	}
}

// TestVersion: --version names the commit the binary was built from.
func TestVersion(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse: %v): the commit cannot be checked", err)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		r := clip(t, args...)
		want := "commit " + strings.TrimSpace(string(head))
		if r.Code != 0 || !strings.HasPrefix(r.Stdout, "clipshard ") || !strings.Contains(r.Stdout, want) || r.Stderr != "" {
			t.Fatalf("%v: want %q in stdout, got %d %q %q", args, want, r.Code, r.Stdout, r.Stderr)
		}
	}
}

// TestSubcommandsAreTheCommands: clipshard convert, shuffle and verify on
// the demo data write what convert, shuffle and verify write (the old
// names are aliases of one code).
func TestSubcommandsAreTheCommands(t *testing.T) {
	old := t.TempDir()
	for _, c := range []string{"convert", "shuffle", "verify"} {
		cmd := exec.Command("go", "build", "-buildvcs=true", "-o", filepath.Join(old, c), "../"+c) // (the manifests record the version)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v %s", c, err, out)
		}
	}
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo"), src)
	mods := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy"}
	trees := map[string]string{}
	dir := t.TempDir() // the same paths for both (epochs.json names the dataset's)
	ds, ep := filepath.Join(dir, "ds"), filepath.Join(dir, "ep")
	for _, who := range []string{"new", "old"} {
		os.RemoveAll(ds)
		os.RemoveAll(ep)
		steps := [][]string{
			append([]string{"convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--out", ds}, mods...),
			{"shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "2", "--shard-samples", "8"},
			{"verify", "--quiet", "--deep", ep},
		}
		for _, s := range steps {
			var r clitest.Result
			if who == "new" {
				r = clip(t, s...)
			} else {
				r = clitest.Run(t, filepath.Join(old, s[0]), nil, s[1:]...)
			}
			if r.Code != 0 {
				t.Fatalf("%s %v: %d %s", who, s, r.Code, r.Stderr)
			}
		}
		sums := ""
		for _, d := range []string{ds, ep} {
			b, err := os.ReadFile(filepath.Join(d, "SHA256SUMS"))
			if err != nil {
				t.Fatal(err)
			}
			sums += string(b)
		}
		trees[who] = sums
	}
	if trees["new"] != trees["old"] || trees["new"] == "" {
		t.Fatalf("clipshard's subcommands wrote other bytes than the old commands:\n%s\n---\n%s", trees["new"], trees["old"])
	}
}

// TestFirstHourMessages (#36.4): the mistakes of a newcomer's first hour
// each get one line that says what to do: a mistyped flag or command
// (did you mean), a missing --window, an epochs folder given as a dataset
// (and back), a --out of the user's own files (named), a refused weight
// schedule echoed as it was given (2:@..., not 2:0@...).
func TestFirstHourMessages(t *testing.T) {
	ds, ep := demo(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"shuffle", "--windwo", "3"}, "did you mean --window?"},
		{[]string{"verify", "--deeep", ds}, "did you mean --deep?"},
		{[]string{"shufle"}, "did you mean shuffle?"},
		{[]string{"shuffle", "--dataset", ds, "--out", filepath.Join(t.TempDir(), "e"), "--epochs", "1"}, "--window W is required"},
		{[]string{"shuffle", "--dataset", ep, "--out", filepath.Join(t.TempDir(), "e"), "--epochs", "1", "--window", "3"}, "is an epochs folder (it holds epochs.json), not a dataset"},
	} {
		r := clip(t, c.args...)
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) || strings.Count(r.Stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line saying %q", c.args, r.Code, r.Stderr, c.want)
		}
	}
	mine := t.TempDir()
	os.WriteFile(filepath.Join(mine, "notes.txt"), []byte("mine"), 0o644)
	os.Mkdir(filepath.Join(mine, "runs"), 0o755)
	r := clip(t, "convert", "--clips", filepath.Join("..", "..", "testdata", "demo", "clips.txt"), "--out", mine, "-m", "whisper@2=whisper/{clip}.npy")
	if r.Code != 2 || !strings.Contains(r.Stderr, "notes.txt, runs/") {
		t.Errorf("convert --out a folder of the user's: exit %d, %q; want the files named", r.Code, r.Stderr)
	}
	out := filepath.Join(t.TempDir(), "mixed")
	base := []string{"shuffle", "--quiet", "--source", "a=" + ds, "--source", "b=" + ds, "--out", out, "--window", "3"}
	if r := clip(t, append(base, "--weights", "0:1@a=1,b=1", "--weights", "1:@a=1,b=2", "--epochs", "1")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	r = clip(t, append(base, "--weights", "0:1@a=1,b=1", "--weights", "1:@a=1,b=3", "--epoch-range", "1:2")...)
	if r.Code != 2 || !strings.Contains(r.Stderr, "--weights 1:@a=1,b=2") || !strings.Contains(r.Stderr, "--weights 1:@a=1,b=3") || strings.Contains(r.Stderr, "1:0@") {
		t.Errorf("a refused schedule: exit %d, %q", r.Code, r.Stderr)
	}
}
