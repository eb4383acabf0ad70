// Package clitest builds a command of this module and runs it, for tests
// that check the real binary's exit codes and output.
package clitest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build builds the command in the current directory (a test's package)
// into a temporary folder and returns its path and a cleanup func. It is
// meant for TestMain; on failure it prints the build output and exits.
func Build(name string) (string, func()) {
	dir, err := os.MkdirTemp("", "clipshard-"+name+"-test")
	if err != nil {
		panic(err)
	}
	bin := filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	return bin, func() { os.RemoveAll(dir) }
}

// Result is how a run ended. Code is -1 when the process was killed.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs bin with args, the test environment plus SOURCE_DATE_EPOCH (so
// that outputs are byte-comparable) plus env.
func Run(t testing.TB, bin string, env []string, args ...string) Result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000"), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
		if !ee.Exited() {
			code = -1
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(se.Bytes(), []byte("goroutine ")) {
		t.Fatalf("%s printed a stack trace:\n%s", filepath.Base(bin), se.String())
	}
	return Result{code, so.String(), se.String()}
}
