// Package npy reads and writes numpy's .npy format, as specified in
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
// (format versions 1.0, 2.0 and 3.0).
//
// Readers validate the whole header before allocating anything: the declared
// data size must match the file size exactly, so a hostile header that claims
// 10^16 bytes fails without an allocation. Arrays are returned normalised to
// C order and little-endian (see package array).
//
// The Writer streams rows of a known frame shape into a file whose data
// starts at a 4096-byte aligned offset, and patches the row count into the
// header when it is closed.
package npy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/clipshard/clipshard/formats/array"
)

// Errors returned by this package; test with errors.Is.
var (
	// ErrFormat marks a file that is not a well-formed .npy file.
	ErrFormat = errors.New("npy: invalid file")
	// ErrTruncated marks a file shorter than its header declares.
	ErrTruncated = errors.New("npy: truncated file")
)

// Magic is the six bytes every .npy file starts with.
const Magic = "\x93NUMPY"

// MaxHeaderLen bounds the header length a reader accepts. numpy itself
// refuses headers over 10000 bytes unless told otherwise; clipshard's own
// headers are 4086 bytes.
const MaxHeaderLen = 1 << 16

// DataAlign is the data offset alignment of files written by Writer.
const DataAlign = 4096

// Header is a parsed .npy header.
type Header struct {
	Major, Minor int
	Descr        string // numpy type string as stored, e.g. "<f4"
	Fortran      bool
	Shape        []int
	DType        array.DType
	BigEndian    bool
	DataOffset   int64 // byte offset of the first data byte
	DataSize     int64 // bytes of data the header declares
}

// prefixLen returns the length of the magic+version+length fields for a
// format major version.
func prefixLen(major int) int {
	if major == 1 {
		return 10
	}
	return 12
}

// ParseHeader parses the header at the start of b, which must contain at
// least the whole header (up to MaxHeaderLen+12 bytes, or the whole file if
// shorter). fileSize is the size of the whole file and is checked against
// the size the header declares. Errors wrap ErrFormat, ErrTruncated or
// array.ErrDType and name the byte offset of the problem.
func ParseHeader(b []byte, fileSize int64) (*Header, error) {
	if len(b) < 10 {
		return nil, fmt.Errorf("%w: %d bytes is too short for a .npy header", ErrTruncated, len(b))
	}
	if string(b[:6]) != Magic {
		return nil, fmt.Errorf("%w: bad magic %q at offset 0 (not a .npy file)", ErrFormat, b[:6])
	}
	h := &Header{Major: int(b[6]), Minor: int(b[7])}
	var hlen int
	switch h.Major {
	case 1:
		hlen = int(binary.LittleEndian.Uint16(b[8:]))
	case 2, 3:
		if len(b) < 12 {
			return nil, fmt.Errorf("%w: %d bytes is too short for a v%d header", ErrTruncated, len(b), h.Major)
		}
		v := binary.LittleEndian.Uint32(b[8:])
		if v > MaxHeaderLen {
			return nil, fmt.Errorf("%w: header length %d at offset 8 exceeds %d", ErrFormat, v, MaxHeaderLen)
		}
		hlen = int(v)
	default:
		return nil, fmt.Errorf("%w: unknown format version %d.%d at offset 6", ErrFormat, h.Major, h.Minor)
	}
	start := prefixLen(h.Major)
	end := start + hlen
	if int64(end) > fileSize || end > len(b) {
		return nil, fmt.Errorf("%w: header of %d bytes at offset %d runs past the end of the file (%d bytes)", ErrTruncated, hlen, start, fileSize)
	}
	text := b[start:end]
	if h.Major == 3 {
		if !utf8.Valid(text) {
			return nil, fmt.Errorf("%w: header at offset %d is not UTF-8", ErrFormat, start)
		}
	}
	if err := h.parseDict(string(text), start); err != nil {
		return nil, err
	}
	h.DataOffset = int64(end)
	dt, big, err := array.ParseDescr(h.Descr)
	if err != nil {
		return nil, err
	}
	h.DType, h.BigEndian = dt, big
	n, err := array.ByteSize(h.Shape, dt.Size)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	h.DataSize = n
	have := fileSize - h.DataOffset
	if n > have {
		return nil, fmt.Errorf("%w: header declares %s of %s = %d data bytes at offset %d, file has %d", ErrTruncated, array.FormatShape(h.Shape), h.Descr, n, h.DataOffset, have)
	}
	if n < have {
		return nil, fmt.Errorf("%w: %d trailing bytes after the %d data bytes of %s %s", ErrFormat, have-n, n, h.Descr, array.FormatShape(h.Shape))
	}
	return h, nil
}

func (h *Header) parseDict(text string, base int) error {
	p := &litParser{s: text, base: base}
	v, err := p.value(0)
	if err != nil {
		return err
	}
	p.skipSpace()
	if p.i != len(p.s) {
		return p.errf("unexpected %q after the header dict", p.s[p.i:min(len(p.s), p.i+10)])
	}
	d, ok := v.(litDict)
	if !ok {
		return fmt.Errorf("%w: header at offset %d is not a dict", ErrFormat, base)
	}
	var seen [3]bool
	for _, kv := range d {
		switch kv.key {
		case "descr":
			s, ok := kv.val.(string)
			if !ok {
				if _, isList := kv.val.([]any); isList {
					return fmt.Errorf("%w: structured dtype %v (record arrays are not numeric frames)", array.ErrDType, kv.val)
				}
				return fmt.Errorf("%w: header 'descr' is %v, not a string", ErrFormat, kv.val)
			}
			h.Descr = strings.Clone(s) // not a substring: it would keep the whole header text alive (a dataset records it per clip)
			seen[0] = true
		case "fortran_order":
			b, ok := kv.val.(bool)
			if !ok {
				return fmt.Errorf("%w: header 'fortran_order' is %v, not a bool", ErrFormat, kv.val)
			}
			h.Fortran = b
			seen[1] = true
		case "shape":
			t, ok := kv.val.(litTuple)
			if !ok {
				return fmt.Errorf("%w: header 'shape' is %v, not a tuple", ErrFormat, kv.val)
			}
			h.Shape = make([]int, len(t))
			for i, e := range t {
				n, ok := e.(int64)
				if !ok || n < 0 {
					return fmt.Errorf("%w: header 'shape' has element %v, not a non-negative int", ErrFormat, e)
				}
				h.Shape[i] = int(n)
			}
			seen[2] = true
		default:
			return fmt.Errorf("%w: header has unexpected key %q", ErrFormat, kv.key)
		}
	}
	if !seen[0] || !seen[1] || !seen[2] {
		return fmt.Errorf("%w: header at offset %d lacks one of 'descr', 'fortran_order', 'shape'", ErrFormat, base)
	}
	return nil
}

// The header is a Python literal: a dict of str keys to str, bool, int or
// tuple values (a list for structured dtypes). litParser accepts just that.
type (
	litDict []litKV
	litKV   struct {
		key string
		val any
	}
	litTuple []any
)

const maxLitDepth = 16

type litParser struct {
	s    string
	i    int
	base int
}

func (p *litParser) errf(format string, args ...any) error {
	return fmt.Errorf("%w: header syntax at offset %d: %s", ErrFormat, p.base+p.i, fmt.Sprintf(format, args...))
}

func (p *litParser) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\n' || p.s[p.i] == '\t' || p.s[p.i] == '\r' || p.s[p.i] == 0) {
		p.i++
	}
}

func (p *litParser) value(depth int) (any, error) {
	if depth > maxLitDepth {
		return nil, p.errf("nested too deeply")
	}
	p.skipSpace()
	if p.i >= len(p.s) {
		return nil, p.errf("unexpected end of header")
	}
	c := p.s[p.i]
	switch {
	case c == '{':
		p.i++
		var d litDict
		for {
			p.skipSpace()
			if p.i < len(p.s) && p.s[p.i] == '}' {
				p.i++
				return d, nil
			}
			k, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, p.errf("dict key %v is not a string", k)
			}
			p.skipSpace()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return nil, p.errf("expected ':' after key %q", ks)
			}
			p.i++
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			for _, kv := range d {
				if kv.key == ks {
					return nil, p.errf("duplicate key %q", ks)
				}
			}
			d = append(d, litKV{ks, v})
			if err := p.sep('}'); err != nil {
				return nil, err
			}
		}
	case c == '(' || c == '[':
		closer := byte(')')
		if c == '[' {
			closer = ']'
		}
		p.i++
		var items []any
		for {
			p.skipSpace()
			if p.i < len(p.s) && p.s[p.i] == closer {
				p.i++
				if closer == ')' {
					return litTuple(items), nil
				}
				return items, nil
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			items = append(items, v)
			if err := p.sep(closer); err != nil {
				return nil, err
			}
		}
	case c == '\'' || c == '"':
		j := strings.IndexByte(p.s[p.i+1:], c)
		if j < 0 {
			return nil, p.errf("unterminated string")
		}
		s := p.s[p.i+1 : p.i+1+j]
		if strings.IndexByte(s, '\\') >= 0 {
			return nil, p.errf("escapes in strings are not supported")
		}
		p.i += j + 2
		return s, nil
	case c == '-' || (c >= '0' && c <= '9'):
		j := p.i + 1
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		n, err := strconv.ParseInt(p.s[p.i:j], 10, 64)
		if err != nil {
			return nil, p.errf("bad integer %q", p.s[p.i:j])
		}
		p.i = j
		if p.i < len(p.s) && (p.s[p.i] == 'L' || p.s[p.i] == 'l') { // Python 2 long
			p.i++
		}
		return n, nil
	}
	for _, w := range []struct {
		word string
		val  any
	}{{"True", true}, {"False", false}, {"None", nil}} {
		if strings.HasPrefix(p.s[p.i:], w.word) {
			p.i += len(w.word)
			return w.val, nil
		}
	}
	return nil, p.errf("unexpected %q", p.s[p.i:min(len(p.s), p.i+10)])
}

// sep consumes a ',' or sees the closing bracket.
func (p *litParser) sep(closer byte) error {
	p.skipSpace()
	if p.i >= len(p.s) {
		return p.errf("unexpected end of header")
	}
	switch p.s[p.i] {
	case ',':
		p.i++
		return nil
	case closer:
		return nil
	}
	return p.errf("expected ',' or %q, found %q", closer, p.s[p.i])
}

// EncodeHeader returns a version 1.0 header for an array of the given descr,
// order and shape, padded with spaces so that the data starts at dataOffset
// (a multiple of 64 of at least the unpadded header size). It fails if the
// header does not fit.
func EncodeHeader(descr string, fortran bool, shape []int, dataOffset int) ([]byte, error) {
	var sb strings.Builder
	sb.WriteString("{'descr': '")
	sb.WriteString(descr)
	sb.WriteString("', 'fortran_order': ")
	if fortran {
		sb.WriteString("True")
	} else {
		sb.WriteString("False")
	}
	sb.WriteString(", 'shape': (")
	for i, d := range shape {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(strconv.Itoa(d))
	}
	if len(shape) == 1 {
		sb.WriteString(",")
	}
	sb.WriteString("), }")
	dict := sb.String()
	hlen := dataOffset - 10
	if hlen < len(dict)+1 || hlen > 0xffff || dataOffset%64 != 0 {
		return nil, fmt.Errorf("npy: header %q does not fit before data offset %d", dict, dataOffset)
	}
	out := make([]byte, dataOffset)
	copy(out, Magic)
	out[6], out[7] = 1, 0
	binary.LittleEndian.PutUint16(out[8:], uint16(hlen))
	n := copy(out[10:], dict)
	for i := 10 + n; i < dataOffset-1; i++ {
		out[i] = ' '
	}
	out[dataOffset-1] = '\n'
	return out, nil
}
