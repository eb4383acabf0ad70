// Package shufflecmd is the shuffle command (cmd/shuffle, and clipshard
// shuffle): it pre-shuffles the windows a trainer samples from a clipshard
// dataset into per-epoch shards read strictly in order by any number of
// ranks. Run "clipshard shuffle --help" for the flags; docs/FORMAT.md
// describes the output.
package shufflecmd

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/transform/shuffle"
)

const usage = `usage: shuffle --dataset DIR --out EDIR --window W (--epochs N | --epoch-range A:B) [flags]
       shuffle --out EDIR --drop A:B

Materialise, for each epoch, the windows a trainer would sample from the
dataset, in one shuffled order, into shard files read strictly in order:
EDIR/epoch-0003/shard-00000.NAME.npy [S, W*RATE, ...] (a per-clip
modality, convert's NAME@clip: [S, ...], each sample's clip value) and
shard-00000.samples.npy int64 [S, 3] (clip, start, valid). A job of any
world size reads an epoch (rank r takes its slice of each global batch:
python/clipshard). Same seed, same bytes, whatever --mem or --workers.
Each epoch is committed atomically; a re-run skips finished epochs.

Example:
  shuffle --dataset /tmp/clipshard-demo --out /tmp/clipshard-demo-epochs \
    --window 15 --epochs 2 --shard-samples 16 --seed 7

Storage: N epochs take N times the dataset. Produce epoch e+1 while epoch e
trains and drop e-1 (--epoch-range E:E+1, then --drop E-1:E: the manifests
are rewritten without it, then its files removed), or replay one epoch in a
seeded shard order (see the README). A re-run writes again an epoch whose
files are gone.

Flags:
`

const exitCodes = `
Exit status: 0 done or up to date; 1 failure; 2 usage error (including not
enough free space).
`

// Run runs the command with args (without the program's name) as name
// ("shuffle", or "clipshard shuffle"), and returns its exit status.
func Run(name string, args []string, stdout, stderr io.Writer) (code int) {
	defer ui.Recover(stderr, name, &code)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var (
		o               shuffle.Options
		epochs          int
		epochRange, mem string
		drop            string
		worldSize       int
		quiet, jsonOut  bool
		seed            uint64
	)
	fs.StringVar(&o.Dataset, "dataset", "", "dataset directory written by convert")
	fs.StringVar(&o.Out, "out", "", "epochs directory to write")
	fs.IntVar(&epochs, "epochs", 0, "write epochs 0..N-1")
	fs.StringVar(&epochRange, "epoch-range", "", "write epochs `A:B` (A..B-1)")
	fs.Uint64Var(&seed, "seed", 0, "random seed")
	fs.IntVar(&o.Sampling.Window, "window", 0, "clip frames per sample (W)")
	fs.StringVar(&o.Sampling.Mode, "sampling", "tile", "`tile`: non-overlapping windows from a random offset; random: --per-clip random windows")
	fs.IntVar(&o.Sampling.PerClip, "per-clip", 0, "windows per clip per epoch with --sampling random")
	fs.StringVar(&o.Sampling.Short, "short", "skip", "clips shorter than W: `skip` or pad (zeros past valid)")
	fs.IntVar(&worldSize, "world-size", 0, "gone: an epoch is one global order that any world size reads; give the world size to the reader")
	fs.IntVar(&o.ShardSize, "shard-samples", 1024, "samples per shard file")
	fs.StringVar(&mem, "mem", "2GiB", "memory budget, a `SIZE` such as 2GiB or 512MiB (above it: external two-pass shuffle, sequential reads)")
	fs.IntVar(&o.Workers, "workers", 0, "shard writers (default: the CPUs, at most 8; same bytes whatever the count)")
	fs.BoolVar(&o.NoFsync, "no-fsync", false, "do not fsync shards before committing an epoch (kill -9 stays safe, a power cut may not; for scratch space)")
	fs.BoolVar(&o.Force, "force", false, "rewrite epochs that are already done (or replace other options' epochs)")
	fs.BoolVar(&o.AllowEmpty, "allow-empty", false, "write epochs without samples (a window longer than every clip, with --short skip) instead of failing")
	fs.StringVar(&drop, "drop", "", "remove epochs `A:B` (A..B-1) from --out: manifests first, then their files")
	fs.BoolVar(&quiet, "quiet", false, "no progress on stderr")
	fs.BoolVar(&jsonOut, "json", false, "print the summary as JSON, with each epoch's shuffle quality")
	fs.IntVar(&o.QualityBatch, "quality-batch", 256, "batch size for the quality figures of --json (distinct clips per batch)")
	if done, code := ui.Parse(fs, args, stdout, stderr, ui.Named(usage, "shuffle", name), ui.Named(exitCodes, "shuffle", name), false); done {
		return code
	}
	o.Seed = seed
	if worldSize != 0 {
		fmt.Fprintln(stderr, name+": --world-size is gone: an epoch is now one global order that any world size reads; give world_size to the reader (clipshard.EpochReader, see README)")
		return 2
	}
	if drop != "" {
		return runDrop(name, fs, o.Out, drop, jsonOut, stdout, stderr)
	}
	switch {
	case epochRange != "" && epochs != 0:
		fmt.Fprintln(stderr, name+": give --epochs or --epoch-range, not both")
		return 2
	case epochRange != "":
		var err error
		if o.EpochStart, o.EpochEnd, err = parseRange("--epoch-range", epochRange); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return 2
		}
	case epochs > 0:
		o.EpochStart, o.EpochEnd = 0, epochs
	default:
		fmt.Fprintln(stderr, name+": --epochs N or --epoch-range A:B is required")
		return 2
	}
	var err error
	if o.Mem, err = ui.ParseSize(mem); err != nil || o.Mem <= 0 {
		fmt.Fprintln(stderr, name+": --mem:", cmp.Or(err, fmt.Errorf("%s: want a positive SIZE such as 2GiB or 512MiB", mem)))
		return 2
	}
	if !jsonOut {
		o.QualityBatch = 0
	}
	o.Tool = "clipshard shuffle " + ui.Version()
	if o.Now, err = ui.Clock(); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var bar *ui.Progress
	// Fault injection for the crash tests: SIGKILL (or SIGINT if
	// CLIPSHARD_KILL_SIGNAL=INT) once this many samples are done in this
	// phase ("write", or "read": pass 1 of the external path).
	killAt, _ := strconv.ParseInt(os.Getenv("CLIPSHARD_KILL_AFTER_SAMPLES"), 10, 64)
	killPhase := cmp.Or(os.Getenv("CLIPSHARD_KILL_PHASE"), "write")
	o.Progress = func(p shuffle.Progress) {
		if p.Phase == "plan" {
			if !quiet {
				fmt.Fprintf(stderr, "%s: writing epochs %v: %s, %s\n", name, p.Epochs, ui.Count(p.Total, "sample"), ui.Bytes(p.Planned))
			}
			return
		}
		if bar == nil {
			bar = ui.New(name, "samples", p.Total, quiet)
		}
		bar.Update(p.Done, func() string { return p.Phase + ", " + ui.Bytes(p.BytesWritten) + " written" })
		if killAt > 0 && p.Phase == killPhase && p.Done >= killAt {
			if os.Getenv("CLIPSHARD_KILL_SIGNAL") == "INT" { // as ^C: the run stops cleanly
				killAt = 0
				syscall.Kill(os.Getpid(), syscall.SIGINT)
				<-ctx.Done() // the signal has arrived
				return
			}
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	res, err := shuffle.Run(ctx, o)
	if bar != nil {
		bar.Finish()
	}
	err = ui.Interrupted(ctx, err, "the epochs committed before stay, a re-run writes the others")
	if err != nil {
		return ui.ExitCode(stderr, name, err, shuffle.ErrUsage)
	}
	if jsonOut {
		b := ui.JSON(map[string]any{"dir": res.Dir, "up_to_date": res.UpToDate, "epochs_written": res.Done,
			"epochs_skipped": res.Skipped, "external": res.External, "bytes": res.Bytes, "quality": res.Quality,
			"planned_bytes": res.Planned, "seconds": res.Elapsed.Seconds()})
		stdout.Write(b)
		return 0
	}
	if res.UpToDate {
		fmt.Fprintf(stdout, "up to date: %s has epochs %v; nothing to do\n", res.Dir, res.Skipped)
		return 0
	}
	path := "in-memory gather"
	if res.External {
		path = "external two-pass shuffle"
	}
	fmt.Fprintf(stdout, "wrote epochs %v into %s in %.1fs: %s (%s)\n", res.Done, res.Dir, res.Elapsed.Seconds(), ui.Bytes(res.Bytes), path)
	if len(res.Skipped) > 0 {
		fmt.Fprintf(stdout, "  already done: epochs %v\n", res.Skipped)
	}
	if res.Replaced > 0 {
		fmt.Fprintf(stdout, "  replaced %d stale epochs (the dataset changed since they were cut, or --force)\n", res.Replaced)
	}
	return 0
}

// parseRange parses A:B for the flag named.
func parseRange(flag, s string) (int, int, error) {
	a, b, ok := strings.Cut(s, ":")
	ai, err1 := strconv.Atoi(a)
	bi, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%s %q: want A:B", flag, s)
	}
	return ai, bi, nil
}

// runDrop is shuffle --out EDIR --drop A:B.
func runDrop(name string, fs *flag.FlagSet, out, drop string, jsonOut bool, stdout, stderr io.Writer) int {
	var other []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "out" && f.Name != "drop" && f.Name != "json" && f.Name != "quiet" {
			other = append(other, "--"+f.Name)
		}
	})
	if len(other) > 0 || out == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: --drop takes --out EDIR only (not %s)\n", name, strings.Join(append(other, fs.Args()...), " "))
		return 2
	}
	ai, bi, err := parseRange("--drop", drop)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 2
	}
	dropped, err := shuffle.Drop(out, ai, bi)
	if err != nil {
		return ui.ExitCode(stderr, name, err, shuffle.ErrUsage)
	}
	if jsonOut {
		if dropped == nil {
			dropped = []int{}
		}
		b := ui.JSON(map[string]any{"dir": out, "dropped": dropped})
		stdout.Write(b)
		return 0
	}
	if len(dropped) == 0 {
		fmt.Fprintf(stdout, "nothing to drop: %s lists no epoch in %d:%d\n", out, ai, bi)
		return 0
	}
	fmt.Fprintf(stdout, "dropped epochs %v from %s\n", dropped, out)
	return 0
}
