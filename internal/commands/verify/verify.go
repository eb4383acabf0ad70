// Package verifycmd is the verify command (cmd/verify, and clipshard
// verify): it checks that a clipshard dataset or epochs directory is
// intact and, optionally, equal to its sources. Run "clipshard verify
// --help" for the flags.
package verifycmd

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
)

const usage = `usage: verify [--deep] [--sources] [--json] [--quiet] DIR|s3://BUCKET/PREFIX

Check a dataset directory written by convert (found by its dataset.json):
  default    files present and no others, .npy headers and sizes against
             dataset.json, index.npy, clips.parquet and dataset.json agree,
             offsets contiguous, and the sha256 of every file (SHA256SUMS)
  --deep     also the xxHash64 of every clip of every blob (names the clip)
  --sources  also re-decode every source and compare it, converted, with
             the clip's rows in the blob; reports sources changed since
             conversion and content drift, by clip
or an epochs directory written by shuffle (found by its epochs.json):
  default    files present and no others, shard headers, the shards tiling
             each epoch in order, and the sha256 of every file; an epoch
             a running shuffle is writing is reported as in progress
  --deep     also re-derive every epoch's samples from the seed and check
             every sample's windows against the dataset

or one pushed to a bucket (clipshard push; s3://BUCKET/PREFIX): the
default level, its manifests and headers read by bounded ranged GETs and
every object's sha256 streamed (nothing stored); credentials and endpoint
as for push (AWS_* variables, ~/.aws/credentials).

Example:
  verify --deep /tmp/clipshard-demo
  verify s3://training/datasets/motion-v1

Flags:
`

const exitCodes = `
Exit status: 0 intact; 1 problems found (each printed: file, clip, what);
2 usage error or unreadable manifest.
`

// Run runs the command with args (without the program's name) as name
// ("verify", or "clipshard verify"), and returns its exit status.
func Run(name string, args []string, stdout, stderr io.Writer) (code int) {
	defer ui.Recover(stderr, name, &code)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var o manifests.VerifyOptions
	var jsonOut, quiet bool
	fs.BoolVar(&o.Deep, "deep", false, "check every clip's xxHash64")
	fs.BoolVar(&o.Sources, "sources", false, "re-decode the sources and compare")
	fs.IntVar(&o.Workers, "workers", 2, "files hashed at once")
	mem := fs.String("mem", "256MiB", "memory for --sources, a `SIZE` such as 256MiB: a .npy source larger than an eighth of it is compared a piece at a time (a pickle is decoded whole)")
	fs.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	fs.BoolVar(&quiet, "quiet", false, "no progress on stderr")
	if done, code := ui.Parse(fs, args, stdout, stderr, ui.Named(usage, "verify", name), ui.Named(exitCodes, "verify", name), true); done {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, name+": want exactly one directory (see --help)")
		return 2
	}
	var err error
	if o.Mem, err = ui.ParseSize(*mem); err != nil || o.Mem < 1<<20 {
		fmt.Fprintf(stderr, "%s: --mem: %v\n", name, cmp.Or(err, fmt.Errorf("%s: want at least 1MiB", *mem)))
		return 2
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(o.Mem + 48<<20) // with the program's text and stacks: under --mem + 64 MiB
	}
	dir := fs.Arg(0)
	var r *manifests.Report
	if bucket.IsURL(dir) {
		u, err := bucket.Parse(dir)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 2
		}
		c, err := bucket.New()
		if err != nil {
			ui.Fail(stderr, name, err)
			return 2
		}
		o.Progress = progress(name, quiet)
		if r, err = manifests.VerifyBucket(context.Background(), c, u, o); err != nil {
			ui.Fail(stderr, name, err)
			return 2
		}
		return report(name, dir, r, jsonOut, stdout, stderr)
	}
	if st, err := os.Stat(dir); err != nil {
		fmt.Fprintf(stderr, "%s: %s does not exist (or cannot be read: %v)\n", name, dir, errors.Unwrap(err))
		return 2
	} else if !st.IsDir() {
		fmt.Fprintf(stderr, "%s: %s is not a directory: give a dataset or epochs directory\n", name, dir)
		return 2
	}
	verify := manifests.VerifyDataset
	if _, err := os.Stat(filepath.Join(dir, manifests.DatasetFile)); err != nil {
		if _, eerr := os.Stat(filepath.Join(dir, manifests.EpochsFile)); eerr != nil {
			fmt.Fprintf(stderr, "%s: %s: no dataset.json or epochs.json: not a clipshard directory (or an unfinished one)\n", name, dir)
			return 2
		}
		if o.Sources {
			fmt.Fprintln(stderr, name+": --sources applies to datasets; for epochs use --deep (checks every sample against the dataset)")
			return 2
		}
		verify = manifests.VerifyEpochs
	}
	o.Progress = progress(name, quiet)
	r, err = verify(dir, o)
	if err != nil {
		ui.Fail(stderr, name, err)
		return 2
	}
	return report(name, dir, r, jsonOut, stdout, stderr)
}

// progress draws the bytes hashed (a bar on a terminal).
func progress(name string, quiet bool) func(done, total int64) {
	var bar *ui.Progress
	return func(done, total int64) {
		if bar == nil {
			bar = ui.New(name, "MB", total>>20, quiet)
		}
		bar.Update(done>>20, nil)
		if done == total {
			bar.Finish()
		}
	}
}

// report prints r and returns the exit status.
func report(name, dir string, r *manifests.Report, jsonOut bool, stdout, stderr io.Writer) int {
	if jsonOut {
		if r.Problems == nil {
			r.Problems = []manifests.Problem{}
		}
		if err := ui.WriteJSON(stdout, r); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 2
		}
	} else {
		for _, p := range r.Problems {
			fmt.Fprintln(stdout, ui.OneLine(p.String()))
		}
		for _, p := range r.InProgress {
			fmt.Fprintf(stdout, "%s: in progress (a shuffle is writing it; not checked)\n", ui.OneLine(p))
		}
		if r.OK() {
			what := ui.Count(int64(r.Clips), "clip")
			if r.Kind == "epochs" {
				what = ui.Count(r.Samples, "sample")
			}
			fmt.Fprintf(stdout, "ok: %s intact (%s; %d files, %s hashed, %s)\n", dir, r.Level, r.Files, ui.Bytes(r.Bytes), what)
		} else {
			fmt.Fprintf(stdout, "%s in %s (%s)\n", ui.Count(int64(len(r.Problems)), "problem"), dir, r.Level)
		}
	}
	if !r.OK() {
		return 1
	}
	return 0
}
