// Writing: .npy files row by row, the header patched on Close.

package npy

import (
	"bufio"
	"fmt"
	"io"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
)

// Writer streams the rows of a C-ordered, little-endian array whose number
// of rows is not known in advance into a .npy file.
//
// The file is written under a temporary name next to its final path, with a
// header reserved up to DataAlign bytes so that data starts at a 4096-byte
// aligned offset. Close patches the shape into the header, syncs the file
// and renames it into place. A Writer is not safe for concurrent use.
type Writer struct {
	f          *atomicfile.File
	bw         *bufio.Writer
	dtype      array.DType
	frameShape []int
	frameBytes int64
	written    int64
	err        error
}

// Create starts a .npy file at path for rows of frameShape elements of
// dtype dt (the file's shape will be [rows, frameShape...]). The caller must
// call Close to publish the file or Abort to discard it.
func Create(path string, dt array.DType, frameShape []int) (*Writer, error) {
	fb, err := array.ByteSize(frameShape, dt.Size)
	if err != nil {
		return nil, err
	}
	// Check early that the largest plausible header fits.
	if _, err := EncodeHeader(dt.Descr(), false, append([]int{1 << 62}, frameShape...), DataAlign); err != nil {
		return nil, err
	}
	f, err := atomicfile.Create(path)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(make([]byte, DataAlign)); err != nil {
		f.Abort()
		return nil, err
	}
	return &Writer{
		f:          f,
		bw:         bufio.NewWriterSize(f, 1<<20),
		dtype:      dt,
		frameShape: append([]int(nil), frameShape...),
		frameBytes: fb,
	}, nil
}

// Write appends raw little-endian element bytes. Rows may be split across
// calls; Close checks that whole rows were written.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.bw.Write(p)
	w.written += int64(n)
	if err != nil {
		w.err = err
	}
	return n, err
}

// Rows returns the number of whole rows written so far.
func (w *Writer) Rows() int64 {
	if w.frameBytes == 0 {
		return 0
	}
	return w.written / w.frameBytes
}

// Size returns the size the file has once closed: header plus data bytes.
func (w *Writer) Size() int64 { return DataAlign + w.written }

// Header returns the header bytes for the rows written so far.
func (w *Writer) Header() ([]byte, error) {
	shape := append([]int{int(w.Rows())}, w.frameShape...)
	return EncodeHeader(w.dtype.Descr(), false, shape, DataAlign)
}

// Close flushes the data, patches the header with the final row count,
// syncs and renames the file to its final path. On any error the temporary
// file is removed and nothing appears under the final name. A frame shape
// with zero elements writes zero rows.
func (w *Writer) Close() error {
	defer w.f.Abort()
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		return err
	}
	if w.frameBytes > 0 && w.written%w.frameBytes != 0 {
		return fmt.Errorf("npy: %s: %d data bytes is not a whole number of %d-byte rows", w.f.Final(), w.written, w.frameBytes)
	}
	hdr, err := w.Header()
	if err != nil {
		return err
	}
	if _, err := w.f.WriteAt(hdr, 0); err != nil {
		return err
	}
	return w.f.Commit()
}

// Abort discards the file. It is a no-op after Close, so it can be
// deferred.
func (w *Writer) Abort() { w.f.Abort() }

// WriteArray writes a whole array to w (any io.Writer) as a .npy file with
// data at a DataAlign offset: header, then data. The array must be C-ordered
// little-endian, as package array guarantees.
func WriteArray(w io.Writer, a *array.Array) error {
	hdr, err := EncodeHeader(a.DType.Descr(), false, a.Shape, DataAlign)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	_, err = w.Write(a.Data)
	return err
}
