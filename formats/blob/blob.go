// Package blob writes the concatenated per-modality arrays of a dataset:
// a .npy file whose 4096-byte header is reserved up front and written when
// the blob is finished, and whose data grows by appending whole rows.
//
// Data goes to the file in aligned chunks of ChunkSize bytes, written with
// O_DIRECT where the filesystem allows it, by a goroutine of its own: the
// bytes do not pass through the page cache (no kernel copy, no dirty pages
// for the final fsync to wait on, no eviction of other users' cache on a
// shared node), and writing overlaps with filling the next chunk. Another
// goroutine can compute the file's sha256 from the same chunks while they
// are written (see Predict).
//
// A blob can be reopened after a crash at a known row count: Open truncates
// it to exactly that many rows and appends from there, so a resumed
// conversion ends byte-identical to an uninterrupted one. Crash safety of
// the published name is the caller's business (clipshard writes blobs in a
// staging directory that is renamed into place when complete).
package blob

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
)

// ChunkSize is the size of the chunks data is written in (smaller for a
// blob made by Create whose data is smaller).
const ChunkSize = 4 << 20

// chunks is how many chunk buffers a Writer cycles through: one filling,
// the others being written or hashed.
const chunks = 3

const align = directio.Align

// Writer appends rows to a blob. It is not safe for concurrent use.
type Writer struct {
	path       string
	f          *os.File       // header, reading back
	d          *directio.File // data
	dtype      array.DType
	frameShape []int
	frameBytes int64
	rows       int64
	pending    int64 // bytes written since the last whole row

	cur   *chunk      // being filled
	free  chan *chunk // chunks neither being written nor hashed
	out   chan *chunk // to the write goroutine
	hq    chan msg    // to the hash goroutine
	wg    sync.WaitGroup
	werr  atomic.Pointer[error] // first write error
	inUse sync.WaitGroup        // chunks handed to the write goroutine, not yet written
	// written is the file offset up to which data is in the file: the
	// write goroutine writes chunks in order.
	written   atomic.Int64
	hdone     chan hashResult
	predicted int64 // rows given to Predict, or -1
	closed    bool
	size      int      // of a chunk
	retain    int      // bytes of data kept while no header is known (RetainBytes)
	bufs      [][]byte // every chunk buffer, back to the pool at stop
}

// Open opens (creating it if needed) the blob at path for rows of
// frameShape elements of dtype dt, keeps its first rows rows and positions
// for appending after them. It fails if the file holds fewer.
func Open(path string, dt array.DType, frameShape []int, rows int64) (*Writer, error) {
	return open(path, dt, frameShape, rows, ChunkSize)
}

// OpenMem is Open for a Writer whose buffers take at most about mem bytes
// (see BuffersFor): smaller chunks, and a smaller prefix kept while the
// row count is not known, when mem is small.
func OpenMem(path string, dt array.DType, frameShape []int, rows, mem int64) (*Writer, error) {
	size, retain := BuffersFor(mem)
	w, err := open(path, dt, frameShape, rows, size)
	if err == nil {
		w.retain = retain
	}
	return w, err
}

// MinChunk is the smallest chunk BuffersFor chooses.
const MinChunk = 64 << 10

// BuffersFor returns the chunk size and the retained prefix (RetainBytes
// at most) of a Writer that may hold mem bytes of buffers: the chunks it
// cycles through take chunks times the size, and each retained chunk
// takes its size twice (it leaves circulation and a new one replaces
// it). Below what MinChunk chunks take, it takes that.
func BuffersFor(mem int64) (size, retain int) {
	size = ChunkSize
	for size > MinChunk && int64(chunks+2)*int64(size) > mem {
		size /= 2
	}
	r := (mem - int64(chunks)*int64(size)) / 2
	r -= r % int64(size)
	return size, int(max(0, min(int64(RetainBytes), r)))
}

// Create creates the blob at path for rows rows: its sha256 is computed
// as it is written (Predict(rows)), and its chunks are no larger than
// that much data.
func Create(path string, dt array.DType, frameShape []int, rows int64) (*Writer, error) {
	fb, err := array.ByteSize(frameShape, dt.Size)
	if err != nil {
		return nil, err
	}
	size := int(min(ChunkSize, max(align, (rows*fb+align-1)&^(align-1))))
	w, err := open(path, dt, frameShape, 0, size)
	if err != nil {
		return nil, err
	}
	if err := w.Predict(rows); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func open(path string, dt array.DType, frameShape []int, rows int64, size int) (*Writer, error) {
	fb, err := array.ByteSize(frameShape, dt.Size)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	keep := npy.DataAlign + rows*fb
	st, err := f.Stat()
	if err == nil && st.Size() < keep && rows > 0 {
		err = fmt.Errorf("blob: %s: has %d bytes, resuming at %d rows needs %d", path, st.Size(), rows, keep)
	}
	if err == nil {
		err = f.Truncate(keep)
	}
	if err == nil && rows == 0 {
		_, err = f.WriteAt(make([]byte, npy.DataAlign), 0) // placeholder header
	}
	w := &Writer{path: path, f: f, dtype: dt, frameShape: append([]int(nil), frameShape...), frameBytes: fb, rows: rows, predicted: -1, size: size, retain: RetainBytes}
	w.free = make(chan *chunk, chunks)
	for range chunks {
		c := &chunk{buf: getBuf(size)}
		w.bufs = append(w.bufs, c.buf)
		w.free <- c
	}
	w.written.Store(keep)
	w.cur = <-w.free
	w.cur.off = keep &^ (align - 1)
	w.cur.n = int(keep - w.cur.off)
	w.cur.keep = w.cur.n
	if err == nil && w.cur.n > 0 {
		// Resuming mid-page: the page's first bytes are rewritten with it.
		_, err = f.ReadAt(w.cur.buf[:w.cur.n], w.cur.off)
	}
	if err != nil {
		putBufs(w.bufs)
		f.Close()
		return nil, err
	}
	w.d = directio.New(f)
	w.out = make(chan *chunk, chunks)
	w.hq = make(chan msg, chunks+1)
	w.hdone = make(chan hashResult, 1)
	w.wg.Add(1)
	go w.writeLoop()
	go w.hashLoop()
	return w, nil
}

// Write appends element bytes (buffered; see Flush); rows may span calls.
func (w *Writer) Write(p []byte) (int, error) {
	if w.closed {
		return 0, fmt.Errorf("blob: %s: write after Finish or Close", w.path)
	}
	if err := w.err(); err != nil {
		return 0, err
	}
	total := len(p)
	for len(p) > 0 {
		c := copy(w.cur.buf[w.cur.n:], p)
		w.cur.n += c
		p = p[c:]
		if w.cur.n == w.size {
			w.send(true)
		}
	}
	if w.frameBytes > 0 {
		t := w.pending + int64(total)
		w.rows += t / w.frameBytes
		w.pending = t % w.frameBytes
	}
	return total, nil
}

// Predict starts computing the sha256 of the blob as it will be if it is
// finished with rows rows: that header, then the data. The sum of a blob
// cannot otherwise start before the blob is finished, since its header
// (the row count) comes first. Data written before Predict is read back
// from the file once; later data is hashed from the chunks as they are
// written. If the prediction holds, Finish returns the sum. Call it at
// most once, before Finish.
func (w *Writer) Predict(rows int64) error {
	if w.predicted >= 0 || w.closed {
		return fmt.Errorf("blob: %s: Predict called twice or after Finish", w.path)
	}
	w.predicted = rows
	return w.startSum(rows)
}

// startSum sends the hash goroutine the header for rows rows, to start the
// sum over.
func (w *Writer) startSum(rows int64) error {
	hdr, err := w.header(rows)
	if err != nil {
		return err
	}
	w.inUse.Wait() // everything before the current chunk is in the file
	w.hq <- msg{header: hdr, catchUp: w.cur.off + int64(w.cur.keep), predRows: rows}
	return nil
}

func (w *Writer) header(rows int64) ([]byte, error) {
	return npy.EncodeHeader(w.dtype.Descr(), false, append([]int{int(rows)}, w.frameShape...), npy.DataAlign)
}

// End returns the file offset just past the data appended so far
// (buffered or not).
func (w *Writer) End() int64 { return w.cur.off + int64(w.cur.n) }

// Written returns the file offset up to which the data is in the file
// (not necessarily on stable storage), without waiting; with End, it lets
// a caller journal appended rows once they are there instead of calling
// Flush, which waits.
func (w *Writer) Written() int64 { return w.written.Load() }

// HashedWhileWriting reports whether Predict was called with the number of
// rows written so far: then Finish needs no pass over the data.
func (w *Writer) HashedWhileWriting() bool { return w.predicted >= 0 && w.predicted == w.rows }

// Rows returns the number of whole rows in the blob.
func (w *Writer) Rows() int64 { return w.rows }

// Flush writes buffered rows to the file and waits until they are there
// (not on stable storage: the caller fsyncs the finished file).
func (w *Writer) Flush() error {
	if w.cur == nil {
		return fmt.Errorf("blob: %s: flush after Finish or Close", w.path)
	}
	if w.cur.n > w.cur.keep {
		w.send(false)
	}
	w.inUse.Wait()
	return w.err()
}

// stop flushes, stops both goroutines and closes the direct descriptor.
func (w *Writer) stop(finish bool) (hashResult, error) {
	if w.closed {
		return hashResult{rows: -1}, errors.New("blob: writer already closed")
	}
	w.closed = true
	err := w.Flush()
	if err == nil && finish && w.pending == 0 && w.predicted != w.rows {
		// No prediction, or a wrong one: the sum starts now, with the
		// kept prefix and what follows read back.
		err = w.startSum(w.rows)
	}
	close(w.out)
	close(w.hq)
	w.wg.Wait()
	res := <-w.hdone
	// Both goroutines are done: no chunk is in use.
	putBufs(w.bufs)
	w.bufs, w.free, w.cur = nil, nil, nil
	w.d.Close()
	if err == nil {
		err = w.err()
	}
	return res, err
}

// Finish writes the header for the rows written and closes the file,
// without waiting for it to reach the disk: call atomicfile.Sync before
// publishing it. It fails if a partial row was written. It returns the
// file's sha256 (hex): computed while the data was written if Predict was
// called with the number of rows written, else now, from the prefix kept
// in memory (RetainBytes) and the rest read back.
func (w *Writer) Finish() (string, error) {
	defer w.f.Close()
	res, err := w.stop(true)
	if err != nil {
		return "", err
	}
	if w.pending != 0 {
		return "", fmt.Errorf("blob: %s: %d bytes of a partial row", w.path, w.pending)
	}
	hdr, err := w.header(w.rows)
	if err != nil {
		return "", err
	}
	if _, err = w.f.WriteAt(hdr, 0); err != nil {
		return "", err
	}
	if res.rows != w.rows {
		return "", fmt.Errorf("blob: %s: internal error: sum over %d rows, %d written", w.path, res.rows, w.rows)
	}
	return res.sum, res.err
}

// Close closes the file without finishing it (the blob stays resumable).
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	_, err := w.stop(false)
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	return err
}
