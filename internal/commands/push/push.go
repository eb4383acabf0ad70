// Package pushcmd is "clipshard push DIR s3://BUCKET/PREFIX": a dataset
// or an epochs folder uploaded to an S3-compatible bucket (transform/push).
package pushcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/transform/push"
)

const usage = `usage: push [--force] [--objects N] [--parts N] [--part-size SIZE] [--json] [--quiet] DIR s3://BUCKET/PREFIX

Upload a dataset (convert's) or an epochs folder (shuffle's) to an
S3-compatible bucket, as the same files under the same names (so that
"aws s3 sync" and verify's checks carry over): data objects first
(multipart, parallel parts), each hashed as it is read and made only if
its bytes are those SHA256SUMS records, then the manifests; the commit is
the last write (dataset.json create-only; epochs.json by compare-and-swap,
so that array tasks pushing their epochs into one prefix lose none). The
first write claims the prefix (CLAIM, create-only): a push of other
content into it, at once or later, is refused before it writes anything.
A killed push is resumed by running it again: objects there whose bytes
are proven the file's (an ETag a push checked, or the file's own) are not
sent again. A prefix holding another dataset, epochs cut with other
options, or another content's claim, is refused (--force replaces it); an
object no clipshard push wrote, at any name, always is.

A dataset in segments and versions (convert --segments) is pushed with
every version it keeps; into a prefix holding one of those versions it
sends only what that version lacks (a new segment, the new version's
manifests), and commits by compare-and-swap on the version it found
(fast-forward only: a prefix holding a later or another version is
refused without --force). Readers of the older version read on.

Credentials and endpoint the standard way: AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), or AWS_PROFILE in
~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE), or an instance role;
AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) for an S3-compatible server,
AWS_REGION (default us-east-1). No checksum headers are sent beyond the
signed payload (some servers refuse them). Memory: about
objects x parts x part-size (2 x 4 x 16 MiB).

Example:
  push /data/ds s3://training/datasets/motion-v1
  push /data/epochs s3://training/epochs/motion-v1-w15

Flags:
`

const exitCodes = `
Exit status: 0 pushed or up to date; 1 failure (one line names the file or
object); 2 usage error (including a prefix holding another dataset).
`

// Run runs the command as name ("clipshard push").
func Run(name string, args []string, stdout, stderr io.Writer) (code int) {
	defer ui.Recover(stderr, name, &code)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var o push.Options
	fs.BoolVar(&o.Force, "force", false, "replace another dataset, or epochs cut with other options, at the prefix")
	fs.IntVar(&o.Objects, "objects", 2, "objects uploaded at once")
	fs.IntVar(&o.Parts, "parts", 4, "parts of an object in flight at once")
	partSize := fs.String("part-size", "16MiB", "multipart part `SIZE` (at least 5MiB)")
	jsonOut := fs.Bool("json", false, "print the summary as JSON")
	quiet := fs.Bool("quiet", false, "no progress")
	if done, code := ui.Parse(fs, args, stdout, stderr, ui.Named(usage, "push", name), ui.Named(exitCodes, "push", name), true); done {
		return code
	}
	if fs.NArg() != 2 {
		fmt.Fprintf(stderr, "%s: want DIR and s3://BUCKET/PREFIX (see --help)\n", name)
		return 2
	}
	ps, err := ui.ParseSize(*partSize)
	if err != nil || ps < 5<<20 || ps > 5<<30 {
		fmt.Fprintf(stderr, "%s: --part-size %q: want a size from 5MiB to 5GiB\n", name, *partSize)
		return 2
	}
	if o.Objects < 1 || o.Parts < 1 || o.Objects > 64 || o.Parts > 64 {
		fmt.Fprintf(stderr, "%s: --objects and --parts: want 1..64\n", name)
		return 2
	}
	o.PartSize, o.Dir = ps, fs.Arg(0)
	if o.Dest, err = bucket.Parse(fs.Arg(1)); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	if o.Client, err = bucket.New(); err != nil {
		ui.Fail(stderr, name, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var bar *ui.Progress
	o.Progress = func(done, total int64) {
		if bar == nil {
			bar = ui.New(name, "MB", total>>20, *quiet)
		}
		bar.Update(done>>20, nil)
	}
	res, err := push.Run(ctx, o)
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		err = ui.Interrupted(ctx, err, "a re-run resumes")
		if errors.Is(err, push.ErrUsage) {
			ui.Fail(stderr, name, err)
			return 2
		}
		ui.Fail(stderr, name, err)
		return 1
	}
	if *jsonOut {
		if err := ui.WriteJSON(stdout, map[string]any{"kind": res.Kind, "dir": o.Dir, "dest": res.Dest, "objects": res.Objects,
			"sent": res.Sent, "bytes_sent": res.Bytes, "up_to_date": res.UpToDate, "epochs": res.Epochs, "seconds": res.Elapsed.Seconds()}); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		return 0
	}
	if res.UpToDate {
		fmt.Fprintf(stdout, "up to date: %s holds %s (%d objects, each proven intact: its size, its sha256, and a version whose bytes a push checked)\n", res.Dest, o.Dir, res.Objects)
		return 0
	}
	others := ""
	if res.Sent < res.Objects {
		others = "; the others were there, proven intact"
	}
	fmt.Fprintf(stdout, "pushed %s %s to %s in %.1fs: %d of %d objects sent (%s)%s\n",
		res.Kind, o.Dir, res.Dest, res.Elapsed.Seconds(), min(res.Sent, res.Objects), res.Objects, ui.Bytes(res.Bytes), others)
	if res.Kind == "epochs" {
		fmt.Fprintf(stdout, "  the bucket lists epochs %v\n", res.Epochs)
	}
	return 0
}
