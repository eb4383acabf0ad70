// Command clipshard is the clipshard toolkit in one command: convert,
// shuffle and verify as subcommands (cmd/convert, cmd/shuffle and
// cmd/verify are aliases of them). Run "clipshard help" for the list.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"

	convertcmd "github.com/clipshard/clipshard/internal/commands/convert"
	inspectcmd "github.com/clipshard/clipshard/internal/commands/inspect"
	pushcmd "github.com/clipshard/clipshard/internal/commands/push"
	shufflecmd "github.com/clipshard/clipshard/internal/commands/shuffle"
	verifycmd "github.com/clipshard/clipshard/internal/commands/verify"
	"github.com/clipshard/clipshard/internal/ui"
)

const usage = `usage: clipshard COMMAND [flags]

Turn per-clip pickles and .npy features into float16, memory-mappable,
pre-shuffled shards that a trainer reads with one sequential read a batch.

Commands:
  convert   decode the sources, convert to float16 exactly as numpy would,
            and concatenate each modality into one .npy blob with manifests
  shuffle   write the windows a trainer samples, in one shuffled order per
            epoch, into shard files any number of ranks read in order
  verify    check a dataset or epochs directory, and that it equals its
            sources
  inspect   show what a dataset or an epochs folder holds (text, --json,
            or --html FILE: a page of plots)
  push      upload a dataset or an epochs folder to an S3-compatible
            bucket (s3://BUCKET/PREFIX), resumable, manifests last
  help      this text; "clipshard help COMMAND" is a command's
  version   the version and commit this binary was built from

Example:
  clipshard convert --clips testdata/demo/clips.txt --out /tmp/ds \
    -m 'motion=motion/{clip}.pkl:exp+pose' -m 'whisper@2=whisper/{clip}.npy'
  clipshard shuffle --dataset /tmp/ds --out /tmp/ep --window 15 --epochs 2
  clipshard verify --deep /tmp/ep

Run "clipshard COMMAND --help" for a command's flags. Exit status: 0 done;
1 bad input or failure (one line on stderr names the file, clip and key);
2 usage error.
`

type command func(name string, args []string, stdout, stderr io.Writer) int

var commands = map[string]command{
	"convert": convertcmd.Run,
	"shuffle": shufflecmd.Run,
	"verify":  verifycmd.Run,
	"inspect": inspectcmd.Run,
	"push":    pushcmd.Run,
}

func main() { ui.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			fmt.Fprint(stdout, usage)
			return 0
		}
		if run, ok := commands[rest[0]]; ok && len(rest) == 1 {
			return run("clipshard "+rest[0], []string{"--help"}, stdout, stderr)
		}
		fmt.Fprintf(stderr, "clipshard help: %q is not a command (%s)\n", strings.Join(rest, " "), names())
		return 2
	case "version", "-version", "--version":
		if len(rest) != 0 {
			fmt.Fprintf(stderr, "clipshard %s: takes no arguments\n", cmd)
			return 2
		}
		fmt.Fprintln(stdout, version())
		return 0
	default:
		if run, ok := commands[cmd]; ok {
			return run("clipshard "+cmd, rest, stdout, stderr)
		}
		hint := ""
		if near := ui.Nearest(cmd, strings.Split(names(), ", ")); near != "" {
			hint = "; did you mean " + near + "?"
		}
		fmt.Fprintf(stderr, "clipshard: %q is not a command (%s%s; clipshard help)\n", cmd, names(), hint)
		return 2
	}
}

func names() string {
	var out []string
	for name := range commands {
		out = append(out, name)
	}
	sort.Strings(out)
	return strings.Join(append(out, "help", "version"), ", ")
}

// version names the module version and the commit the binary was built
// from (go build stamps it in a git checkout).
func version() string {
	commit, modified := "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	switch {
	case commit == "":
		commit = "commit unknown (built without version control information, e.g. by go run or -buildvcs=false)"
	case modified:
		commit = "commit " + commit + " with local changes"
	default:
		commit = "commit " + commit
	}
	return fmt.Sprintf("clipshard %s, %s, %s", ui.Version(), commit, runtime.Version())
}
