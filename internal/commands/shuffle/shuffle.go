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

	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

const usage = `usage: shuffle --dataset DIR --out EDIR --window W (--epochs N | --epoch-range A:B) [flags]
       shuffle --source NAME=DIR --source NAME=DIR ... [--weights [A:B@]NAME=W,...] --out EDIR ...
       shuffle --out EDIR --drop A:B

Materialise, for each epoch, the windows a trainer would sample from the
dataset, in one shuffled order, into shard files read strictly in order:
EDIR/epoch-0003/shard-00000.NAME.npy [S, W*RATE, ...] (a per-clip
modality, convert's NAME@clip: [S, ...], each sample's clip value) and
shard-00000.samples.npy int64 [S, 3] (clip, start, valid; mixed epochs:
[S, 4], and source). A job of any world size reads an epoch (rank r takes
its slice of each global batch: python/clipshard). Same seed, same bytes,
whatever --mem or --workers.
Each epoch is committed atomically; a re-run skips finished epochs.

Example:
  shuffle --dataset /tmp/clipshard-demo --out /tmp/clipshard-demo-epochs \
    --window 15 --epochs 2 --shard-samples 16 --seed 7

Several datasets (--source, each NAME=DIR, sharing their modalities) mix
into each epoch: source s gives round(w_s * N) of the epoch's N samples
(--epoch-samples; default the sources' own counts added up), exactly, by
largest remainder; a source asked for more than it has is drawn again
(fresh offsets), one asked for fewer is subsampled; every stretch of the
order holds each source in its share. --weights may change per epoch
range (a curriculum): --weights 0:10@studio=1,wild=3 --weights 10:@studio=1,wild=1,
or --weights @FILE with one such value per line. A weight is a decimal
>= 0 (1, 0.25, 3e-1) of at most 64 digits with an exponent within ±64;
weights are compared by value (1 and 1.0 are one weight), and spaces
around names and weights are ignored. Without --weights each source
gives its own samples. The samples files then have a fourth
column, the source (epochs format version 3).

  shuffle --source studio=/data/studio --source wild=/data/wild \
    --weights studio=0.3,wild=0.7 --out /data/epochs --window 15 --epochs 4

Storage: N epochs take N times the dataset. Produce epoch e+1 while epoch e
trains and drop e-1 (--epoch-range E:E+1, then --drop E-1:E: the manifests
are rewritten without it, then its files removed), or replay one epoch in a
seeded shard order (docs/PYTHON.md). A re-run writes again an epoch whose
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
		sources         []string
		weights         []string
	)
	fs.Func("source", "a dataset to mix in, `NAME=DIR` (repeat; instead of --dataset)", func(v string) error {
		sources = append(sources, v)
		return nil
	})
	fs.Func("weights", "the sources' weights, `[A:B@]NAME=W,...` for epochs A..B-1 (A: on; repeat for a curriculum), or @FILE", func(v string) error {
		weights = append(weights, v)
		return nil
	})
	fs.Int64Var(&o.Mix.EpochSamples, "epoch-samples", 0, "samples of each mixed epoch (default: the sources' own counts added up)")
	fs.StringVar(&o.Dataset, "dataset", "", "dataset directory written by convert")
	fs.IntVar(&o.Version, "version", 0, "`N`: cut the epochs from version N of a dataset grown by convert --segments (a kept one; default: the current one)")
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
	if err := parseMix(&o, sources, weights); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 2
	}
	if worldSize != 0 {
		fmt.Fprintln(stderr, name+": --world-size is gone: an epoch is now one global order that any world size reads; give world_size to the reader (clipshard.Loader, docs/PYTHON.md)")
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
	if !given(fs, "window") {
		fmt.Fprintln(stderr, name+": --window W is required: the clip frames of a sample (the window the trainer reads, e.g. --window 15)")
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
		out := map[string]any{"dir": res.Dir, "up_to_date": res.UpToDate, "epochs_written": res.Done,
			"epochs_skipped": res.Skipped, "external": res.External, "bytes": res.Bytes, "quality": res.Quality,
			"planned_bytes": res.Planned, "seconds": res.Elapsed.Seconds(), "short_clips": res.ShortClips, "short": res.Short}
		if c := sourceCounts(res); c != nil {
			out["source_counts"] = c
		}
		if err := ui.WriteJSON(stdout, out); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
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
	if res.ShortClips > 0 {
		what := "left out (--short skip; --short pad keeps them, zeros past their frames: the samples' valid column)"
		if res.Short == "pad" {
			what = "padded with zeros past their frames (--short pad: the samples' valid column says how many are real)"
		}
		fmt.Fprintf(stdout, "  %d clips shorter than --window %d: %s\n", res.ShortClips, o.Sampling.Window, what)
	}
	if res.Manifest != nil && res.Manifest.Version == manifests.EpochsVersionMix {
		for _, e := range res.Done {
			x := res.Manifest.Entry(e)
			if x == nil {
				continue
			}
			var parts []string
			for _, src := range res.Manifest.Sources {
				if len(res.Manifest.Mix.Ranges) == 0 { // natural: each its own samples
					parts = append(parts, fmt.Sprintf("%s %d", src.Name, x.Counts[src.Name]))
				} else {
					parts = append(parts, fmt.Sprintf("%s %d (weight %s)", src.Name, x.Counts[src.Name], x.Weights[src.Name]))
				}
			}
			fmt.Fprintf(stdout, "  epoch %d: %s\n", e, strings.Join(parts, ", "))
		}
	}
	if res.Replaced > 0 {
		fmt.Fprintf(stdout, "  replaced %d stale epochs (the dataset changed since they were cut, or --force)\n", res.Replaced)
	}
	return 0
}

// parseMix fills o's sources and weights from the --source and --weights
// values (a --weights @FILE holds one value a line; # starts a comment).
func parseMix(o *shuffle.Options, sources, weights []string) error {
	var names []string
	for _, v := range sources {
		n, dir, ok := strings.Cut(v, "=")
		if !ok || n == "" || dir == "" {
			return fmt.Errorf("--source %q: want NAME=DIR", v)
		}
		o.Sources = append(o.Sources, shuffle.Source{Name: n, Dir: dir})
		names = append(names, n)
	}
	var specs []string
	for _, v := range weights {
		if path, ok := strings.CutPrefix(v, "@"); ok {
			b, err := regfile.ReadFile(path, 1<<20)
			if err != nil {
				return fmt.Errorf("--weights %s: %w", v, err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				line, _, _ = strings.Cut(line, "#")
				if line = strings.TrimSpace(line); line != "" {
					specs = append(specs, line)
				}
			}
			continue
		}
		specs = append(specs, v)
	}
	if len(specs) > 0 && len(sources) == 0 {
		return fmt.Errorf("--weights weighs --source datasets; give each as --source NAME=DIR")
	}
	for _, sp := range specs {
		r, err := manifests.ParseWeights(sp, names)
		if err != nil {
			return err
		}
		if !strings.Contains(sp, "@") && len(specs) > 1 {
			return fmt.Errorf("--weights %q: with several --weights, each needs its epochs (A:B@...)", sp)
		}
		o.Mix.Ranges = append(o.Mix.Ranges, r)
	}
	if len(weights) > 0 && len(specs) == 0 {
		return fmt.Errorf("--weights %s: no weights in it", strings.Join(weights, " "))
	}
	return nil
}

// sourceCounts is each written epoch's samples per source (a mixed run).
func sourceCounts(res *shuffle.Result) map[string]map[string]int64 {
	if res.Manifest == nil || res.Manifest.Version != manifests.EpochsVersionMix {
		return nil
	}
	out := map[string]map[string]int64{}
	for _, x := range res.Manifest.Epochs {
		out[fmt.Sprint(x.Epoch)] = x.Counts
	}
	return out
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
		if err := ui.WriteJSON(stdout, map[string]any{"dir": out, "dropped": dropped}); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		return 0
	}
	if len(dropped) == 0 {
		fmt.Fprintf(stdout, "nothing to drop: %s lists no epoch in %d:%d\n", out, ai, bi)
		return 0
	}
	fmt.Fprintf(stdout, "dropped epochs %v from %s\n", dropped, out)
	return 0
}

// given reports whether flag name was on the command line.
func given(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
