// Package array holds the one in-memory array type that every clipshard
// decoder returns, whatever file format the array came from.
//
// An Array's Data is always C-ordered (row-major) and little-endian: decoders
// normalise byte order and memory layout while loading, and record how the
// source stored it in Source, so later stages never care whether a modality
// came from a .npy file or a pickle, or how numpy laid it out.
package array

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync"
)

// Errors returned by this package; test with errors.Is.
var (
	// ErrDType marks a dtype clipshard does not handle (object, complex,
	// structured, strings, datetimes...).
	ErrDType = errors.New("array: unsupported dtype")
	// ErrShape marks a shape that is negative, overflows, or disagrees with
	// the byte count.
	ErrShape = errors.New("array: bad shape")
)

// Kind is the numpy dtype kind character: 'f' float, 'i' signed integer,
// 'u' unsigned integer, 'b' boolean.
type Kind byte

// Kinds clipshard handles.
const (
	Float Kind = 'f'
	Int   Kind = 'i'
	Uint  Kind = 'u'
	Bool  Kind = 'b'
)

// DType is a numeric element type: a kind and an item size in bytes.
type DType struct {
	Kind Kind
	Size int
}

// Common dtypes.
var (
	Float16 = DType{Float, 2}
	Float32 = DType{Float, 4}
	Float64 = DType{Float, 8}
)

// String returns numpy's name for the dtype ("float32", "int64", "bool").
func (d DType) String() string {
	switch d.Kind {
	case Float:
		return "float" + strconv.Itoa(8*d.Size)
	case Int:
		return "int" + strconv.Itoa(8*d.Size)
	case Uint:
		return "uint" + strconv.Itoa(8*d.Size)
	case Bool:
		return "bool"
	}
	return fmt.Sprintf("dtype(%c%d)", d.Kind, d.Size)
}

// Descr returns the little-endian numpy descr ("<f4", "|b1") of d.
func (d DType) Descr() string {
	if d.Size == 1 {
		return "|" + string(rune(d.Kind)) + "1"
	}
	return "<" + string(rune(d.Kind)) + strconv.Itoa(d.Size)
}

// IsFloat reports whether d is a float16/32/64.
func (d DType) IsFloat() bool { return d.Kind == Float }

// ParseDescr parses a numpy type string such as "<f4", ">f8", "|b1", "=i8"
// or "f2" and reports whether it is big-endian. Object, complex, string,
// void (structured), datetime and other kinds give an error wrapping ErrDType
// that names the dtype.
func ParseDescr(s string) (d DType, bigEndian bool, err error) {
	t := s
	if t == "" {
		return DType{}, false, fmt.Errorf("%w: empty descr", ErrDType)
	}
	switch t[0] {
	case '<', '=', '|':
		t = t[1:]
	case '>':
		bigEndian = true
		t = t[1:]
	}
	if t == "" {
		return DType{}, false, fmt.Errorf("%w: %q", ErrDType, s)
	}
	kind := t[0]
	size, perr := strconv.Atoi(t[1:])
	if kind == '?' && t == "?" {
		return DType{Bool, 1}, false, nil
	}
	switch kind {
	case 'O':
		return DType{}, false, fmt.Errorf("%w: %q is an object array (arbitrary Python objects, not numbers)", ErrDType, s)
	case 'c':
		return DType{}, false, fmt.Errorf("%w: %q is complex", ErrDType, s)
	case 'S', 'U', 'a':
		return DType{}, false, fmt.Errorf("%w: %q is a string array", ErrDType, s)
	case 'V':
		return DType{}, false, fmt.Errorf("%w: %q is a structured/void array", ErrDType, s)
	case 'M', 'm':
		return DType{}, false, fmt.Errorf("%w: %q is a datetime/timedelta array", ErrDType, s)
	}
	if perr != nil {
		return DType{}, false, fmt.Errorf("%w: %q", ErrDType, s)
	}
	ok := false
	switch Kind(kind) {
	case Float:
		ok = size == 2 || size == 4 || size == 8
	case Int, Uint:
		ok = size == 1 || size == 2 || size == 4 || size == 8
	case Bool:
		ok = size == 1
	}
	if !ok {
		return DType{}, false, fmt.Errorf("%w: %q", ErrDType, s)
	}
	if size == 1 {
		bigEndian = false
	}
	return DType{Kind(kind), size}, bigEndian, nil
}

// Array is an n-dimensional array of numbers.
//
// Data holds exactly Len()*DType.Size bytes in C order, little-endian.
// Source records how the array was stored before normalisation.
type Array struct {
	DType DType
	Shape []int
	Data  []byte
	// SourceDescr is the numpy descr of the array as stored ("<f4", ">f8").
	SourceDescr string
	// SourceFortran reports whether the source stored it in Fortran order.
	SourceFortran bool
}

// Len returns the number of elements: the product of Shape (1 for 0-d).
func (a *Array) Len() int {
	n := 1
	for _, d := range a.Shape {
		n *= d
	}
	return n
}

// Rows returns the length of axis 0 (1 for a 0-d array).
func (a *Array) Rows() int {
	if len(a.Shape) == 0 {
		return 1
	}
	return a.Shape[0]
}

// OneRow returns the array as a single row, shape [1, *Shape], on the same
// data: a per-clip value is one row of its blob, whatever its shape.
func (a *Array) OneRow() *Array {
	r := *a
	r.Shape = append([]int{1}, a.Shape...)
	return &r
}

// FrameShape returns the shape without axis 0 (the shape of one time step).
func (a *Array) FrameShape() []int {
	if len(a.Shape) == 0 {
		return nil
	}
	return a.Shape[1:]
}

// String describes the array as numpy would: "float32[120, 50]".
func (a *Array) String() string {
	return a.DType.String() + FormatShape(a.Shape)
}

// FormatShape formats a shape as "[120, 50]".
func FormatShape(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = strconv.Itoa(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// ByteSize returns the number of bytes an array of this shape and item size
// occupies, or an error wrapping ErrShape if a dimension is negative or the
// product overflows int64 (hostile headers declare such shapes).
func ByteSize(shape []int, itemSize int) (int64, error) {
	total := uint64(itemSize)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: negative dimension in %s", ErrShape, FormatShape(shape))
		}
		hi, lo := bits.Mul64(total, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%w: %s of %d-byte items overflows", ErrShape, FormatShape(shape), itemSize)
		}
		total = lo
	}
	return int64(total), nil
}

// New builds an Array from raw bytes as a source stored them, normalised in
// place: big-endian data is byte-swapped inside raw, and Fortran-ordered
// data is put in C order inside raw (through a scratch buffer kept for the
// next, rather than a new buffer each time). The Array's data is raw,
// which must hold exactly the bytes the shape declares.
func New(descr string, shape []int, fortran bool, raw []byte) (*Array, error) {
	return build(descr, shape, fortran, raw, true)
}

// NewFrom is New for bytes the caller does not give up, such as a pickle's
// payload, which several arrays may share: data is left as it is, and an
// array that needs normalising gets a buffer of its own.
func NewFrom(descr string, shape []int, fortran bool, data []byte) (*Array, error) {
	return build(descr, shape, fortran, data, false)
}

func build(descr string, shape []int, fortran bool, raw []byte, inPlace bool) (*Array, error) {
	dt, big, err := ParseDescr(descr)
	if err != nil {
		return nil, err
	}
	n, err := ByteSize(shape, dt.Size)
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) != n {
		return nil, fmt.Errorf("%w: %s of %s needs %d bytes, have %d", ErrShape, FormatShape(shape), dt, n, len(raw))
	}
	reorder := fortran && len(shape) > 1 && n > 0
	swap := big && dt.Size > 1
	data := raw
	if !inPlace && (reorder || swap) {
		data = make([]byte, n)
		if !reorder {
			copy(data, raw)
		}
	}
	switch {
	case reorder && inPlace:
		p, _ := scratch.Get().(*[]byte)
		if p == nil || cap(*p) < len(raw) {
			p = &[]byte{}
			*p = make([]byte, len(raw), 1<<bits.Len(uint(len(raw)-1)))
		}
		t := (*p)[:len(raw)]
		FortranToC(t, raw, shape, dt.Size)
		copy(raw, t)
		scratch.Put(p)
	case reorder:
		FortranToC(data, raw, shape, dt.Size)
	}
	if swap {
		SwapBytes(data, dt.Size) // an item's bytes, wherever the item went
	}
	return &Array{DType: dt, Shape: append([]int(nil), shape...), Data: data, SourceDescr: descr, SourceFortran: fortran}, nil
}

// scratch holds New's transpose buffers. A fresh buffer for each Fortran
// array was a quarter of what a convert of the mixed benchmark set
// allocated (29 of 117 MB), faulted in and zeroed page by page.
var scratch sync.Pool
