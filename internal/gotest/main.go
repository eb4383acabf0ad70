// Command gotest runs go test with its arguments (the README's test
// command: go run ./internal/gotest ./...) and prints what go test prints
// (a line a package; a failing test's output, a failing package's), then
// every test that was skipped, grouped by its reason (what to install, or
// how to run it), so that a run that skipped something says so at its end.
// Its exit status is go test's.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

type key struct{ pkg, test string }

func main() {
	cmd := exec.Command("go", append([]string{"test", "-json"}, os.Args[1:]...)...)
	cmd.Stderr = os.Stderr
	pipe, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gotest: %v\n", err)
		os.Exit(2)
	}
	w := bufio.NewWriter(os.Stdout)
	skips := summarize(pipe, w)
	w.Flush()
	code := 0
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			fmt.Fprintf(os.Stderr, "gotest: %v\n", err)
			os.Exit(2)
		}
		code = ee.ExitCode()
	}
	report(os.Stdout, skips)
	os.Exit(code)
}

type skipped struct {
	reason string
	tests  []string // "pkg TestName"
}

// summarize reads go test -json's events from r and writes what go test
// would print without -v to w; it returns the skipped tests by reason, in
// the order they were first seen.
func summarize(r io.Reader, w *bufio.Writer) []skipped {
	out := map[key][]string{} // each test's output, and each package's ("" test)
	var skips []skipped
	at := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(w, sc.Text()) // (not an event: as it came)
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			out[k] = append(out[k], e.Output)
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "fail":
			if e.Test != "" {
				for _, l := range out[k] {
					fmt.Fprint(w, l)
				}
			} else {
				for _, l := range out[k] {
					if l != "PASS\n" {
						fmt.Fprint(w, l)
					}
				}
			}
			w.Flush()
		case "pass", "skip":
			if e.Test == "" {
				// The package's line (ok, or ? [no test files]), as go test prints it.
				for _, l := range out[k] {
					if strings.HasPrefix(l, "ok  \t") || strings.HasPrefix(l, "?   \t") {
						fmt.Fprint(w, l)
					}
				}
				w.Flush()
			} else if e.Action == "skip" {
				reason := reasonOf(out[k])
				i, ok := at[reason]
				if !ok {
					i = len(skips)
					at[reason] = i
					skips = append(skips, skipped{reason: reason})
				}
				skips[i].tests = append(skips[i].tests, strings.TrimPrefix(e.Package, "github.com/clipshard/clipshard/")+" "+e.Test)
			}
			delete(out, k)
		}
	}
	return skips
}

// reasonOf is what a skipped test said (its t.Skip message), without the
// file:line prefix.
func reasonOf(lines []string) string {
	var said []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		if i := strings.Index(t, ".go:"); i > 0 && !strings.Contains(t[:i], " ") {
			if j := strings.Index(t[i:], ": "); j > 0 {
				t = t[i+j+2:]
			}
		}
		said = append(said, t)
	}
	if len(said) == 0 {
		return "(no reason given)"
	}
	return strings.Join(said, " ")
}

// report prints the skipped tests, a reason at a time.
func report(w io.Writer, skips []skipped) {
	if len(skips) == 0 {
		return
	}
	n := 0
	for _, s := range skips {
		n += len(s.tests)
	}
	fmt.Fprintf(w, "skipped %d tests, for %d reasons (what to install, or how to run them):\n", n, len(skips))
	for _, s := range skips {
		names := slices.Clone(s.tests)
		more := ""
		if len(names) > 4 {
			more = fmt.Sprintf(" and %d more", len(names)-4)
			names = names[:4]
		}
		fmt.Fprintf(w, "  %s\n    (%d: %s%s)\n", s.reason, len(s.tests), strings.Join(names, ", "), more)
	}
}
