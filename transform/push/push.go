// Package push uploads a dataset or an epochs folder to an S3-compatible
// bucket (clipshard push DIR s3://BUCKET/PREFIX) as the same files under
// the same names: data objects first (multipart, parallel parts, bounded
// memory), manifests last, the manifest write being the commit.
//
//   - A dataset's commit is dataset.json, written create-only
//     (If-None-Match: *): a prefix holding another dataset is refused
//     (--force first removes its dataset.json, then replaces it).
//   - An epochs folder's commit is epochs.json, by compare-and-swap
//     (If-Match on the ETag read): array tasks pushing their epochs into
//     one prefix each merge theirs into what is there, and none is lost.
//     Before it, SHA256SUMS is extended the same way (entries are only
//     added, so a reader of a committed epoch always finds its files'
//     hashes); after it, shards.parquet and SHA256SUMS's lines for the
//     manifests are rewritten from the epochs.json then committed, until
//     it stays the same (the last pusher leaves them consistent).
//
// Before the manifests, push writes BLOCKSUMS beside the data files (a
// dataset's blobs; each epoch's shard files): the sha256 of each block of
// each file, so that a reader fetching a byte range checks what it
// fetches (docs/FORMAT.md).
//
// Every object carries its sha256 (x-amz-meta-sha256), the one its
// folder's SHA256SUMS records; the bytes uploaded are hashed as they are
// read and an object whose hash is not the recorded one is removed and
// the push fails. A push killed at any point is resumed by running it
// again: objects already there with the recorded size and sha256 are not
// sent again.
package push

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// ErrUsage marks the caller's mistake (exit 2): a prefix holding another
// dataset or other epochs, a folder that is neither.
var ErrUsage = errors.New("push: usage")

// Options of a push.
type Options struct {
	Dir    string
	Dest   bucket.URL
	Client *bucket.Client
	// Objects uploaded at once, and parts of each in flight, of PartSize
	// bytes: memory is about Objects x Parts x PartSize (2 x 4 x 16 MiB).
	Objects, Parts int
	PartSize       int64
	// Force replaces another dataset or other epochs at Dest.
	Force bool
	// Progress, if not nil, is called with the bytes sent and to send.
	Progress func(done, total int64)

	// takeover is the identity of a claim this push takes without
	// --force: that of the version committed at Dest, which this push
	// of a later version of the same dataset fast-forwards.
	takeover string
}

// Result of a push.
type Result struct {
	Kind     string // "dataset" or "epochs"
	Dest     string
	Objects  int   // objects of the folder
	Sent     int   // objects uploaded (the others were there, intact)
	Bytes    int64 // bytes uploaded
	UpToDate bool  // nothing was uploaded or rewritten
	Epochs   []int // an epochs folder's epochs now listed in the bucket
	Elapsed  time.Duration
}

// Run pushes o.Dir to o.Dest.
func Run(ctx context.Context, o Options) (*Result, error) {
	began := time.Now()
	if o.Objects <= 0 {
		o.Objects = 2
	}
	if o.Parts <= 0 {
		o.Parts = 4
	}
	if o.PartSize <= 0 {
		o.PartSize = 16 << 20
	}
	o.PartSize = max(o.PartSize, 5<<20) // S3's smallest part
	var r *Result
	var err error
	switch {
	case exists(filepath.Join(o.Dir, manifests.DatasetFile)):
		r, err = pushDataset(ctx, o)
	case exists(filepath.Join(o.Dir, manifests.EpochsFile)):
		r, err = pushEpochs(ctx, o)
	default:
		return nil, fmt.Errorf("%w: %s: neither a dataset (no dataset.json) nor an epochs folder (no epochs.json)", ErrUsage, o.Dir)
	}
	if r != nil {
		r.Dest, r.Elapsed = o.Dest.String(), time.Since(began)
	}
	return r, err
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// object is one file to upload: its path relative to the folder, its
// size and recorded sha256, and the block sums it is listed in.
type object struct {
	rel   string
	size  int64
	sha   string
	group *blockGroup
}

// -- dataset ----------------------------------------------------------------

func pushDataset(ctx context.Context, o Options) (*Result, error) {
	d, _, err := manifests.Vouch(o.Dir) // the folder's structure and its manifests' sums
	if err != nil {
		return nil, err
	}
	if d.Segmented() {
		return pushSegmented(ctx, o, d)
	}
	sums, err := manifests.ReadSums(filepath.Join(o.Dir, d.Files.Sums))
	if err != nil {
		return nil, err
	}
	local, err := readChecked(o.Dir, manifests.DatasetFile, sums[manifests.DatasetFile])
	if err != nil {
		return nil, err
	}
	res := &Result{Kind: "dataset"}
	// What the bucket holds there: this dataset (resume, or up to date),
	// another (refused, or --force), or none.
	remote, _, err := o.Client.ReadAll(ctx, o.Dest, manifests.DatasetFile, manifests.MaxManifest)
	switch {
	case err == nil && bytes.Equal(remote, local):
	case err == nil && !o.Force:
		if err := later(ctx, o, remote, local, 1); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %s holds another dataset (its dataset.json differs from %s's): use --force to replace it, or another prefix",
			ErrUsage, o.Dest, o.Dir)
	case err != nil && !errors.Is(err, bucket.ErrNotFound):
		return nil, err
	}
	committed := err == nil && bytes.Equal(remote, local)
	replace := err == nil && !committed
	own := d.OwnFiles()
	var names []string
	for rel := range own {
		if d.Modality(modalityOf(d, rel)) == nil {
			names = append(names, rel)
		}
	}
	claimETag, err := takePrefix(ctx, &o, names, func(rel string) bool {
		return own[rel] || rel == manifests.DatasetFile || rel == manifests.BlockSumsFile || rel == manifests.ClaimFile
	}, local, replace, res)
	if err != nil {
		return nil, err
	}
	var data, small []string
	for rel := range own {
		switch {
		case rel == manifests.DatasetFile:
		case d.Modality(modalityOf(d, rel)) != nil:
			data = append(data, rel)
		default:
			small = append(small, rel)
		}
	}
	sort.Strings(data)
	sort.Strings(small)
	objs, err := files(o.Dir, data, sums)
	if err != nil {
		return nil, err
	}
	res.Objects = len(own) + 2 // (and BLOCKSUMS, CLAIM)
	proofs, err := sendData(ctx, o, objs, []*blockGroup{groupOf(ctx, o, manifests.BlockSumsFile, objs)}, res)
	if err != nil {
		return res, err
	}
	// The other manifests (SHA256SUMS lists the blobs: after them), each
	// left only if the bucket holds its very bytes, then the commit.
	err = putManifests(ctx, o, small, func(rel string) string {
		if rel == d.Files.Sums {
			return ""
		}
		return sums[rel]
	}, proofs, res)
	if err != nil || committed {
		res.UpToDate = err == nil && res.Sent == 0
		return res, err
	}
	return res, commitDataset(ctx, o, local, bucket.CreateOnly, proofs, claimETag, res, func([]byte) error {
		return fmt.Errorf("%w: another push committed another dataset at %s meanwhile", ErrUsage, o.Dest)
	})
}

// takePrefix readies the prefix for a push of the dataset whose
// dataset.json is local: the manifests it rewrites (rels) and CLAIM not
// the user's (oursAll), nothing there but what allowed accepts and other
// pushes left (survey), the claim taken before any other write (a push
// of another dataset is refused before it overwrites anything), with
// replace the other dataset uncommitted (no dataset.json ever names
// objects of two builds), and what other pushes left removed (--force).
// It returns the claim's ETag.
func takePrefix(ctx context.Context, o *Options, rels []string, allowed func(string) bool, local []byte, replace bool, res *Result) (string, error) {
	if err := oursAll(ctx, *o, append(slices.Clone(rels), manifests.ClaimFile)...); err != nil {
		return "", err
	}
	stale, err := survey(ctx, *o, "dataset", allowed, nil)
	if err != nil {
		return "", err
	}
	claimETag, _, err := claim(ctx, o, manifests.DatasetClaim(local), res)
	if err != nil {
		return "", err
	}
	if replace {
		faults.Point("push.uncommit")
		if err := o.Client.Remove(ctx, o.Dest, manifests.DatasetFile); err != nil {
			return "", err
		}
	}
	return claimETag, removeStale(ctx, *o, stale)
}

// sendData uploads objs (those the bucket does not hold, proven) and
// writes their groups' BLOCKSUMS, counting them in res; it returns the
// objects sent or proved, with their ETags.
func sendData(ctx context.Context, o Options, objs []object, groups []*blockGroup, res *Result) (map[string]bucket.Object, error) {
	n, b, err := upload(ctx, o, objs)
	res.Sent, res.Bytes = res.Sent+n, res.Bytes+b
	if err != nil {
		return nil, err
	}
	proofs := map[string]bucket.Object{}
	proofsOf(groups, proofs)
	n, b, err = writeBlockSums(ctx, o, groups, proofs)
	res.Sent, res.Bytes = res.Sent+n, res.Bytes+b
	return proofs, err
}

// putManifests writes each small file of rels (checked against want(rel),
// its recorded sha256; "" none) unless the bucket holds its very bytes,
// recording it in proofs and counting it in res.
func putManifests(ctx context.Context, o Options, rels []string, want func(string) string, proofs map[string]bucket.Object, res *Result) error {
	for _, rel := range rels {
		b, err := readChecked(o.Dir, rel, want(rel))
		if err != nil {
			return err
		}
		if now, etag, err := o.Client.ReadAll(ctx, o.Dest, rel, manifests.MaxManifest); err == nil && bytes.Equal(now, b) {
			proofs[rel] = bucket.Object{Size: int64(len(b)), ETag: etag}
			continue
		}
		faults.Point("push.manifest")
		etag, err := o.Client.PutBytes(ctx, o.Dest, rel, b, hashOf(b), "")
		if err != nil {
			return err
		}
		proofs[rel] = bucket.Object{Size: int64(len(b)), ETag: etag}
		res.Sent++
		res.Bytes += int64(len(b))
	}
	return nil
}

// commitDataset checks that the prefix still holds what this push wrote
// or proved (stillOurs), then writes dataset.json (local) under cond, the
// commit. A precondition that fails is a commit of the same bytes
// meanwhile (another push of this dataset: done), or of others: then
// other(the bytes there now, nil if unreadable) is the error.
func commitDataset(ctx context.Context, o Options, local []byte, cond bucket.Cond, proofs map[string]bucket.Object, claimETag string, res *Result, other func(now []byte) error) error {
	if err := stillOurs(ctx, o, []string{""}, proofs, claimETag); err != nil {
		return err
	}
	faults.Point("push.commit")
	_, err := o.Client.PutBytes(ctx, o.Dest, manifests.DatasetFile, local, hashOf(local), cond)
	if errors.Is(err, bucket.ErrPrecondition) {
		now, _, rerr := o.Client.ReadAll(ctx, o.Dest, manifests.DatasetFile, manifests.MaxManifest)
		if rerr == nil && bytes.Equal(now, local) {
			err = nil
		} else {
			err = other(now)
		}
	}
	if err != nil {
		return err
	}
	res.Sent++
	res.Bytes += int64(len(local))
	return nil
}

// modalityOf is the name of the modality whose blob rel is ("" if none).
func modalityOf(d *manifests.Dataset, rel string) string {
	for _, m := range d.Modalities {
		if m.File == rel {
			return m.Name
		}
	}
	return ""
}
