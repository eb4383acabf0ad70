// Package numpytest finds a Python interpreter with numpy for tests that
// check clipshard against real numpy.
package numpytest

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

var (
	once   sync.Once
	python string
)

// Python returns the path of a python3 that can import numpy: $CLIPSHARD_PYTHON,
// /usr/bin/python3 or python3 on $PATH. Without one the test fails when $CI
// is set (CI must install python3-numpy) and is skipped otherwise, saying
// what to install.
func Python(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		for _, p := range []string{os.Getenv("CLIPSHARD_PYTHON"), "/usr/bin/python3", "python3"} {
			if p == "" {
				continue
			}
			if exec.Command(p, "-c", "import numpy").Run() == nil {
				python = p
				return
			}
		}
	})
	if python == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no python3 with numpy found (CI must run: apt-get install -y python3-numpy)")
		}
		t.Skip("needs python3 with numpy: apt-get install python3-numpy (or set CLIPSHARD_PYTHON)")
	}
	return python
}

// Run runs python with args and fails the test on error, showing output.
func Run(t testing.TB, args ...string) []byte {
	t.Helper()
	return RunEnv(t, nil, args...)
}

// RunEnv is Run with this process's environment changed by env (for
// tests that run in parallel, which may not set their own): each "K=V"
// sets K, each "K=" unsets it. TMPDIR is the test's own temporary folder
// unless env sets it: what the script and its processes leave there
// (multiprocessing's pymp-* folders of DataLoader workers a check kills,
// the scripts' own) goes with the test, not into the node's /tmp.
func RunEnv(t testing.TB, env []string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(Python(t), args...)
	set := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	if !set["TMPDIR"] {
		env, set["TMPDIR"] = append(env, "TMPDIR="+t.TempDir()), true
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, kv := range env {
		if _, v, _ := strings.Cut(kv, "="); v != "" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 %v: %v\n%s", args, err, out)
	}
	return out
}

// Module fails (with $CI set) or skips the test, saying which Debian
// package to install, unless Python(t) can import module.
func Module(t testing.TB, module, debian string) {
	t.Helper()
	p := Python(t)
	if exec.Command(p, "-c", "import "+module).Run() == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s cannot import %s (CI must run: apt-get install -y %s)", p, module, debian)
	}
	t.Skipf("needs %s for %s: apt-get install %s", module, p, debian)
}
