// Package pickle decodes Python pickles (protocols 2 to 5) that hold numpy
// arrays, without executing anything.
//
// The opcode stream is first scanned (see CPython's Lib/pickletools.py for
// the opcode set) so that every declared length is bounded by the bytes left
// in the file; then github.com/nlpodyssey/gopickle builds the objects, with
// an allow-list that names the only globals a pickle may use: numpy's array
// reconstruction (numpy 1.x numpy.core and numpy 2.x numpy._core names),
// numpy.dtype, numpy scalars, and what protocol 2 needs to spell bytes. Any
// other global (os.system, builtins.eval, ...) is refused by name.
//
// Arrays come back as *NDArray in a tree of gopickle's containers; Select
// picks arrays out of it by key path.
package pickle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	gopickle "github.com/nlpodyssey/gopickle/pickle"
)

// Errors returned by this package; test with errors.Is.
var (
	// ErrFormat marks a malformed pickle.
	ErrFormat = errors.New("pickle: invalid pickle")
	// ErrTruncated marks a pickle that ends early or declares more bytes
	// than it has.
	ErrTruncated = errors.New("pickle: truncated pickle")
	// ErrRefused marks a pickle that asks for something clipshard does not
	// allow (a global outside the allow-list, persistent ids, ...).
	ErrRefused = errors.New("pickle: refused")
	// ErrKey marks a key path that does not select an array.
	ErrKey = errors.New("pickle: key")
)

// Decode decodes the pickle held by r, which is size bytes long, and returns
// its root object. Large byte strings (array payloads) are read from r
// straight into the buffers that back the returned arrays: no copy is made
// after the read. Errors carry the byte offset at which decoding stopped;
// Decode never panics on bad input.
func Decode(r io.ReaderAt, size int64) (obj any, err error) {
	return DecodeIn(r, size, nil)
}

// DecodeIn is Decode reading the whole pickle into buf (when it holds at
// least size bytes, else as Decode does); what is decoded then may alias
// buf (array payloads are not copied out of it): the caller keeps buf, and
// leaves it as it is, while it uses them.
func DecodeIn(r io.ReaderAt, size int64, buf []byte) (obj any, err error) {
	if int64(len(buf)) >= size {
		mem := buf[:size]
		if n, err := r.ReadAt(mem, 0); int64(n) != size {
			return nil, fmt.Errorf("%w: reading %d bytes: %w", ErrTruncated, size, err)
		}
		if err := scan(bytes.NewReader(mem), size, mem); err != nil {
			return nil, err
		}
		if obj, ok := fastDecodeSafe(mem, true); ok {
			return obj, nil
		}
		return slowDecode(bytes.NewReader(mem), size, mem)
	}
	var mem []byte
	if size <= smallFile {
		// One read for small files; scanning and decoding then work on
		// that buffer. Nothing decoded aliases it (gopickle copies what it
		// keeps), so it is recycled.
		b := smallBufs.Get().(*[]byte)
		defer smallBufs.Put(b)
		mem = (*b)[:size]
		if n, err := r.ReadAt(mem, 0); int64(n) != size {
			return nil, fmt.Errorf("%w: reading %d bytes: %w", ErrTruncated, size, err)
		}
		r = bytes.NewReader(mem)
	}
	if err := scan(r, size, mem); err != nil {
		return nil, err
	}
	if mem != nil {
		if obj, ok := fastDecodeSafe(mem, false); ok {
			return obj, nil
		}
	}
	return slowDecode(r, size, mem)
}

// fastDecodeSafe is fastDecode, giving up on a panic too.
func fastDecodeSafe(data []byte, alias bool) (obj any, ok bool) {
	defer func() {
		if recover() != nil {
			obj, ok = nil, false
		}
	}()
	return fastDecode(data, alias)
}

// slowDecode decodes with gopickle (after scan).
func slowDecode(r io.ReaderAt, size int64, mem []byte) (obj any, err error) {
	pr := &posReader{r: r, size: size}
	if mem != nil {
		pr.buf = mem // the whole file: never refilled
	} else {
		pr.buf = make([]byte, 0, 64<<10)
	}
	defer func() {
		if p := recover(); p != nil {
			obj, err = nil, fmt.Errorf("%w: decoder failed near offset %d: %v", ErrFormat, pr.pos, p)
		}
	}()
	u := gopickle.NewUnpickler(pr)
	u.FindClass = findClass
	obj, err = u.Load()
	if err != nil {
		if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrTruncated) {
			// gopickle's own messages can print whole objects: keep one
			// short line.
			msg := err.Error()
			if len(msg) > 200 {
				msg = msg[:200] + "..."
			}
			err = fmt.Errorf("%w: %s", ErrFormat, msg)
		}
		return nil, fmt.Errorf("%w (near offset %d)", err, pr.pos)
	}
	return obj, nil
}

// smallFile is the size up to which Decode reads a pickle with one read.
const smallFile = 64 << 10

var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallFile); return &b }}

// DecodeFile opens, decodes and closes the pickle at path; see Decode.
// Errors name the path.
func DecodeFile(path string) (any, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	obj, err := Decode(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return obj, nil
}

// posReader is a buffered reader over an io.ReaderAt that knows its
// position. Reads at least as large as its buffer go straight into the
// caller's slice, so an array payload is read once, into its final buffer.
type posReader struct {
	r    io.ReaderAt
	size int64
	pos  int64 // bytes consumed by the unpickler
	buf  []byte
	bpos int // next unread byte in buf
	boff int64
}

func (p *posReader) fill() error {
	if p.pos >= p.size {
		return io.EOF
	}
	n := min(int64(cap(p.buf)), p.size-p.pos)
	p.buf = p.buf[:n]
	m, err := p.r.ReadAt(p.buf, p.pos)
	p.buf = p.buf[:m]
	p.bpos = 0
	p.boff = p.pos
	if m == 0 {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

func (p *posReader) ReadByte() (byte, error) {
	if p.bpos >= len(p.buf) {
		if err := p.fill(); err != nil {
			return 0, err
		}
	}
	c := p.buf[p.bpos]
	p.bpos++
	p.pos++
	return c, nil
}

func (p *posReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if p.bpos < len(p.buf) {
		n := copy(b, p.buf[p.bpos:])
		p.bpos += n
		p.pos += int64(n)
		return n, nil
	}
	if len(b) >= cap(p.buf) {
		if p.pos >= p.size {
			return 0, io.EOF
		}
		want := min(int64(len(b)), p.size-p.pos)
		n, err := p.r.ReadAt(b[:want], p.pos)
		p.pos += int64(n)
		if n > 0 {
			err = nil
		}
		return n, err
	}
	if err := p.fill(); err != nil {
		return 0, err
	}
	return p.Read(b)
}
