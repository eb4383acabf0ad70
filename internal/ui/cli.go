// CLI: flag parsing, error lines and exit codes shared by the commands.

package ui

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Version is the version a command writes into its manifests ("tool")
// and prints: Release.
func Version() string {
	return Release
}

// Release is clipshard's version: the binary's and the Python package's
// (python/pyproject.toml and clipshard.__version__ say the same; a test
// holds them to it), whatever go build stamps (v0.0.0-DATE-COMMIT in a git
// checkout, (devel) with go run): `clipshard version` names the commit
// beside it.
const Release = "2.0.0"

// Clock returns the clock commands record as their "created" time:
// time.Now, or, when SOURCE_DATE_EPOCH is set (reproducible-builds.org),
// that fixed time, so that two runs are byte-identical.
func Clock() (func() time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Now, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a number of seconds", v)
	}
	t := time.Unix(n, 0)
	return func() time.Time { return t }, nil
}

// Parse parses args with fs. Flags may come before or after the
// positional arguments (verify DIR --deep), up to a "--". -h/--help prints
// usage, the flags and exitCodes on stdout; a bad flag or a stray argument
// prints one line on stderr pointing to --help. done is true when the
// command must stop with code (0 after --help, 2 otherwise).
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, usage, exitCodes string, allowArgs bool) (done bool, code int) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			PrintFlags(stdout, fs)
			fmt.Fprint(stdout, exitCodes)
			return true, 0
		}
		if err != nil {
			msg := strings.Replace(err.Error(), " -", " --", 1)
			if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
				var names []string
				fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
				if near := Nearest(strings.TrimLeft(name, "-"), names); near != "" {
					msg += "; did you mean --" + near + "?"
				}
			}
			fmt.Fprintf(stderr, "%s: %s (see --help)\n", fs.Name(), msg)
			return true, 2
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			positional = append(positional, rest...) // everything after "--"
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	if !allowArgs && len(positional) > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see --help)\n", fs.Name(), positional[0])
		return true, 2
	}
	// The positional arguments, for fs.Args().
	fs.Parse(append([]string{"--"}, positional...))
	return false, 0
}

// PrintFlags prints fs's flags the way the commands spell them: --name
// PLACEHOLDER (the backquoted word of the usage, or the kind of value),
// the usage, and the default when there is one.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		switch name {
		case "value", "string":
			name = strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		case "int", "uint", "uint64":
			name = "N"
		}
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, help)
		if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "[]" {
			fmt.Fprintf(w, " (default %s)", d)
		}
		fmt.Fprintln(w)
	})
}

// Interrupted replaces err, when ctx was cancelled (SIGINT, SIGTERM), by
// one line saying so and what is left (after, e.g. "a re-run resumes").
func Interrupted(ctx context.Context, err error, after string) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	return errors.New("interrupted; " + after)
}

// ExitCode prints err as one line and returns the exit status: 2 when err
// wraps usage (the caller's mistake), 1 otherwise.
func ExitCode(stderr io.Writer, cmd string, err error, usage error) int {
	Fail(stderr, cmd, err)
	if errors.Is(err, usage) {
		return 2
	}
	return 1
}

// Recover turns a panic in a command into one line and exit status 1; use
// as defer ui.Recover(stderr, "convert", &code).
func Recover(stderr io.Writer, cmd string, code *int) {
	if p := recover(); p != nil {
		if os.Getenv("CLIPSHARD_PANIC_TRACE") != "" { // for debugging clipshard itself
			fmt.Fprintf(stderr, "%v\n%s", p, debug.Stack())
		}
		fmt.Fprintf(stderr, "%s: internal error: %v (a bug in clipshard: please report it with the command line)\n", cmd, p)
		*code = 1
	}
}

// Exit reports the peak memory (see PeakFileEnv) and exits with code; the
// commands' mains end with it.
func Exit(code int) {
	if p := os.Getenv(PeakFileEnv); p != "" {
		if b, err := os.ReadFile("/proc/self/status"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "VmHWM:") {
					os.WriteFile(p, []byte(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))+"\n"), 0o644)
				}
			}
		}
	}
	os.Exit(code)
}

// PeakFileEnv names the environment variable that asks a command to write
// its peak resident memory (VmHWM, e.g. "65536 kB") into a file as it
// exits: the tests' measure of --mem. (getrusage of a child counts the
// memory of the process that started it, which the child shares until it
// execs.)
const PeakFileEnv = "CLIPSHARD_PEAK_FILE"

// ParseSize parses a size for --mem and the like: a number with a unit,
// binary (KiB, MiB, GiB, TiB; K, M, G, T) or decimal (KB, MB, GB, TB), or
// bytes (B). A bare number is refused (it meant MiB for convert and bytes
// for shuffle before both took this one parser), except 0.
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			n, err := strconv.ParseFloat(strings.TrimSuffix(s, u.suffix), 64)
			if err != nil || n < 0 || n*float64(u.mult) > 1<<62 {
				return 0, fmt.Errorf("bad size %q (use e.g. 2GiB, 512MiB)", s)
			}
			return int64(n * float64(u.mult)), nil
		}
	}
	if s == "0" {
		return 0, nil
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return 0, fmt.Errorf("size %q has no unit: write %sMiB, %sGiB or %sB", s, s, s, s)
	}
	return 0, fmt.Errorf("bad size %q (use e.g. 2GiB, 512MiB)", s)
}

// Count words n things: "1 clip", "12 clips".
func Count(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// JSON encodes v for a --json summary: indented, "<f2" kept as it is (no
// HTML escaping), with a final newline. A value JSON cannot hold (a NaN
// or Inf float64: report such figures as Float) is an error, never an
// empty or partial output.
func JSON(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("--json: %w", err)
	}
	return []byte(b.String()), nil
}

// WriteJSON writes v as JSON to w; an encoding or write error is
// returned (the command exits non-zero).
func WriteJSON(w io.Writer, v any) error {
	b, err := JSON(v)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("writing the output: %w", err)
	}
	return nil
}

// Float is a float64 figure that may be NaN or ±Inf (the mean of no
// values, the max of infinite ones): JSON has no such numbers, so they
// are null there (the counts beside them say how many values were NaN or
// infinite); a finite value is encoded as a float64 is.
type Float float64

// MarshalJSON encodes a non-finite f as null.
func (f Float) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(f))
}

// ErrWriter passes writes to W and keeps the first error: a printer that
// writes many lines checks Err once at the end.
type ErrWriter struct {
	W   io.Writer
	Err error
}

func (e *ErrWriter) Write(p []byte) (int, error) {
	if e.Err != nil {
		return 0, e.Err
	}
	n, err := e.W.Write(p)
	if err != nil {
		e.Err = err
	}
	return n, err
}

// Named is a command's help text for the name it was called by ("convert",
// or "clipshard convert"): the usage lines and the example command lines,
// those that start (after indentation or "usage: ") with the command's own
// name, name it so; prose that mentions the command is left as it is.
func Named(text, cmd, name string) string {
	if name == cmd {
		return text
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		rest := strings.TrimLeft(l, " ")
		indent := l[:len(l)-len(rest)]
		if p, ok := strings.CutPrefix(rest, "usage: "+cmd+" "); ok {
			lines[i] = indent + "usage: " + name + " " + p
		} else if p, ok := strings.CutPrefix(rest, cmd+" "); ok && indent != "" {
			lines[i] = indent + name + " " + p
		}
	}
	return strings.Join(lines, "\n")
}

// Nearest is the one of names closest to s (a mistyped flag or command),
// if it is close: at most 2 edits, or a third of its letters (a swap of
// two letters counts as one edit); "" if none is.
func Nearest(s string, names []string) string {
	best, bestD := "", 1<<30
	for _, n := range names {
		if d := edits(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" || bestD > max(2, len(s)/3) || bestD >= len(best) {
		return ""
	}
	return best
}

// edits is the optimal string alignment distance of a and b: insertions,
// deletions, substitutions and swaps of neighbouring letters.
func edits(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// LabelList words a vocabulary for a summary line: "3 labels: alice,
// bob, carol", the first max of them quoted where they hold a space or
// a comma, then "and N more".
func LabelList(labels []string, max int) string {
	var b strings.Builder
	b.WriteString(Count(int64(len(labels)), "label"))
	for i, l := range labels {
		if i == max {
			fmt.Fprintf(&b, " ... and %d more", len(labels)-max)
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		if strings.ContainsAny(l, " ,\"") {
			l = strconv.Quote(l)
		}
		b.WriteString(l)
	}
	return b.String()
}
