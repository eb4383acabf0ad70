// Reading: .npy files whole, or a header first and the data streamed.

package npy

import (
	"fmt"
	"io"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/regfile"
)

// headerProbe is how many bytes ReadHeader reads first; a header that is
// longer is read in a second call.
const headerProbe = 4096 + 64

// ReadHeader reads and validates the header of the .npy file held by r,
// which is size bytes long. It reads at most MaxHeaderLen+12 bytes.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	buf := make([]byte, min(size, headerProbe))
	if _, err := r.ReadAt(buf, 0); err != nil && err != io.EOF {
		return nil, err
	}
	h, err := ParseHeader(buf, size)
	if err == nil || int64(len(buf)) == size {
		return h, err
	}
	// Possibly a header longer than the probe: read all it may need.
	buf = make([]byte, min(size, MaxHeaderLen+12))
	if _, err := r.ReadAt(buf, 0); err != nil && err != io.EOF {
		return nil, err
	}
	return ParseHeader(buf, size)
}

// Read reads the whole .npy file held by r (size bytes) with one read and
// returns its array, normalised to C order and little-endian. The returned
// Data aliases a buffer of size bytes allocated here; nothing is allocated
// before the header has been checked against size.
func Read(r io.ReaderAt, size int64) (*array.Array, error) {
	return ReadBuffer(r, size, nil)
}

// ReadBuffer is Read reusing buf when it has the capacity for the whole
// file. The returned array's Data aliases buf in that case.
func ReadBuffer(r io.ReaderAt, size int64, buf []byte) (*array.Array, error) {
	if int64(cap(buf)) >= size {
		// Room for the whole file: one read, then parse the header in place.
		buf = buf[:size]
		if n, err := r.ReadAt(buf, 0); int64(n) != size {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("%w: reading %d bytes: %w", ErrTruncated, size, err)
		}
		h, err := ParseHeader(buf[:min(size, MaxHeaderLen+12)], size)
		if err != nil {
			return nil, err
		}
		return array.New(h.Descr, h.Shape, h.Fortran, buf[h.DataOffset:])
	}
	h, err := ReadHeader(r, size)
	if err != nil {
		return nil, err
	}
	buf = make([]byte, size)
	if n, err := r.ReadAt(buf, 0); int64(n) != size {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%w: reading %d bytes: %w", ErrTruncated, size, err)
	}
	return array.New(h.Descr, h.Shape, h.Fortran, buf[h.DataOffset:])
}

// ReadFile opens, reads and closes the .npy file at path. Errors name the
// path.
func ReadFile(path string) (*array.Array, error) {
	f, st, err := regfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a, err := Read(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// Reader gives streaming access to the data of a .npy file, for files too
// large to hold in memory. The data is returned as stored: callers must
// honour Header.BigEndian and Header.Fortran themselves.
type Reader struct {
	Header *Header
	*io.SectionReader
}

// NewReader validates the header of the .npy file held by r (size bytes)
// and returns a reader positioned at the first data byte.
func NewReader(r io.ReaderAt, size int64) (*Reader, error) {
	h, err := ReadHeader(r, size)
	if err != nil {
		return nil, err
	}
	return &Reader{Header: h, SectionReader: io.NewSectionReader(r, h.DataOffset, h.DataSize)}, nil
}
