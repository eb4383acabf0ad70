// CLI: flag parsing, error lines and exit codes shared by the commands.

package ui

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Version is the module version the command was built from, or "(devel)".
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

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

// Parse parses args with fs, whose --help prints usage, the flags and
// exitCodes on stderr. done is true when the command must stop with code
// (0 after --help, 2 on a bad flag or a stray argument).
func Parse(fs *flag.FlagSet, args []string, stderr io.Writer, usage, exitCodes string, allowArgs bool) (done bool, code int) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
		fmt.Fprint(stderr, exitCodes)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, 0
		}
		return true, 2
	}
	if !allowArgs && fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see --help)\n", fs.Name(), fs.Arg(0))
		return true, 2
	}
	return false, 0
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
