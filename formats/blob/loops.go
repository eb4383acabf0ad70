// The writer's two goroutines: chunks hashed in order and written aligned
// (O_DIRECT where the filesystem allows), their buffers pooled.

package blob

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"sync"
	"sync/atomic"

	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
)

// Chunk buffers (directio.MapBuf) go back to a pool, by size, when a
// Writer stops: a program writing many blobs (shuffle, a blob per shard
// file) would otherwise map, fault in and zero them again for each.
// ReleaseBuffers unmaps the idle ones.
var pool struct {
	sync.Mutex
	free map[int][][]byte
}

func getBuf(size int) []byte {
	pool.Lock()
	defer pool.Unlock()
	if l := pool.free[size]; len(l) > 0 {
		pool.free[size] = l[:len(l)-1]
		return l[len(l)-1]
	}
	return directio.MapBuf(size)
}

func putBufs(bs [][]byte) {
	pool.Lock()
	defer pool.Unlock()
	if pool.free == nil {
		pool.free = map[int][][]byte{}
	}
	for _, b := range bs {
		pool.free[len(b)] = append(pool.free[len(b)], b)
	}
}

// ReleaseBuffers unmaps the chunk buffers that no open Writer holds.
func ReleaseBuffers() {
	pool.Lock()
	defer pool.Unlock()
	for _, l := range pool.free {
		for _, b := range l {
			directio.Unmap(b)
		}
	}
	pool.free = nil
}

// RetainBytes is how much of a blob's data, from its start, a Writer keeps
// in memory while the blob's row count is not known (no Predict yet), so
// that the sha256 can then be computed without reading that part back
// from the disk (the data was written around the page cache).
var RetainBytes = 32 << 20

// chunk is a chunk size of bytes of the file starting at the aligned offset off.
// Its first keep bytes are already in the file (and hashed); data holds the
// bytes [0, n).
type chunk struct {
	buf  []byte // the chunk size, aligned in memory
	off  int64
	n    int
	keep int
	refs atomic.Int32
	// kept by the hash goroutine (see RetainBytes): out of circulation
	kept atomic.Bool
}

// msg is what the hash goroutine receives: a chunk, or a header (a
// prediction, or the final header from Finish) to start the sum over.
type msg struct {
	c        *chunk
	header   []byte // a prediction: hash this header, then the file up to catchUp
	catchUp  int64
	predRows int64
}

type hashResult struct {
	rows int64 // the prediction hashed, -1 if none
	sum  string
	err  error
}

// send hands the current chunk to the write and hash goroutines and
// starts the next one. If full is false the chunk is partial (a flush):
// its last partial page is carried over into the next chunk, to be
// rewritten whole.
func (w *Writer) send(full bool) {
	c := w.cur
	next := <-w.free
	next.off = c.off + int64(c.n)
	next.n, next.keep = 0, 0
	if !full {
		tail := c.n & (align - 1)
		next.off = c.off + int64(c.n-tail)
		next.n = copy(next.buf, c.buf[c.n-tail:c.n])
		next.keep = next.n
	}
	c.refs.Store(2)
	w.inUse.Add(1)
	w.out <- c
	w.hq <- msg{c: c}
	w.cur = next
}

// release returns a chunk to the free list once both goroutines are done.
func (w *Writer) release(c *chunk) {
	if c.refs.Add(-1) == 0 && !c.kept.Load() {
		w.free <- c
	}
}

func (w *Writer) writeLoop() {
	defer w.wg.Done()
	for c := range w.out {
		if w.err() == nil {
			if err := w.writeChunk(c); err != nil {
				w.werr.CompareAndSwap(nil, &err)
			} else {
				w.written.Store(c.off + int64(c.n))
			}
		}
		w.inUse.Done()
		w.release(c)
	}
}

// writeChunk writes c's bytes [keep, n): from the start of the page
// holding keep (the kept bytes of that page are rewritten unchanged).
func (w *Writer) writeChunk(c *chunk) error {
	start := c.keep &^ (align - 1)
	if err := w.d.WriteAt(c.buf[start:c.n], c.off+int64(start)); err != nil {
		return err // an *fs.PathError: "write PATH: no space left on device"
	}
	return nil
}

func (w *Writer) hashLoop() {
	var d hash.Hash
	res := hashResult{rows: -1}
	var buf []byte
	// Chunks kept while no header is known: a prefix of the data.
	var kept []*chunk
	keptBytes, keeping := 0, true
	readBack := func(from, to int64) {
		if buf == nil {
			buf = make([]byte, 1<<20)
		}
		for off := from; off < to && res.err == nil; {
			n, err := w.f.ReadAt(buf[:min(int64(len(buf)), to-off)], off)
			d.Write(buf[:n])
			off += int64(n)
			if err != nil {
				res.err = fmt.Errorf("blob: %s: reading back for the checksum: %w", w.path, err)
			}
		}
	}
	for m := range w.hq {
		switch {
		case m.header != nil:
			// Start (or, after a wrong prediction, restart) the sum: the
			// header, the kept prefix, then the rest of what is already in
			// the file, read back.
			d = sha256.New()
			d.Write(m.header)
			res = hashResult{rows: m.predRows}
			from := int64(npy.DataAlign)
			for _, c := range kept {
				d.Write(c.buf[c.keep:c.n])
				from = c.off + int64(c.n)
				w.drop(c)
			}
			kept, keeping = nil, false
			readBack(from, m.catchUp)
		case d != nil:
			if res.err == nil {
				d.Write(m.c.buf[m.c.keep:m.c.n])
			}
			w.release(m.c)
		case keeping && keptBytes+w.size <= w.retain && (len(kept) > 0 || m.c.off == npy.DataAlign && m.c.keep == 0):
			// Keep the chunk; a new one takes its place in circulation.
			m.c.kept.Store(true)
			kept = append(kept, m.c)
			keptBytes += w.size
			// On the Go heap: huge pages cost compaction stalls when many
			// are taken at once.
			w.free <- &chunk{buf: directio.AlignedBuf(w.size)}
		default:
			keeping = false
			w.release(m.c)
		}
	}
	for _, c := range kept {
		w.drop(c)
	}
	if d != nil && res.err == nil {
		res.sum = hex.EncodeToString(d.Sum(nil))
	}
	w.hdone <- res
}

// drop lets go of a kept chunk: it has left circulation (a replacement
// was made when it was kept), release will not return it to the free list.
func (w *Writer) drop(c *chunk) { c.refs.Add(-1) }

func (w *Writer) err() error {
	if p := w.werr.Load(); p != nil {
		return *p
	}
	return nil
}
