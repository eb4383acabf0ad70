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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
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

// blockGroup is a BLOCKSUMS file push writes (a dataset's blobs, or an
// epoch's shard files): its name, block size, and the digests of its
// files as they are hashed.
type blockGroup struct {
	rel   string
	block int64
	have  *manifests.BlockSums // the bucket's, if any: the digests of objects not sent again
	mu    sync.Mutex
	files []manifests.BlockFile
}

// groupOf makes the block group rel of these objects (its block size
// from their bytes) and points them at it.
func groupOf(ctx context.Context, o Options, rel string, objs []object) *blockGroup {
	var total int64
	for _, x := range objs {
		total += x.size
	}
	g := &blockGroup{rel: rel, block: manifests.BlockSizeFor(total)}
	if b, _, err := o.Client.ReadAll(ctx, o.Dest, rel, manifests.MaxManifest+manifests.MaxBlockDigests); err == nil {
		if s, err := manifests.ParseBlockSums(b, o.Dest.Name(rel)); err == nil && s.Block == g.block {
			g.have = s
		}
	}
	for i := range objs {
		objs[i].group = g
	}
	return g
}

func (g *blockGroup) add(f manifests.BlockFile) {
	g.mu.Lock()
	g.files = append(g.files, f)
	g.mu.Unlock()
}

// digests of object x, not sent again: the bucket's block sums if they
// list this very file, else hashed from the folder's file.
func (g *blockGroup) digests(o Options, x object) error {
	if g.have != nil {
		if f := g.have.File(x.rel); f != nil && f.Size == x.size && f.SHA256 == x.sha {
			g.add(*f)
			return nil
		}
	}
	p := filepath.Join(o.Dir, filepath.FromSlash(x.rel))
	f, _, err := regfile.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h, bh := sha256.New(), manifests.NewBlockHasher(g.block)
	n, err := io.Copy(io.MultiWriter(h, bh), io.LimitReader(f, x.size+1))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != x.sha || n != x.size {
		return fmt.Errorf("%s: its bytes (sha256 %s, %d bytes) are not those SHA256SUMS records (%s): damaged or changed (verify %s)", p, got, n, x.sha, o.Dir)
	}
	g.add(manifests.BlockFile{Name: x.rel, Size: x.size, SHA256: x.sha, Head: bh.Head(), Digests: bh.Digests()})
	return nil
}

// writeBlockSums writes each group's BLOCKSUMS (after its files, before
// the manifests that commit them) unless the bucket holds it already,
// and returns how many it wrote and their bytes.
func writeBlockSums(ctx context.Context, o Options, groups []*blockGroup) (int, int64, error) {
	var sent int
	var size int64
	for _, g := range groups {
		sort.Slice(g.files, func(a, b int) bool { return g.files[a].Name < g.files[b].Name })
		b, err := (&manifests.BlockSums{Block: g.block, Files: g.files}).Marshal()
		if err != nil {
			return sent, size, err
		}
		sum := hashOf(b)
		st, err := o.Client.Stat(ctx, o.Dest, g.rel)
		if err == nil && st.Size == int64(len(b)) && st.SHA256 == sum {
			continue
		}
		if err == nil {
			err = ours(o, g.rel, st)
		}
		if err != nil && !errors.Is(err, bucket.ErrNotFound) {
			return sent, size, err
		}
		faults.Point("push.blocksums")
		if _, err := o.Client.PutBytes(ctx, o.Dest, g.rel, b, sum, ""); err != nil {
			return sent, size, err
		}
		sent++
		size += int64(len(b))
	}
	return sent, size, nil
}

// files lists rels with their sizes and recorded sums (a file SHA256SUMS
// does not list is an error: push sends only what it can check).
func files(dir string, rels []string, sums map[string]string) ([]object, error) {
	var out []object
	for _, rel := range rels {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: not a regular file", filepath.Join(dir, rel))
		}
		if sums[rel] == "" {
			return nil, fmt.Errorf("%s: not listed in SHA256SUMS", filepath.Join(dir, rel))
		}
		out = append(out, object{rel: rel, size: fi.Size(), sha: sums[rel]})
	}
	return out, nil
}

// upload sends every object not already at dest with its size and
// sha256, o.Objects at once, and returns how many it sent and the bytes.
func upload(ctx context.Context, o Options, objs []object) (int, int64, error) {
	var total int64
	for _, x := range objs {
		total += x.size
	}
	var mu sync.Mutex
	var sent int
	var bytesSent, done int64
	report := func(n int64) {
		mu.Lock()
		done += n
		if o.Progress != nil {
			o.Progress(done, total)
		}
		mu.Unlock()
	}
	sem := make(chan struct{}, o.Objects)
	errs := make(chan error, len(objs))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, x := range objs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := o.Client.Stat(cctx, o.Dest, x.rel)
			if err == nil && st.Size == x.size && st.SHA256 == x.sha {
				if err := x.group.digests(o, x); err != nil {
					errs <- err
					cancel()
					return
				}
				report(x.size) // there, intact: not sent again
				return
			}
			if err == nil {
				err = ours(o, x.rel, st)
			}
			if err != nil && !errors.Is(err, bucket.ErrNotFound) {
				errs <- err
				cancel()
				return
			}
			if err := send(cctx, o, x, report); err != nil {
				errs <- err
				cancel()
				return
			}
			mu.Lock()
			sent++
			bytesSent += x.size
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return sent, bytesSent, err
	}
	return sent, bytesSent, ctx.Err()
}

// ours refuses to replace an object that no clipshard push wrote (it
// has no x-amz-meta-sha256): the user's own, at a name of the folder's;
// --force replaces it.
func ours(o Options, rel string, st bucket.Object) error {
	if st.SHA256 == "" && !o.Force {
		return fmt.Errorf("%w: %s exists and no clipshard push wrote it (no x-amz-meta-sha256): refusing to replace it; give another prefix, or --force", ErrUsage, o.Dest.Name(rel))
	}
	return nil
}

// oursAll checks, with ours, the objects at these names (the manifests a
// push rewrites).
func oursAll(ctx context.Context, o Options, rels ...string) error {
	for _, rel := range rels {
		st, err := o.Client.Stat(ctx, o.Dest, rel)
		if errors.Is(err, bucket.ErrNotFound) {
			continue
		}
		if err == nil {
			err = ours(o, rel, st)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// send uploads one object, hashing its bytes as they are read; an object
// whose bytes are not the recorded ones is removed.
func send(ctx context.Context, o Options, x object, report func(int64)) error {
	p := filepath.Join(o.Dir, filepath.FromSlash(x.rel))
	f, fi, err := regfile.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi.Size() != x.size {
		return fmt.Errorf("%s: %d bytes, %d a moment ago (changed while it was pushed)", p, fi.Size(), x.size)
	}
	o.Client.AbortUploads(ctx, o.Dest, x.rel) // the parts of a killed push, if any
	h, bh := sha256.New(), manifests.NewBlockHasher(x.group.block)
	r := &counting{r: io.TeeReader(io.LimitReader(f, x.size), io.MultiWriter(h, bh)), report: report}
	faults.Point("push.object")
	err = o.Client.PutStream(ctx, o.Dest, x.rel, r, x.size, x.sha, uint64(o.PartSize), uint(o.Parts))
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != x.sha || r.n != x.size {
		o.Client.Remove(context.Background(), o.Dest, x.rel)
		return fmt.Errorf("%s: its bytes (sha256 %s, %d bytes) are not those SHA256SUMS records (%s): damaged or changed while pushed; the object was removed (verify %s)",
			p, got, r.n, x.sha, o.Dir)
	}
	x.group.add(manifests.BlockFile{Name: x.rel, Size: x.size, SHA256: x.sha, Head: bh.Head(), Digests: bh.Digests()})
	return nil
}

type counting struct {
	r      io.Reader
	n      int64
	report func(int64)
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if (c.n+int64(n))/(4<<20) != c.n/(4<<20) {
		faults.Point("push.part") // every 4 MiB read: a kill in the middle of an object
	}
	c.n += int64(n)
	if n > 0 {
		c.report(int64(n))
	}
	return n, err
}

// readChecked reads a small local file whose sha256 must be sum.
func readChecked(dir, rel, sum string) ([]byte, error) {
	p := filepath.Join(dir, filepath.FromSlash(rel))
	b, err := regfile.ReadFile(p, manifests.MaxManifest)
	if err != nil {
		return nil, err
	}
	if sum != "" && hashOf(b) != sum {
		return nil, fmt.Errorf("%s: sha256 %s, SHA256SUMS says %s (damaged or changed: verify %s)", p, hashOf(b), sum, dir)
	}
	return b, nil
}

func hashOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// -- dataset ----------------------------------------------------------------

func pushDataset(ctx context.Context, o Options) (*Result, error) {
	d, _, err := manifests.Vouch(o.Dir) // the folder's structure and its manifests' sums
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("%w: %s holds another dataset (its dataset.json differs from %s's): use --force to replace it, or another prefix",
			ErrUsage, o.Dest, o.Dir)
	case err == nil:
		// Uncommitted first: no dataset.json ever names objects of two builds.
		if err := o.Client.Remove(ctx, o.Dest, manifests.DatasetFile); err != nil {
			return nil, err
		}
	case !errors.Is(err, bucket.ErrNotFound):
		return nil, err
	}
	committed := err == nil && bytes.Equal(remote, local)
	own := d.OwnFiles()
	var names []string
	for rel := range own {
		if d.Modality(modalityOf(d, rel)) == nil {
			names = append(names, rel)
		}
	}
	if err := oursAll(ctx, o, names...); err != nil {
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
	res.Objects = len(own) + 1
	g := groupOf(ctx, o, manifests.BlockSumsFile, objs)
	n, b, err := upload(ctx, o, objs)
	res.Sent, res.Bytes = res.Sent+n, res.Bytes+b
	if err != nil {
		return res, err
	}
	n, b, err = writeBlockSums(ctx, o, []*blockGroup{g})
	res.Sent, res.Bytes = res.Sent+n, res.Bytes+b
	if err != nil {
		return res, err
	}
	// The other manifests (SHA256SUMS lists the blobs: after them), then
	// the commit.
	for _, rel := range small {
		want := sums[rel]
		if rel == d.Files.Sums {
			want = ""
		}
		b, err := readChecked(o.Dir, rel, want)
		if err != nil {
			return res, err
		}
		sum := hashOf(b)
		if st, err := o.Client.Stat(ctx, o.Dest, rel); err == nil && st.Size == int64(len(b)) && st.SHA256 == sum {
			continue
		}
		faults.Point("push.manifest")
		if _, err := o.Client.PutBytes(ctx, o.Dest, rel, b, sum, ""); err != nil {
			return res, err
		}
		res.Sent++
		res.Bytes += int64(len(b))
	}
	if !committed {
		faults.Point("push.commit")
		_, err := o.Client.PutBytes(ctx, o.Dest, manifests.DatasetFile, local, hashOf(local), bucket.CreateOnly)
		if errors.Is(err, bucket.ErrPrecondition) {
			// Committed meanwhile by another push: of this dataset?
			if now, _, rerr := o.Client.ReadAll(ctx, o.Dest, manifests.DatasetFile, manifests.MaxManifest); rerr == nil && bytes.Equal(now, local) {
				err = nil
			} else {
				err = fmt.Errorf("%w: another push committed another dataset at %s meanwhile", ErrUsage, o.Dest)
			}
		}
		if err != nil {
			return res, err
		}
		res.Sent++
		res.Bytes += int64(len(local))
	}
	res.UpToDate = res.Sent == 0
	return res, nil
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

// -- epochs -----------------------------------------------------------------

// casTries bounds the compare-and-swap loops (each retry re-reads what
// another pusher wrote: many tasks pushing at once all get through).
const casTries = 64

func pushEpochs(ctx context.Context, o Options) (*Result, error) {
	man, err := manifests.VouchEpochs(o.Dir)
	if err != nil {
		return nil, err
	}
	sums, err := manifests.ReadSums(filepath.Join(o.Dir, man.Files.Sums))
	if err != nil {
		return nil, err
	}
	res := &Result{Kind: "epochs"}
	if err := oursAll(ctx, o, manifests.EpochsFile, man.Files.Sums, man.Files.Shards); err != nil {
		return nil, err
	}
	key := shuffle.OptionsKey(man)
	remote, _, err := readEpochs(ctx, o)
	switch {
	case err == nil && shuffle.OptionsKey(remote) != key && !o.Force:
		return nil, fmt.Errorf("%w: %s holds epochs cut with other options (or from another dataset): use --force to replace them, or another prefix", ErrUsage, o.Dest)
	case err == nil && shuffle.OptionsKey(remote) != key:
		if err := o.Client.Remove(ctx, o.Dest, manifests.EpochsFile); err != nil { // uncommitted first
			return nil, err
		}
		if err := o.Client.Remove(ctx, o.Dest, man.Files.Sums); err != nil {
			return nil, err
		}
	case err != nil && !errors.Is(err, bucket.ErrNotFound):
		return nil, err
	}
	var objs []object
	var groups []*blockGroup
	for _, e := range man.Epochs {
		var data []string
		for _, s := range e.Shards {
			for _, f := range s.Files {
				data = append(data, f)
			}
		}
		sort.Strings(data)
		eobjs, err := files(o.Dir, data, sums)
		if err != nil {
			return nil, err
		}
		groups = append(groups, groupOf(ctx, o, e.Dir+"/"+manifests.BlockSumsFile, eobjs))
		objs = append(objs, eobjs...)
	}
	res.Objects = len(objs) + len(groups) + 3
	n, b, err := upload(ctx, o, objs)
	res.Sent, res.Bytes = n, b
	if err != nil {
		return res, err
	}
	n, b, err = writeBlockSums(ctx, o, groups)
	res.Sent, res.Bytes = res.Sent+n, res.Bytes+b
	if err != nil {
		return res, err
	}
	ours := map[string]string{}
	for _, x := range objs {
		ours[x.rel] = x.sha
	}
	// SHA256SUMS gains our files' lines (compare-and-swap: none lost).
	changed, err := casSums(ctx, o, man.Files.Sums, func(s map[string]string) bool {
		grew := false
		for f, h := range ours {
			if s[f] != h {
				s[f], grew = h, true
			}
		}
		return grew
	})
	if err != nil {
		return res, err
	}
	wrote := map[string]bool{}
	if changed {
		wrote[man.Files.Sums] = true
	}
	// The commit: epochs.json with our epochs merged into the bucket's.
	committed := false
	for try := 0; ; try++ {
		cur, etag, err := readEpochs(ctx, o)
		cond := bucket.Cond(etag)
		merged := *man
		switch {
		case errors.Is(err, bucket.ErrNotFound):
			cond = bucket.CreateOnly
		case err != nil:
			return res, err
		case shuffle.OptionsKey(cur) != key:
			return res, fmt.Errorf("%w: another push committed epochs with other options into %s meanwhile", ErrUsage, o.Dest)
		default:
			merged = *cur
			merged.Epochs = mergeEpochs(cur.Epochs, man.Epochs)
			if slices.EqualFunc(merged.Epochs, cur.Epochs, sameEntry) {
				break // every epoch of ours is there
			}
			merged.Created, merged.Tool = man.Created, man.Tool
		}
		if err == nil && slices.EqualFunc(merged.Epochs, cur.Epochs, sameEntry) {
			break
		}
		js, jerr := manifests.MarshalJSON(&merged)
		if jerr != nil {
			return res, jerr
		}
		faults.Point("push.commit")
		_, perr := o.Client.PutBytes(ctx, o.Dest, manifests.EpochsFile, js, hashOf(js), cond)
		if perr == nil {
			committed = true
			break
		}
		if !errors.Is(perr, bucket.ErrPrecondition) || try == casTries {
			return res, perr
		}
		backoff(try)
	}
	if committed {
		wrote[manifests.EpochsFile] = true
	}
	// shards.parquet and the manifests' lines of SHA256SUMS, from the
	// epochs.json committed, until it stays the same.
	if err := fixup(ctx, o, man.Files, wrote); err != nil {
		return res, err
	}
	res.Sent += len(wrote)
	final, _, err := readEpochs(ctx, o)
	if err != nil {
		return res, err
	}
	for _, e := range final.Epochs {
		res.Epochs = append(res.Epochs, e.Epoch)
	}
	res.UpToDate = res.Sent == 0
	return res, nil
}

// readEpochs reads and checks the bucket's epochs.json (as LoadEpochs
// does a folder's), with its ETag.
func readEpochs(ctx context.Context, o Options) (*manifests.Epochs, string, error) {
	b, etag, err := o.Client.ReadAll(ctx, o.Dest, manifests.EpochsFile, manifests.MaxManifest)
	if err != nil {
		return nil, "", err
	}
	m, err := manifests.ParseEpochs(b, o.Dest.Name(manifests.EpochsFile))
	return m, etag, err
}

// mergeEpochs is the bucket's epochs with ours added (ours replace an
// entry of the same number: the same options cut the same bytes), sorted.
func mergeEpochs(theirs, ours []manifests.EpochEntry) []manifests.EpochEntry {
	out := slices.Clone(theirs)
	for _, e := range ours {
		i := slices.IndexFunc(out, func(x manifests.EpochEntry) bool { return x.Epoch == e.Epoch })
		if i >= 0 {
			out[i] = e
		} else {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Epoch < out[b].Epoch })
	return out
}

func sameEntry(a, b manifests.EpochEntry) bool {
	x, _ := manifests.MarshalJSON(a)
	y, _ := manifests.MarshalJSON(b)
	return bytes.Equal(x, y)
}

// casSums applies edit to the bucket's SHA256SUMS (none: empty) and, if
// it changed anything, writes it back by compare-and-swap, retrying with
// what another pusher wrote meanwhile.
func casSums(ctx context.Context, o Options, rel string, edit func(map[string]string) bool) (bool, error) {
	for try := 0; ; try++ {
		b, etag, err := o.Client.ReadAll(ctx, o.Dest, rel, manifests.MaxManifest)
		cond := bucket.Cond(etag)
		sums := map[string]string{}
		switch {
		case errors.Is(err, bucket.ErrNotFound):
			cond = bucket.CreateOnly
		case err != nil:
			return false, err
		default:
			if sums, err = manifests.ParseSums(b, o.Dest.Name(rel)); err != nil {
				return false, err
			}
		}
		if !edit(sums) {
			return false, nil
		}
		out := manifests.FormatSums(sums)
		faults.Point("push.sums")
		_, err = o.Client.PutBytes(ctx, o.Dest, rel, out, hashOf(out), cond)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, bucket.ErrPrecondition) || try == casTries {
			return false, err
		}
		backoff(try)
	}
}

// fixup rewrites shards.parquet from the bucket's epochs.json, and the
// lines of SHA256SUMS for it and epochs.json, until epochs.json is the
// same before and after (another pusher's commit meanwhile: again).
func fixup(ctx context.Context, o Options, names manifests.EpochFiles, wrote map[string]bool) error {
	for try := 0; ; try++ {
		js, etag, err := o.Client.ReadAll(ctx, o.Dest, manifests.EpochsFile, manifests.MaxManifest)
		if err != nil {
			return err
		}
		cur, err := manifests.ParseEpochs(js, o.Dest.Name(manifests.EpochsFile))
		if err != nil {
			return err
		}
		pq, err := manifests.ShardsTable(cur)
		if err != nil {
			return err
		}
		pqSum := hashOf(pq)
		if st, err := o.Client.Stat(ctx, o.Dest, names.Shards); err != nil || st.SHA256 != pqSum || st.Size != int64(len(pq)) {
			faults.Point("push.fixup")
			if _, err := o.Client.PutBytes(ctx, o.Dest, names.Shards, pq, pqSum, ""); err != nil {
				return err
			}
			wrote[names.Shards] = true
		}
		changed, err := casSums(ctx, o, names.Sums, func(s map[string]string) bool {
			grew := s[names.Shards] != pqSum || s[manifests.EpochsFile] != hashOf(js)
			s[names.Shards], s[manifests.EpochsFile] = pqSum, hashOf(js)
			return grew
		})
		if err != nil {
			return err
		}
		if changed {
			wrote[names.Sums] = true
		}
		st, err := o.Client.Stat(ctx, o.Dest, manifests.EpochsFile)
		if err != nil {
			return err
		}
		if st.ETag == etag {
			return nil
		}
		if try == casTries {
			return fmt.Errorf("%s: rewritten by other pushes %d times while this one made shards.parquet; run again", o.Dest.Name(manifests.EpochsFile), casTries)
		}
	}
}

// backoff sleeps before retry try of a compare-and-swap: jittered,
// growing to about a second.
func backoff(try int) {
	d := time.Duration(min(1000, 10<<min(try, 7))) * time.Millisecond
	time.Sleep(d/2 + time.Duration(rand.Int64N(int64(d))))
}
