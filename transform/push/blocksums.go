// BLOCKSUMS of a pushed folder: the sha256 of each block of its data files,
// reused from the bucket's objects on a resumed push.

package push

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"sync"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

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
