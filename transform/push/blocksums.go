// BLOCKSUMS of a pushed folder: the sha256 of each block of its data files,
// reused from the bucket's objects on a resumed push.

package push

import (
	"bytes"
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
	raw   []byte               // its bytes
	etag  string               // and ETag
	mu    sync.Mutex
	files []manifests.BlockFile
	// keep: the bucket's entries of files this push does not send stay
	// listed (a dataset's earlier versions, which stay in the bucket),
	// and its block size is kept.
	keep bool
}

// groupOf makes the block group rel of these objects (its block size
// from their bytes) and points them at it.
func groupOf(ctx context.Context, o Options, rel string, objs []object) *blockGroup {
	return groupKeeping(ctx, o, rel, objs, false)
}

// groupKeeping is groupOf, with keep (see blockGroup).
func groupKeeping(ctx context.Context, o Options, rel string, objs []object, keep bool) *blockGroup {
	var total int64
	for _, x := range objs {
		total += x.size
	}
	g := &blockGroup{rel: rel, block: manifests.BlockSizeFor(total), keep: keep}
	if b, etag, err := o.Client.ReadAll(ctx, o.Dest, rel, manifests.MaxManifest+manifests.MaxBlockDigests); err == nil {
		g.raw, g.etag = b, etag
		if s, err := manifests.ParseBlockSums(b, o.Dest.Name(rel)); err == nil && (s.Block == g.block || keep) {
			g.have, g.block = s, s.Block
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

// proven reports whether object x, which the bucket holds with its size
// and x-amz-meta-sha256 (st), is proven to hold its bytes, and if so
// records its block sums and ETag: the bucket's BLOCKSUMS lists the file
// with this size, sha256 and ETag (a push wrote that object, checked, and
// this very version is there), or the ETag is the one its upload of the
// folder's file makes (hashed from the file here, with its block sums).
// Metadata alone proves nothing: another writer may keep it and change
// the bytes. An object not proven is sent again.
func (g *blockGroup) proven(o Options, x object, st bucket.Object) (bool, error) {
	if g.have != nil {
		if f := g.have.File(x.rel); f != nil && f.Size == x.size && f.SHA256 == x.sha && f.ETag != "" && f.ETag == st.ETag {
			g.add(*f)
			return true, nil
		}
	}
	p := filepath.Join(o.Dir, filepath.FromSlash(x.rel))
	f, _, err := regfile.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	part := st.PartSize
	if part < 5<<20 || part > 5<<30 { // (S3's bounds: the metadata is the writer's word, only a hint)
		part = o.PartSize
	}
	h, bh, eh := sha256.New(), manifests.NewBlockHasher(g.block), bucket.NewETagHasher(x.size, part)
	n, err := io.Copy(io.MultiWriter(h, bh, eh), io.LimitReader(f, x.size+1))
	if err != nil {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != x.sha || n != x.size {
		return false, fmt.Errorf("%s: its bytes (sha256 %s, %d bytes) are not those SHA256SUMS records (%s): damaged or changed (verify %s)", p, got, n, x.sha, o.Dir)
	}
	if eh.Sum() != st.ETag {
		return false, nil
	}
	g.add(manifests.BlockFile{Name: x.rel, Size: x.size, SHA256: x.sha, Head: bh.Head(), ETag: st.ETag, Digests: bh.Digests()})
	return true, nil
}

// writeBlockSums writes each group's BLOCKSUMS (after its files, before
// the manifests that commit them) unless the bucket holds it already (its
// bytes, as read when the push began), records it in proofs, and returns
// how many it wrote and their bytes.
func writeBlockSums(ctx context.Context, o Options, groups []*blockGroup, proofs map[string]bucket.Object) (int, int64, error) {
	var sent int
	var size int64
	for _, g := range groups {
		if g.keep && g.have != nil {
			mine := map[string]bool{}
			for _, f := range g.files {
				mine[f.Name] = true
			}
			for _, f := range g.have.Files {
				if !mine[f.Name] && f.ETag != "" { // (a version 1 entry: proven by nobody now)
					g.files = append(g.files, f)
				}
			}
		}
		sort.Slice(g.files, func(a, b int) bool { return g.files[a].Name < g.files[b].Name })
		b, err := (&manifests.BlockSums{Block: g.block, Files: g.files}).Marshal()
		if err != nil {
			return sent, size, err
		}
		if bytes.Equal(b, g.raw) {
			proofs[g.rel] = bucket.Object{Size: int64(len(b)), ETag: g.etag}
			continue
		}
		st, err := o.Client.Stat(ctx, o.Dest, g.rel)
		if err == nil {
			err = ours(o, g.rel, st)
		}
		if err != nil && !errors.Is(err, bucket.ErrNotFound) {
			return sent, size, err
		}
		faults.Point("push.blocksums")
		etag, err := o.Client.PutBytes(ctx, o.Dest, g.rel, b, hashOf(b), "")
		if err != nil {
			return sent, size, err
		}
		proofs[g.rel] = bucket.Object{Size: int64(len(b)), ETag: etag}
		sent++
		size += int64(len(b))
	}
	return sent, size, nil
}

// proofsOf records the data objects of these groups, as sent or proved.
func proofsOf(groups []*blockGroup, proofs map[string]bucket.Object) {
	for _, g := range groups {
		for _, f := range g.files {
			proofs[f.Name] = bucket.Object{Size: f.Size, ETag: f.ETag}
		}
	}
}
