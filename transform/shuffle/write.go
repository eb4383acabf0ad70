// Write: the shard files, through the page cache or around it, hashed
// while they are written, by a worker's cursor.

package shuffle

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"os"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
)

// shardFile writes one shard file.
type shardFile interface {
	// write hashes p and writes it; p must not change until close.
	write(p []byte)
	// close writes what write left pending, closes the file (not synced: the epoch commit
	// fsyncs every file) and returns its sha256.
	close() (string, error)
	name() string // relative to the epochs directory
	// abort closes the file without writing what write still refers to
	// (that memory may be gone); the partial epoch is removed.
	abort()
}

// pageShard writes one shard file through the page cache (--no-fsync,
// and samples files) from pieces of memory that stay valid until its next
// flush (windows in the loaded blobs): each piece is hashed (sha256) as
// it comes and written with the others by pwritev, so the bytes are
// copied once, by the kernel.
type pageShard struct {
	f       *os.File
	h       hash.Hash
	rel     string
	iov     [][]byte
	pending int
	off     int64 // file offset of the first pending byte
	err     error
}

const shardFlush = 8 << 20 // bytes pending before a pwritev

// newPageShard creates the file at path and starts it with the .npy
// header for shape.
func newPageShard(path, rel string, dt array.DType, shape []int) (*pageShard, error) {
	hdr, err := npy.EncodeHeader(dt.Descr(), false, shape, npy.DataAlign)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	s := &pageShard{f: f, h: sha256.New(), rel: rel}
	s.write(hdr)
	return s, nil
}

func (s *pageShard) name() string { return s.rel }

func (s *pageShard) abort() {
	clear(s.iov)
	s.iov = nil
	s.f.Close()
}

func (s *pageShard) write(p []byte) {
	if len(p) == 0 {
		return
	}
	s.h.Write(p)
	s.iov = append(s.iov, p)
	s.pending += len(p)
	if len(s.iov) >= 1024 || s.pending >= shardFlush {
		s.flush()
	}
}

func (s *pageShard) flush() error {
	if s.err != nil || len(s.iov) == 0 {
		return s.err
	}
	n, err := pwritevAll(s.f, s.iov, s.off)
	s.off += n
	clear(s.iov)
	s.iov, s.pending = s.iov[:0], 0
	s.err = err
	return err
}

func (s *pageShard) close() (string, error) {
	err := s.flush()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return hex.EncodeToString(s.h.Sum(nil)), err
}

// blobShard writes one shard file through a blob.Writer (unless
// --no-fsync): around the page cache where the filesystem allows, from a
// goroutine, with the sha256 computed from the same chunks as they are
// written (the row count is known up front). The bytes are on disk when
// it closes, so the epoch commit's fsync has nothing left to wait for, and
// a shard, read later by a trainer (usually on another node), does not
// take this node's page cache. write copies.
type blobShard struct {
	w   *blob.Writer
	rel string
}

func newBlobShard(path, rel string, dt array.DType, shape []int) (*blobShard, error) {
	w, err := blob.Create(path, dt, shape[1:], int64(shape[0]))
	if err != nil {
		return nil, err
	}
	return &blobShard{w: w, rel: rel}, nil
}

func (s *blobShard) write(p []byte)         { s.w.Write(p) } // an error comes back from Finish
func (s *blobShard) close() (string, error) { return s.w.Finish() }
func (s *blobShard) abort()                 { s.w.Close() }
func (s *blobShard) name() string           { return s.rel }

// pwritevAll writes the pieces at off with as few pwritev calls as the
// kernel's 1024 pieces a call allow; it returns the bytes written.
func pwritevAll(f *os.File, pieces [][]byte, off int64) (int64, error) {
	fd := int(f.Fd())
	var total int64
	for len(pieces) > 0 {
		batch := pieces[:min(len(pieces), 1024)]
		n, err := unix.Pwritev(fd, batch, off+total)
		if err != nil {
			return total, fmt.Errorf("writing %s: %w", f.Name(), err)
		}
		total += int64(n)
		// Drop what was written (a short write resumes mid-piece).
		for n > 0 && len(pieces) > 0 {
			if n >= len(pieces[0]) {
				n -= len(pieces[0])
				pieces = pieces[1:]
			} else {
				pieces[0] = pieces[0][n:]
				n = 0
			}
		}
	}
	return total, nil
}

// cursor is a worker's open shard (see open) and memory.
type cursor struct {
	s       *sink
	u       unit
	files   []shardFile // the modalities'
	n       int64       // samples written
	samples []byte      // samples.npy rows (see report)
	buf     []byte      // see buffer
}

// put writes the next sample of the open shard: win[k] holds its rows of
// modality k, zeros follow up to the window's size. The memory of win must
// not change until c.close.
func (c *cursor) put(win [][]byte) error {
	j := c.s.j
	if c.s.stop.Load() {
		return errStopped
	}
	for k, m := range j.mods {
		f := c.files[k]
		f.write(win[k])
		if pad := m.winBytes - int64(len(win[k])); pad > 0 {
			f.write(j.zeros[:pad])
		}
	}
	c.n++
	return nil
}

// samplesRows appends the samples.npy rows (clip, start, valid; and, in
// a mixed run, source, with clip numbered within it) of output positions
// [lo, hi) of ep to dst.
func (j *job) samplesRows(ep *epochPlan, lo, hi int64, dst []byte) []byte {
	for _, smp := range ep.samples[lo-ep.base : hi-ep.base] {
		s := j.srcOf(smp.Clip)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(smp.Clip-j.srcs[s].clip0))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(smp.Start))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(smp.Valid))
		if j.mixed {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(s))
		}
	}
	return dst
}

// sampleCols is the int64 columns of a samples file, and sampleRec its
// bytes a sample.
func (j *job) sampleCols() int {
	if j.mixed {
		return 4
	}
	return 3
}

func (j *job) sampleRec() int64 { return int64(8 * j.sampleCols()) }

// buffer is the worker's memory for n bytes (kept for the next call: the
// external path reads a pile at a time into it).
func (c *cursor) buffer(n int64) []byte {
	if int64(len(c.buf)) < n {
		c.release()
		c.buf = directio.MapBuf(int(n))
	}
	return c.buf[:n]
}

// release frees the worker's buffer.
func (c *cursor) release() {
	if c.buf != nil {
		directio.Unmap(c.buf)
		c.buf = nil
	}
}

// open starts writing shard u's modality files.
func (c *cursor) open(u unit) error {
	j := c.s.j
	c.u, c.n = u, 0
	for _, m := range j.mods {
		var sf shardFile
		var err error
		if j.o.NoFsync {
			sf, err = newPageShard(j.shardPath(u, m.name), j.shardRel(u, m.name), m.dtype, j.shardShape(m, int(u.hi-u.lo)))
		} else {
			sf, err = newBlobShard(j.shardPath(u, m.name), j.shardRel(u, m.name), m.dtype, j.shardShape(m, int(u.hi-u.lo)))
		}
		if err != nil {
			return err
		}
		c.files = append(c.files, sf)
	}
	return nil
}

// close finishes the open shard and reports it.
func (c *cursor) close() error {
	var sums [][2]string
	var first error
	for _, f := range c.files {
		sum, err := f.close()
		if err != nil && first == nil {
			first = err
		}
		sums = append(sums, [2]string{f.name(), sum})
	}
	c.files = nil
	if first != nil {
		return first
	}
	if want := c.u.hi - c.u.lo; c.n != want {
		return fmt.Errorf("shuffle: internal error: shard %d of epoch %d got %d samples, want %d", c.u.idx, c.s.j.epochs[c.u.ep].epoch, c.n, want)
	}
	return c.report(c.u, sums)
}

// report writes shard u's samples file and hands the sink the shard's
// file sums (its modalities', in sums).
func (c *cursor) report(u unit, sums [][2]string) error {
	j := c.s.j
	n := int(u.hi - u.lo)
	sm, err := newPageShard(j.shardPath(u, "samples"), j.shardRel(u, "samples"), array.DType{Kind: array.Int, Size: 8}, []int{n, j.sampleCols()})
	if err != nil {
		return err
	}
	c.samples = j.samplesRows(&j.epochs[u.ep], u.lo, u.hi, c.samples[:0])
	sm.write(c.samples)
	sum, err := sm.close()
	if err != nil {
		return err
	}
	c.s.results <- shardResult{ep: u.ep, idx: u.idx, sums: append(sums, [2]string{sm.name(), sum}), samples: int64(n),
		bytes: int64(n)*(j.rec+j.sampleRec()) + int64(len(j.mods)+1)*npy.DataAlign} // as epochBytes counts them
	return nil
}

// abort closes the open shard's files without reporting them.
func (c *cursor) abort() {
	for _, f := range c.files {
		f.abort()
	}
	c.files = nil
}
