// Package inspectcmd is "clipshard inspect": what a dataset or an epochs
// folder holds, in text, JSON or a self-contained HTML page of plots. The
// figures are internal/inspect's; this package parses the flags and prints.
package inspectcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/inspect"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
)

const usage = `usage: inspect [--json | --html FILE [--force]] [--clip ID] [--stats] [--sample EPOCH:I] [--fps F] [--rows N] [--batch B] [--mem SIZE] DIR|s3://BUCKET/PREFIX

Show what DIR holds: a dataset written by convert (its dataset.json) or an
epochs folder written by shuffle (its epochs.json); or one pushed to a
bucket (s3://BUCKET/PREFIX: its manifests and headers fetched, the rows
sampled read by bounded ranged GETs, nothing else downloaded).
  dataset  clips, frames, hours at --fps; per modality dtype, frame shape,
           rate, bytes and the conversion's NaN/Inf/overflow/underflow
           counts and max |x|; the clip-length distribution with the
           longest and shortest clips; skipped and trimmed clips; the
           sources' size; value histograms from --rows rows per modality
           read evenly across its blob (the figures say how many)
  --clip   that clip's rows alone: per feature mean/std/min/max, NaN positions
  --stats  per modality, per feature mean/std/min/max over every row of
           every clip (one pass over the blobs, 8 MiB at a time), for
           normalisation; --json has every feature
  epochs   per epoch samples, shards and bytes, and its shuffle quality
           along the epoch (distinct clips per batch and same-clip
           neighbours, per tenth: a degraded tail shows), from the whole
           order if it fits --mem (24 bytes a sample), else from the
           start of each tenth (the figures say how many samples)
  --sample EPOCH:I  sample I of an epoch: its clip, start, valid frames and
           each modality's value statistics
--json prints the figures as JSON; --html FILE writes one self-contained
page (inline SVG, no scripts, no network) with the plots. FILE must not
exist, or be a page inspect wrote before (it is replaced); any other
file is refused, exit 2, and --force replaces only a regular file. A
path inside a dataset or an epochs folder is always refused.

Example:
  inspect /tmp/ds
  inspect --html /tmp/ds.html /tmp/ds

Flags:
`

const exitCodes = `
Exit status: 0 shown; 1 unreadable or damaged input (one line names the
file); 2 usage error, or DIR is not a dataset or epochs folder (as verify).
`

// Run runs the command as name ("clipshard inspect").
func Run(name string, args []string, stdout, stderr io.Writer) (code int) {
	defer ui.Recover(stderr, name, &code)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	jsonOut := fs.Bool("json", false, "print the figures as JSON")
	html := fs.String("html", "", "write a self-contained HTML page of plots to `FILE`: a new path, or a page inspect wrote before (anything else is refused)")
	force := fs.Bool("force", false, "with --html: replace FILE even if it is not a page inspect wrote (a regular file outside any dataset or epochs folder; never a device, FIFO, directory or symlink)")
	clip := fs.String("clip", "", "a dataset's clip `ID`: its rows' statistics")
	stats := fs.Bool("stats", false, "a dataset's per-feature mean, std, min and max over every row (one pass over the blobs: for normalisation)")
	sample := fs.String("sample", "", "an epochs folder's sample `EPOCH:I`: its clip, window and values")
	fps := fs.Float64("fps", 25, "clip frames per second, for hours")
	rows := fs.Int("rows", 65536, "rows read per modality for the value histograms (evenly across the blob; fewer for rows so wide that they would hold more than 4M values)")
	batch := fs.Int("batch", 256, "batch size of the shuffle-quality figures")
	memFlag := fs.String("mem", "256MiB", "memory for an epoch's order (24 bytes a sample): a larger epoch is measured on a stretch of each tenth, a `SIZE` such as 1GiB")
	if done, code := ui.Parse(fs, args, stdout, stderr, ui.Named(usage, "inspect", name), ui.Named(exitCodes, "inspect", name), true); done {
		return code
	}
	if fs.NArg() != 1 || *rows < 1 || !(*fps > 0) || math.IsInf(*fps, 0) || *batch < 1 || (*jsonOut && *html != "") {
		fmt.Fprintf(stderr, "%s: want one DIR (and --rows >= 1, a finite --fps > 0, --batch >= 1, not both --json and --html; see --help)\n", name)
		return 2
	}
	mem, err := ui.ParseSize(*memFlag)
	if err != nil || mem < 1<<10 {
		fmt.Fprintf(stderr, "%s: --mem %q: want a size of at least 1KiB\n", name, *memFlag)
		return 2
	}
	dir := fs.Arg(0)
	if *force && *html == "" {
		return usageErr(stderr, name, "--force is for --html")
	}
	if *html != "" {
		if err := checkHTML(*html, *force); err != nil {
			return usageErr(stderr, name, "%s", err)
		}
	}
	open, shown := inspect.LocalOpen, dir
	var mirror *manifests.Mirror
	if bucket.IsURL(dir) {
		// A bucket folder (clipshard push): its manifests and headers
		// mirrored, its data read by bounded ranged GETs as it is sampled.
		u, err := bucket.Parse(dir)
		if err != nil {
			return usageErr(stderr, name, "%s", err)
		}
		c, err := bucket.New()
		if err != nil {
			ui.Fail(stderr, name, err)
			return 2
		}
		if mirror, err = manifests.MirrorBucket(context.Background(), c, u); err != nil {
			ui.Fail(stderr, name, err)
			return 1
		}
		defer mirror.Close()
		dir, open = mirror.Dir, inspect.BucketOpen(c, mirror)
	}
	var rep any
	switch {
	case exists(filepath.Join(dir, "dataset.json")):
		if *sample != "" {
			return usageErr(stderr, name, "--sample is for an epochs folder; %s is a dataset", shown)
		}
		rep, err = inspect.Dataset(dir, *clip, *fps, *rows, *stats, open)
		if r, ok := rep.(*inspect.DatasetReport); ok && r != nil {
			r.Dir = shown
		}
	case exists(filepath.Join(dir, "epochs.json")):
		if *clip != "" || *stats {
			return usageErr(stderr, name, "--clip and --stats are for a dataset; %s is an epochs folder", shown)
		}
		rep, err = inspect.Epochs(dir, *sample, *batch, mem, open)
		if r, ok := rep.(*inspect.EpochsReport); ok && r != nil {
			r.Dir = shown
		}
	default:
		// As verify: a path that is not a clipshard folder is a usage error.
		if st, err := os.Stat(dir); err != nil {
			fmt.Fprintf(stderr, "%s: %s does not exist (or cannot be read: %v)\n", name, shown, errors.Unwrap(err))
		} else if !st.IsDir() {
			fmt.Fprintf(stderr, "%s: %s is not a directory: give a dataset or epochs folder\n", name, shown)
		} else {
			fmt.Fprintf(stderr, "%s: %s: neither a dataset (no dataset.json) nor an epochs folder (no epochs.json)\n", name, shown)
		}
		return 2
	}
	if err != nil && mirror != nil {
		err = errors.New(strings.ReplaceAll(err.Error(), mirror.Dir, shown)) // name the objects, not the mirror
	}
	if err != nil {
		var u inspect.UsageError
		if errors.As(err, &u) {
			return usageErr(stderr, name, "%s", u.Msg)
		}
		ui.Fail(stderr, name, err)
		return 1
	}
	switch {
	case *jsonOut:
		if err := ui.WriteJSON(stdout, rep); err != nil {
			ui.Fail(stderr, name, err)
			return 1
		}
	case *html != "":
		if err := writeHTML(*html, rep, *force); err != nil {
			if errors.Is(err, atomicfile.ErrRefused) {
				return usageErr(stderr, name, "%s", err)
			}
			ui.Fail(stderr, name, err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote %s\n", *html)
	default:
		w := &ui.ErrWriter{W: stdout}
		printText(ui.SafeWriter{W: w}, rep)
		if w.Err != nil {
			ui.Fail(stderr, name, fmt.Errorf("writing the output: %w", w.Err))
			return 1
		}
	}
	return 0
}

func usageErr(stderr io.Writer, name, format string, a ...any) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, fmt.Sprintf(format, a...))
	return 2
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
