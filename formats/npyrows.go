// Rows: a .npy source read a run of rows at a time, for clips larger than
// memory.

package formats

import (
	"fmt"
	"io"
	"io/fs"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
)

// NPYRows reads a .npy source a run of rows at a time, for clips too large
// to hold in memory: only the header is read when it is opened. Rows come
// back C-ordered and little-endian, whatever the file's order and byte
// order. Not safe for concurrent use; Close it.
type NPYRows struct {
	f      *rawFile
	Header *npy.Header
	Info   fs.FileInfo
	path   string
	frame  int64 // elements per row
}

// OpenNPYRows opens the .npy file at path (a regular file: a FIFO is
// refused, not waited on), relative to a folder of dirs if dirs is not
// nil, and reads its header, checked against the file's size.
func OpenNPYRows(dirs *Dirs, path string) (*NPYRows, error) {
	f, info, err := openSettled(dirs, path)
	if err != nil {
		return nil, err
	}
	return npyRows(f, info, path)
}

// npyRows reads the header of f, open at path, and returns it as NPYRows
// (f closed on error).
func npyRows(f *rawFile, info fs.FileInfo, path string) (*NPYRows, error) {
	h, err := npy.ReadHeader(f, info.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s := &NPYRows{f: f, Header: h, Info: info, path: path, frame: 1}
	for _, d := range h.Shape[min(1, len(h.Shape)):] {
		s.frame *= int64(d)
	}
	return s, nil
}

// Array describes the file's array without its data (Data is nil).
func (s *NPYRows) Array() *array.Array {
	return &array.Array{DType: s.Header.DType, Shape: append([]int(nil), s.Header.Shape...), SourceDescr: s.Header.Descr, SourceFortran: s.Header.Fortran}
}

// RowBytes is the size of one row, as stored and as returned.
func (s *NPYRows) RowBytes() int64 { return s.frame * int64(s.Header.DType.Size) }

// Read returns rows [r0, r1), C-ordered little-endian, in raw (grown if
// too small) or, for a Fortran-ordered file, in dst (idem); the returned
// slice aliases one of them.
func (s *NPYRows) Read(r0, r1 int64, raw, dst *[]byte) ([]byte, error) {
	h := s.Header
	if len(h.Shape) == 0 || r0 < 0 || r1 < r0 || r1 > int64(h.Shape[0]) {
		return nil, fmt.Errorf("%s: rows %d..%d of %s", s.path, r0, r1, array.FormatShape(h.Shape))
	}
	size := int64(h.DType.Size)
	n := (r1 - r0) * s.frame * size
	b := grow(raw, n)
	if !h.Fortran || len(h.Shape) == 1 {
		if err := s.readAt(b, h.DataOffset+r0*s.RowBytes()); err != nil {
			return nil, err
		}
	} else {
		// Column j (j-th element of every row, in Fortran order) of the
		// rows wanted lies at j*T + r0: one read per element of a row.
		rows, total := r1-r0, int64(h.Shape[0])
		for j := int64(0); j < s.frame; j++ {
			if err := s.readAt(b[j*rows*size:(j+1)*rows*size], h.DataOffset+(j*total+r0)*size); err != nil {
				return nil, err
			}
		}
	}
	if h.BigEndian {
		array.SwapBytes(b, int(size))
	}
	if !h.Fortran || len(h.Shape) == 1 {
		return b, nil
	}
	out := grow(dst, n)
	array.FortranToC(out, b, append([]int{int(r1 - r0)}, h.Shape[1:]...), int(size))
	return out, nil
}

func (s *NPYRows) readAt(b []byte, off int64) error {
	if k, err := s.f.ReadAt(b, off); int64(k) != int64(len(b)) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%s: reading %d bytes at offset %d: %w", s.path, len(b), off, err)
	}
	return nil
}

// Close closes the file.
func (s *NPYRows) Close() error { return s.f.Close() }

func grow(b *[]byte, n int64) []byte {
	if int64(cap(*b)) < n {
		*b = make([]byte, n)
	}
	*b = (*b)[:n]
	return *b
}
