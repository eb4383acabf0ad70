// Sending objects: skip one the bucket already holds with our sum, else upload
// the file hashed as it is read and checked against SHA256SUMS.

package push

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// files lists rels with their sizes and recorded sums (a file SHA256SUMS
// does not list is an error: push sends only what it can check; a file or
// folder that is a link out of dir is refused: push never follows one).
func files(dir string, rels []string, sums map[string]string) ([]object, error) {
	var out []object
	for _, rel := range rels {
		p, err := manifests.Confined(dir, rel)
		if err != nil {
			return nil, fmt.Errorf("%w: push sends a dataset's own files only (copy what the link points to into %s, or convert again)", err, dir)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			what := "a link" // (fi is the entry's, not followed)
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode()&fs.ModeSymlink == 0 {
				what = regfile.Kind(st.Mode)
			}
			return nil, fmt.Errorf("%s: %w (%s)", p, regfile.ErrNotRegular, what)
		}
		if sums[rel] == "" {
			return nil, fmt.Errorf("%s: not listed in SHA256SUMS", filepath.Join(dir, rel))
		}
		out = append(out, object{rel: rel, size: fi.Size(), sha: sums[rel]})
	}
	return out, nil
}

// upload sends every object the bucket does not hold, proven, with its
// size and sha256, o.Objects at once, and returns how many it sent and
// their bytes. Each object it sent or proved is recorded in its group
// (its ETag with it).
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
			fail := func(err error) {
				errs <- err
				cancel()
			}
			st, err := o.Client.Stat(cctx, o.Dest, x.rel)
			if err == nil && st.Size == x.size && st.SHA256 == x.sha {
				ok, err := x.group.proven(o, x, st)
				if err != nil {
					fail(err)
					return
				}
				if ok {
					report(x.size) // there, proven intact: not sent again
					return
				}
				// (its metadata says so, its bytes are not proven: sent again)
			} else if err == nil {
				err = ours(o, x.rel, st)
			}
			if err != nil && !errors.Is(err, bucket.ErrNotFound) {
				fail(err)
				return
			}
			if err := send(cctx, o, x, report); err != nil {
				fail(err)
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

// send uploads one object, hashing its bytes as they are read: the
// object is made only if they are the recorded ones (else its upload is
// aborted and the push fails, naming the file).
func send(ctx context.Context, o Options, x object, report func(int64)) error {
	p, err := manifests.Confined(o.Dir, x.rel) // (again: a folder swapped for a link since files() looked)
	if err != nil {
		return err
	}
	f, fi, err := regfile.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi.Size() != x.size {
		return fmt.Errorf("%s: %d bytes, %d a moment ago (changed while it was pushed)", p, fi.Size(), x.size)
	}
	o.Client.AbortUploads(ctx, o.Dest, x.rel) // the parts of a killed push, if any (a server without the listing: left)
	h, bh := sha256.New(), manifests.NewBlockHasher(x.group.block)
	r := &counting{r: io.TeeReader(io.LimitReader(f, x.size), io.MultiWriter(h, bh)), report: report, path: p, size: x.size}
	faults.Point("push.object")
	check := func() error {
		if got := hex.EncodeToString(h.Sum(nil)); got != x.sha || r.n != x.size {
			return fmt.Errorf("%s: its bytes (sha256 %s, %d bytes) are not those SHA256SUMS records (%s): damaged, or changed while pushed (verify %s)",
				p, got, r.n, x.sha, o.Dir)
		}
		return nil
	}
	etag, err := o.Client.PutChecked(ctx, o.Dest, x.rel, r, x.size, x.sha, o.PartSize, o.Parts, check)
	if err != nil {
		return err
	}
	x.group.add(manifests.BlockFile{Name: x.rel, Size: x.size, SHA256: x.sha, Head: bh.Head(), ETag: etag, Digests: bh.Digests()})
	return nil
}

type counting struct {
	r      io.Reader
	n      int64
	report func(int64)
	path   string
	size   int64
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF && c.n+int64(n) < c.size {
		err = fmt.Errorf("%s: ended at byte %d of %d (changed while it was pushed)", c.path, c.n+int64(n), c.size)
	}
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
	p, err := manifests.Confined(dir, rel)
	if err != nil {
		return nil, fmt.Errorf("%w: push sends a dataset's own files only (copy what the link points to into %s, or convert again)", err, dir)
	}
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

// backoff sleeps before retry try of a compare-and-swap: jittered,
// growing to about a second.
func backoff(try int) {
	d := time.Duration(min(1000, 10<<min(try, 7))) * time.Millisecond
	time.Sleep(d/2 + time.Duration(rand.Int64N(int64(d))))
}
