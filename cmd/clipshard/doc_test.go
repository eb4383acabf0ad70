package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/internal/s3test"
)

// docBlock is a fenced block of a document: its language, text, line.
type docBlock struct {
	file, lang, text, skip string
	line                   int
}

// notRun are the reasons a doc block may give (in a comment on the line
// above it) for not being run by TestDocs: each is run elsewhere or needs
// what no machine here has.
var notRun = map[string]bool{
	"runs in TestSlurmChain":                         true,
	"needs a Docker engine and a Kubernetes cluster": true,
	"the README's first command: .ci/run runs it":    true,
}

// docBlocks are the fenced blocks of file, with the reason not to run
// one (the comment above it) where it gives one.
func docBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docBlock
	var cur *docBlock
	prev := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &docBlock{file: file, lang: strings.TrimPrefix(line, "```"), line: n}
			if reason, ok := strings.CutPrefix(strings.TrimSpace(prev), "<!-- not run: "); ok {
				cur.skip = strings.TrimSuffix(reason, " -->")
			}
			if strings.TrimSpace(prev) == "<!-- demo -->" {
				cur.skip = "the README's first command: .ci/run runs it"
			}
		case cur != nil && strings.HasPrefix(line, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
		prev = line
	}
	return out
}

// docSandbox is a folder standing for the docs' /data: the demo's sources
// in raw/, its clip list in clips.txt, and local/ for a node's disk.
func docSandbox(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo"), filepath.Join(dir, "raw"))
	b, err := os.ReadFile(filepath.Join(dir, "raw", "clips.txt"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "clips.txt"), b, 0o644)
	os.Mkdir(filepath.Join(dir, "local"), 0o755)
	return dir
}

// runBlock runs a sh or python block in sandbox dir (the docs' /data),
// with env; the combined output, and an error if it failed.
func runBlock(t *testing.T, b docBlock, dir, python string, env []string, endpoint string) (string, error) {
	text := strings.NewReplacer("/data/", dir+"/", "/local/nvme/", dir+"/local/", "https://s3.example.org", endpoint).Replace(b.text)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if b.lang == "python" {
		cmd = exec.CommandContext(ctx, python, "-c", text)
	} else {
		cmd = exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", text)
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestDocs (#36.3): every sh and python block of the README and of
// docs/*.md runs as written, in order, each document in a folder of its
// own standing for /data (the demo set's sources), with the clipshard
// command on PATH and the package on PYTHONPATH, s3://training/ a bucket
// of a versitygw started for it. A block that cannot run here says why in
// a comment above it, one of a few reasons this test knows (the README's
// demo and test commands, which .ci/run runs; Slurm's, run by
// TestSlurmChain; Kubernetes', which needs a cluster). The README's test
// command is a text block (this test runs in it).
func TestDocs(t *testing.T) {
	python := numpytest.Python(t)
	numpytest.Module(t, "torch", "python3-torch")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	haveS3 := s3test.Binary() != "" || os.Getenv("CI") != ""
	if haveS3 {
		numpytest.Module(t, "boto3", "python3-boto3")
	}
	// python3 in a sh block is the tests' Python (with numpy and torch).
	pybin := t.TempDir()
	if err := os.Symlink(python, filepath.Join(pybin, "python3")); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, file := range files {
		blocks := docBlocks(t, file)
		dir := docSandbox(t)
		env := []string{"PATH=" + filepath.Dir(bin) + ":" + pybin + ":" + os.Getenv("PATH"), "PYTHONPATH=" + filepath.Join(root, "python"), "TMPDIR=" + t.TempDir()}
		// A server a document (its bucket s3://training/) when it uses one.
		var s3 *s3test.Server
		endpoint := ""
		for _, b := range blocks {
			if haveS3 && s3 == nil && strings.Contains(b.text, "s3://") {
				s3 = s3test.Start(t, "training")
				env, endpoint = append(env, s3.Env()...), s3.Endpoint
			}
		}
		for _, b := range blocks {
			if b.lang != "sh" && b.lang != "bash" && b.lang != "python" {
				continue
			}
			where := filepath.Base(file) + ":" + strconv.Itoa(b.line)
			if b.skip != "" {
				if !notRun[b.skip] {
					t.Errorf("%s: not run for a reason this test does not know: %q", where, b.skip)
				}
				continue
			}
			if s3 == nil && strings.Contains(b.text, "s3://") {
				t.Logf("%s: skipped (no versitygw: %s)", where, s3test.Install)
				continue
			}
			began := time.Now()
			out, err := runBlock(t, b, dir, python, env, endpoint)
			t.Logf("%s: %s block, %.1fs", where, b.lang, time.Since(began).Seconds())
			if err != nil {
				t.Fatalf("%s: the %s block fails: %v\n%s\n--- output:\n%s", where, b.lang, err, b.text, out)
			}
			ran++
		}
	}
	if ran < 15 {
		t.Fatalf("only %d blocks ran", ran)
	}
	t.Logf("%d blocks of %d documents ran", ran, len(files))
}

// TestWheel (#36.2): the wheel `just wheel` builds (python/_build.py
// wheels: the clipshard command for this machine, CGO off, and the Python
// package) installs offline into a fresh virtualenv (Debian's numpy and
// torch from the system), and, with a PATH that has no Go on it, gives a
// clipshard command naming its commit and a package imported from the
// venv, with which the README's quickstart ("On your own data") runs as
// written. The wheel is around the command these tests built unless
// CLIPSHARD_EXHAUSTIVE is set (CI): then just wheel's own build (CGO off,
// -trimpath; on a cold build cache that compiles every package again:
// 327 s of a package's 10 minutes with the other core busy, on a fresh
// machine).
func TestWheel(t *testing.T) {
	numpytest.Module(t, "pip", "python3-pip")
	numpytest.Module(t, "ensurepip", "python3-venv")
	numpytest.Module(t, "torch", "python3-torch")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	if clitest.Long() {
		clitest.StaticBuild(t, root, nil, numpytest.Python(t), filepath.Join(root, "python", "_build.py"), "wheels", "--out", dist)
	} else {
		// the wheel around the command these tests built
		numpytest.Run(t, filepath.Join(root, "python", "_build.py"), "wheels", "--out", dist, "--binary", bin)
	}
	wheels, _ := filepath.Glob(filepath.Join(dist, "clipshard-*.whl"))
	if len(wheels) != 1 {
		t.Fatalf("want one wheel for this machine in %s, got %v", dist, wheels)
	}
	venv := filepath.Join(t.TempDir(), "venv")
	numpytest.Run(t, "-m", "venv", "--system-site-packages", venv)
	pip := exec.Command(filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--quiet", "--no-index", "--disable-pip-version-check", wheels[0])
	pip.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_CONFIG_FILE=/dev/null")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", wheels[0], err, out)
	}
	// No Go, no tree: the venv's command and package alone.
	env := []string{"PATH=" + filepath.Join(venv, "bin") + ":/usr/bin:/bin", "PYTHONPATH=", "TMPDIR=" + t.TempDir()}
	check := exec.Command("sh", "-c", `! command -v go >/dev/null && command -v clipshard && clipshard --version && cd / && python -c 'import clipshard, sys; print(clipshard.__file__)'`)
	check.Env = append(os.Environ(), env...)
	out, err := check.CombinedOutput()
	if err != nil || !strings.Contains(string(out), filepath.Join(venv, "bin", "clipshard")) || !strings.Contains(string(out), "site-packages/clipshard") {
		t.Fatalf("the installed wheel: %v\n%s", err, out)
	}
	_, gitErr := exec.LookPath("git")
	if _, err := os.Stat(filepath.Join(root, ".git")); err == nil && gitErr == nil && (!strings.Contains(string(out), ", commit ") || strings.Contains(string(out), "commit unknown")) {
		t.Fatalf("clipshard --version does not name the commit of this checkout: %s", out)
	}
	dir := docSandbox(t)
	var ran int
	section := false
	for _, b := range docBlocks(t, filepath.Join(root, "README.md")) {
		if b.line > 0 && strings.Contains(b.text, "clipshard convert --clips /data/clips.txt") {
			section = true
		}
		if !section || (b.lang != "sh" && b.lang != "python") || strings.Contains(b.text, "s3://") {
			continue
		}
		out, err := runBlock(t, b, dir, filepath.Join(venv, "bin", "python"), env, "")
		if err != nil {
			t.Fatalf("README.md:%d with the wheel: %v\n%s", b.line, err, out)
		}
		ran++
	}
	if ran != 2 {
		t.Fatalf("%d quickstart blocks ran, want 2 (convert and shuffle; the training loop)", ran)
	}
	t.Logf("%s: %s", filepath.Base(wheels[0]), strings.TrimSpace(string(out)))
}
