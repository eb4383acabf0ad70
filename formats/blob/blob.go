// Package blob writes the concatenated per-modality arrays of a dataset:
// a .npy file whose 4096-byte header is reserved up front and written when
// the blob is finished, and whose data grows by appending whole rows.
//
// A blob can be reopened after a crash at a known row count: Open truncates
// it to exactly that many rows and appends from there, so a resumed
// conversion ends byte-identical to an uninterrupted one. Crash safety of
// the published name is the caller's business (clipshard writes blobs in a
// staging directory that is renamed into place when complete).
package blob

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
)

// Writer appends rows to a blob. It is not safe for concurrent use.
type Writer struct {
	f          *os.File
	bw         *bufio.Writer
	dtype      array.DType
	frameShape []int
	frameBytes int64
	rows       int64
	pending    int64 // bytes written since the last whole row
}

// Open opens (creating it if needed) the blob at path for rows of
// frameShape elements of dtype dt, keeps its first rows rows and positions
// for appending after them. It fails if the file holds fewer.
func Open(path string, dt array.DType, frameShape []int, rows int64) (*Writer, error) {
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
	if err == nil {
		_, err = f.Seek(keep, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Writer{f: f, bw: bufio.NewWriterSize(f, 4<<20), dtype: dt, frameShape: append([]int(nil), frameShape...), frameBytes: fb, rows: rows}, nil
}

// Write appends element bytes (buffered; see Flush); rows may span calls.
func (w *Writer) Write(p []byte) (int, error) {
	var n int
	var err error
	if len(p) >= directWrite {
		// Large chunks skip the buffer copy.
		if err = w.bw.Flush(); err == nil {
			n, err = w.f.Write(p)
		}
	} else {
		n, err = w.bw.Write(p)
	}
	if w.frameBytes > 0 {
		total := w.pending + int64(n)
		w.rows += total / w.frameBytes
		w.pending = total % w.frameBytes
	}
	return n, err
}

// directWrite is the chunk size from which Write bypasses its buffer.
const directWrite = 256 << 10

// Rows returns the number of whole rows in the blob.
func (w *Writer) Rows() int64 { return w.rows }

// Flush writes buffered rows to the file (not to stable storage: the
// caller fsyncs the finished file). Starting writeback early with
// sync_file_range was measured slower here: it blocks on the device queue.
func (w *Writer) Flush() error { return w.bw.Flush() }

// Finish writes the header for the rows written and closes the file,
// without waiting for it to reach the disk: call atomicfile.Sync (which may run
// concurrently with reading the file back) before publishing it. It fails
// if a partial row was written.
func (w *Writer) Finish() error {
	defer w.f.Close()
	if err := w.bw.Flush(); err != nil {
		return err
	}
	if w.pending != 0 {
		return fmt.Errorf("blob: %s: %d bytes of a partial row", w.f.Name(), w.pending)
	}
	hdr, err := npy.EncodeHeader(w.dtype.Descr(), false, append([]int{int(w.rows)}, w.frameShape...), npy.DataAlign)
	if err != nil {
		return err
	}
	_, err = w.f.WriteAt(hdr, 0)
	return err
}

// Close closes the file without finishing it (the blob stays resumable).
func (w *Writer) Close() error {
	err := w.bw.Flush()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	return err
}
