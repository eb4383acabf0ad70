// A dataset or an epochs folder in a bucket (clipshard push): mirrored
// into a local folder of its manifests and sparse data files (each with
// its .npy header) so that the folder checks run unchanged, and verified
// with the sha256 of each data object streamed, not stored.

package manifests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/faults"
)

// Mirror is a bucket folder's local mirror: Dir holds every object under
// the prefix as a file of its size, the manifests whole and the data
// objects (blobs, shard files but the samples) sparse with their first
// HeaderBytes read; Objects and Data say which is which.
type Mirror struct {
	Dir     string
	root    string   // the temporary folder Dir is in (mirrorDir)
	lock    *os.File // held while the mirror lives
	URL     bucket.URL
	Kind    string // "dataset" or "epochs"
	Objects map[string]bucket.Object
	Data    map[string]bool
}

// HeaderBytes is how much of a data object a mirror reads: its .npy
// header (the data starts at 4096).
const HeaderBytes = 64 << 10

// Close removes the mirror's folder.
func (m *Mirror) Close() error {
	err := os.RemoveAll(m.root)
	m.lock.Close()
	return err
}

// MirrorBucket mirrors the folder at u (see Mirror) into a new temporary
// folder (one left by a killed process is removed by the next: see
// mirrorDir); Close it.
func MirrorBucket(ctx context.Context, c *bucket.Client, u bucket.URL) (*Mirror, error) {
	objs, err := c.List(ctx, u)
	if err != nil {
		return nil, err
	}
	m := &Mirror{URL: u, Objects: objs, Data: map[string]bool{}}
	if m.root, m.Dir, m.lock, err = mirrorDir(); err != nil {
		return nil, err
	}
	fail := func(err error) (*Mirror, error) {
		m.Close()
		return nil, err
	}
	fetch := func(rel string) error {
		if err := CheckRelPath(rel); err != nil {
			return fmt.Errorf("%s: %w", u.Name(rel), err)
		}
		b, _, err := c.ReadAll(ctx, u, rel, MaxManifest)
		if err != nil {
			return err
		}
		return writeMirrored(m.Dir, rel, b, int64(len(b)))
	}
	switch {
	case has(objs, DatasetFile):
		m.Kind = "dataset"
		if err := fetch(DatasetFile); err != nil {
			return fail(err)
		}
		d, err := LoadDataset(m.Dir)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", u.Name(DatasetFile), err))
		}
		for _, f := range d.BlobFiles() {
			m.Data[f] = true
		}
		if d.Segmented() {
			// (the blobs of every version the bucket keeps: data, whose
			// heads are enough)
			for rel := range objs {
				if !SegmentedLayout(rel) || path.Dir(path.Dir(rel)) != VersionsDir || path.Base(rel) != DatasetFile {
					continue
				}
				if err := fetch(rel); err != nil {
					return fail(err)
				}
				v, err := LoadDataset(filepath.Join(m.Dir, filepath.FromSlash(path.Dir(rel))))
				if err != nil {
					return fail(fmt.Errorf("%s: %w", u.Name(rel), err))
				}
				for _, f := range v.BlobFiles() {
					m.Data[f] = true
				}
			}
		}
	case has(objs, EpochsFile):
		m.Kind = "epochs"
		if err := fetch(EpochsFile); err != nil {
			return fail(err)
		}
		man, err := LoadEpochs(m.Dir)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", u.Name(EpochsFile), err))
		}
		for _, e := range man.Epochs {
			for _, s := range e.Shards {
				for name, f := range s.Files {
					if name != "samples" {
						m.Data[f] = true
					}
				}
			}
		}
	default:
		return fail(fmt.Errorf("%w: %s: neither a dataset (no dataset.json) nor an epochs folder (no epochs.json)", ErrManifest, u))
	}
	names := make([]string, 0, len(objs))
	for rel := range objs {
		names = append(names, rel)
	}
	sort.Strings(names)
	for _, rel := range names {
		faults.Point("mirror.object")
		if rel == DatasetFile || rel == EpochsFile {
			continue
		}
		if err := CheckRelPath(rel); err != nil {
			return fail(fmt.Errorf("%s: %w", u.Name(rel), err))
		}
		o := objs[rel]
		if !m.Data[rel] && o.Size <= MaxManifest {
			if err := fetch(rel); err != nil {
				return fail(err)
			}
			continue
		}
		head, err := c.Range(ctx, u, rel, 0, min(o.Size, HeaderBytes), o.ETag)
		if err != nil {
			return fail(err)
		}
		if err := writeMirrored(m.Dir, rel, head, o.Size); err != nil {
			return fail(err)
		}
	}
	return m, nil
}

func has(objs map[string]bucket.Object, rel string) bool {
	_, ok := objs[rel]
	return ok
}

// writeMirrored writes b at the start of the file rel of size bytes.
func writeMirrored(dir, rel string, b []byte, size int64) error {
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ErrBucketLevel marks a check a bucket folder does not have (verify
// --deep and --sources of s3://).
var ErrBucketLevel = errors.New("not for a bucket")

// VerifyBucket checks the dataset or epochs folder at u as verify does a
// folder's (default level): every object present and no other, the
// manifests, headers and offsets (on the mirror), and the sha256 of every
// object, the data objects streamed and hashed, not stored. Problems
// name the objects (s3://...).
func VerifyBucket(ctx context.Context, c *bucket.Client, u bucket.URL, o VerifyOptions) (*Report, error) {
	if o.Deep || o.Sources {
		return nil, fmt.Errorf("%w: --deep and --sources read every sample or source: verify the folder that was pushed, or a copy synced down (aws s3 sync), with them; a bucket is checked at the default level (structure and every object's sha256)", ErrBucketLevel)
	}
	m, err := MirrorBucket(ctx, c, u)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	o.manifestsOnly = true
	var r *Report
	if m.Kind == "dataset" {
		if r, err = VerifyDataset(m.Dir, o); err != nil {
			return nil, err
		}
	} else if r, err = VerifyEpochs(m.Dir, o); err != nil {
		return nil, err
	}
	sums, err := ReadSums(filepath.Join(m.Dir, SumsFile))
	if m.Kind == "dataset" {
		if d, derr := LoadDataset(m.Dir); derr == nil && d.Segmented() {
			var k *Kept
			if k, err = KeptFiles(m.Dir); err == nil {
				sums = k.Sums
			}
		}
	}
	if err == nil {
		hashObjects(ctx, c, m, sums, o, r)
	}
	for i := range r.Problems {
		if p := &r.Problems[i]; p.File != "" && p.File != "." && !strings.HasPrefix(p.File, "s3://") {
			p.File = u.Name(path.Clean(p.File))
		}
	}
	r.Dir = u.String()
	r.Level = "structure+sha256 (bucket)"
	r.Sort()
	return r, nil
}

// hashObjects streams every data object that SHA256SUMS lists and checks
// its sha256, o.Workers at once.
func hashObjects(ctx context.Context, c *bucket.Client, m *Mirror, sums map[string]string, o VerifyOptions, r *Report) {
	var names []string
	var total int64
	for rel := range m.Data {
		if sums[rel] != "" && has(m.Objects, rel) {
			names = append(names, rel)
			total += m.Objects[rel].Size
		}
	}
	sort.Strings(names)
	workers := max(1, o.Workers)
	if o.Workers <= 0 {
		workers = 2
	}
	var mu sync.Mutex
	var done int64
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for _, rel := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			faults.Point("verify.object")
			want, blocked := r.blocks[rel]
			var bh *BlockHasher
			if blocked {
				bh = NewBlockHasher(want.block)
			}
			got, n, err := hashObject(ctx, c, m.URL, rel, bh, func(k int64) {
				mu.Lock()
				done += k
				if o.Progress != nil {
					o.Progress(done, total)
				}
				mu.Unlock()
			})
			mu.Lock()
			defer mu.Unlock()
			r.Files++
			r.Bytes += n
			switch {
			case err != nil:
				r.add(Problem{File: rel, What: oneLine(err)})
			case got != sums[rel]:
				r.add(Problem{File: rel, What: "sha256 mismatch: content differs from SHA256SUMS"})
			case m.Objects[rel].SHA256 != "" && m.Objects[rel].SHA256 != got:
				r.add(Problem{File: rel, What: "sha256 differs from the object's recorded x-amz-meta-sha256"})
			case blocked && want.problem(bh) != "":
				r.add(Problem{File: rel, What: want.problem(bh)})
			}
		}()
	}
	wg.Wait()
}

func hashObject(ctx context.Context, c *bucket.Client, u bucket.URL, rel string, bh *BlockHasher, progress func(int64)) (string, int64, error) {
	rc, _, err := c.Stream(ctx, u, rel)
	if err != nil {
		return "", 0, err
	}
	defer rc.Close()
	return hashReader(rc, bh, progress)
}
