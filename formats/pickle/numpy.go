// numpy: the allow-listed globals (array reconstruction, dtype, scalars)
// and how they build arrays.

package pickle

import (
	"fmt"
	"math/big"

	"github.com/nlpodyssey/gopickle/types"

	"github.com/clipshard/clipshard/formats/array"
)

// NDArray is a numpy array rebuilt from a pickle. Arrays whose dtype
// clipshard cannot use (object, structured, ...) still decode, so that a
// pickle whose other keys are fine can be used; Array then returns Err.
type NDArray struct {
	arr *array.Array
	err error
}

// Array returns the decoded array (C order, little-endian), or the reason it
// cannot be used.
func (a *NDArray) Array() (*array.Array, error) {
	if a.err != nil {
		return nil, a.err
	}
	if a.arr == nil {
		return nil, fmt.Errorf("%w: ndarray was created but never given its data (missing BUILD)", ErrFormat)
	}
	return a.arr, nil
}

// PySetState implements numpy's ndarray.__setstate__ for the state tuple
// (version, shape, dtype, is_fortran, data) or the older 4-tuple without
// version.
func (a *NDArray) PySetState(state any) error {
	t, ok := state.(*types.Tuple)
	if !ok {
		return fmt.Errorf("%w: ndarray state is %s, not a tuple", ErrFormat, typeName(state))
	}
	items := []any(*t)
	switch len(items) {
	case 5:
		items = items[1:]
	case 4:
	default:
		return fmt.Errorf("%w: ndarray state has %d items, want 4 or 5", ErrFormat, len(items))
	}
	shape, err := toShape(items[0])
	if err != nil {
		return err
	}
	dt, ok := items[1].(*DType)
	if !ok {
		return fmt.Errorf("%w: ndarray state dtype is %s", ErrFormat, typeName(items[1]))
	}
	fortran, ok := items[2].(bool)
	if !ok {
		return fmt.Errorf("%w: ndarray state is_fortran is %s", ErrFormat, typeName(items[2]))
	}
	if dt.err != nil {
		a.err = dt.err
		return nil
	}
	data, ok := toBytes(items[3])
	if !ok {
		a.err = fmt.Errorf("%w: ndarray data is %s, not bytes", array.ErrDType, typeName(items[3]))
		return nil
	}
	a.arr, a.err = array.NewFrom(dt.Descr(), shape, fortran, data)
	return nil
}

// DType is numpy.dtype rebuilt from a pickle.
type DType struct {
	typestr string // e.g. "f4", as given to the constructor
	endian  string // from the state: "<", ">", "|", "="
	err     error
}

// Descr returns the numpy descr, e.g. "<f4".
func (d *DType) Descr() string { return d.endian + d.typestr }

// PySetState implements numpy.dtype.__setstate__ for state
// (version, endian, subarray, names, fields, elsize, alignment, flags[, metadata]).
func (d *DType) PySetState(state any) error {
	t, ok := state.(*types.Tuple)
	if !ok || t.Len() < 8 {
		return fmt.Errorf("%w: dtype state is %s, want a tuple of 8 or 9", ErrFormat, typeName(state))
	}
	e, ok := t.Get(1).(string)
	if !ok || len(e) != 1 {
		return fmt.Errorf("%w: dtype byte order is %s", ErrFormat, typeName(t.Get(1)))
	}
	d.endian = e
	if t.Get(2) != nil {
		d.err = fmt.Errorf("%w: sub-array dtype %q", array.ErrDType, d.typestr)
	}
	if t.Get(3) != nil {
		d.err = fmt.Errorf("%w: structured dtype %q (record arrays are not numeric frames)", array.ErrDType, d.typestr)
	}
	if d.err == nil {
		_, _, d.err = array.ParseDescr(d.Descr())
	}
	return nil
}

// Scalar is a numpy scalar (np.float32(30.0)) rebuilt from a pickle: its
// dtype and its raw bytes (or, for object scalars, the object).
type Scalar struct {
	DType *DType
	Value any
}

// The callables the allow-list hands to the unpickler. None of them runs
// anything but the construction of a plain value.
type (
	ndarrayClass    struct{}
	reconstructFunc struct{}
	frombufferFunc  struct{}
	dtypeClass      struct{}
	scalarFunc      struct{}
	codecsEncode    struct{}
	bytesClass      struct{}
)

// Call implements numpy.core.multiarray._reconstruct(ndarray, (0,), b'b'):
// an empty array that BUILD then fills.
func (reconstructFunc) Call(args ...any) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("%w: _reconstruct needs a class", ErrFormat)
	}
	if _, ok := args[0].(ndarrayClass); !ok {
		return nil, fmt.Errorf("%w: _reconstruct of %s, only numpy.ndarray is allowed", ErrRefused, typeName(args[0]))
	}
	return &NDArray{}, nil
}

// Call implements numpy.core.numeric._frombuffer(buf, dtype, shape, order),
// which numpy uses for protocol 5.
func (frombufferFunc) Call(args ...any) (any, error) {
	if len(args) != 4 {
		return nil, fmt.Errorf("%w: _frombuffer takes 4 arguments, got %d", ErrFormat, len(args))
	}
	dt, ok := args[1].(*DType)
	if !ok {
		return nil, fmt.Errorf("%w: _frombuffer dtype is %s", ErrFormat, typeName(args[1]))
	}
	shape, err := toShape(args[2])
	if err != nil {
		return nil, err
	}
	order, _ := args[3].(string)
	if order != "C" && order != "F" {
		return nil, fmt.Errorf("%w: _frombuffer order %q", ErrFormat, order)
	}
	a := &NDArray{}
	if dt.err != nil {
		a.err = dt.err
		return a, nil
	}
	data, ok := toBytes(args[0])
	if !ok {
		return nil, fmt.Errorf("%w: _frombuffer buffer is %s", ErrFormat, typeName(args[0]))
	}
	a.arr, a.err = array.NewFrom(dt.Descr(), shape, order == "F", data)
	return a, nil
}

// Call implements numpy.dtype(typestr, align, copy).
func (dtypeClass) Call(args ...any) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("%w: dtype needs a type string", ErrFormat)
	}
	s, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("%w: dtype of %s", ErrFormat, typeName(args[0]))
	}
	return &DType{typestr: s, endian: "|"}, nil
}

// Call implements numpy.core.multiarray.scalar(dtype, data).
func (scalarFunc) Call(args ...any) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("%w: scalar needs a dtype", ErrFormat)
	}
	dt, ok := args[0].(*DType)
	if !ok {
		return nil, fmt.Errorf("%w: scalar dtype is %s", ErrFormat, typeName(args[0]))
	}
	var v any
	if len(args) > 1 {
		v = args[1]
	}
	return &Scalar{DType: dt, Value: v}, nil
}

// Call implements _codecs.encode(str, 'latin1'), which protocol 2 uses to
// pickle bytes objects.
func (codecsEncode) Call(args ...any) (any, error) {
	if len(args) != 2 {
		return nil, fmt.Errorf("%w: _codecs.encode takes 2 arguments, got %d", ErrFormat, len(args))
	}
	s, ok1 := args[0].(string)
	enc, ok2 := args[1].(string)
	if !ok1 || !ok2 || (enc != "latin1" && enc != "latin-1" && enc != "iso-8859-1") {
		return nil, fmt.Errorf("%w: _codecs.encode(%s, %v): only latin1 strings are allowed", ErrRefused, typeName(args[0]), args[1])
	}
	// s is UTF-8; latin1 characters are one byte (< 0x80) or two (0xC2 or
	// 0xC3, then a continuation byte). Array payloads are random bytes, so
	// decode without data-dependent branches and check validity once.
	out := make([]byte, len(s))
	n := 0
	var bad byte
	i := 0
	for ; i+1 < len(s); n++ {
		c, next := s[i], s[i+1]
		hi := c >> 7 // 1 for a two-byte character
		two := (c&0x03)<<6 | next&0x3f
		mask := -hi // 0x00 or 0xff
		out[n] = c ^ ((c ^ two) & mask)
		bad |= mask & (((c >> 1) ^ 0x61) | ((next >> 6) ^ 2))
		i += 1 + int(hi)
	}
	if i < len(s) { // a last one-byte character
		bad |= s[i] >> 7
		out[n] = s[i]
		n++
	}
	if bad != 0 {
		return nil, fmt.Errorf("%w: _codecs.encode: string has a character beyond latin1", ErrFormat)
	}
	return out[:n], nil
}

// Call implements bytes() (empty bytes in protocol 2).
func (bytesClass) Call(args ...any) (any, error) {
	if len(args) == 0 {
		return []byte{}, nil
	}
	if b, ok := toBytes(args[0]); ok && len(args) == 1 {
		return append([]byte(nil), b...), nil
	}
	return nil, fmt.Errorf("%w: bytes(%s)", ErrRefused, typeName(args[0]))
}

// findClass is the allow-list: the only globals a pickle may name. Anything
// else is refused by name.
func findClass(module, name string) (any, error) {
	switch module + "." + name {
	case "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct":
		return reconstructFunc{}, nil
	case "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer":
		return frombufferFunc{}, nil
	case "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar":
		return scalarFunc{}, nil
	case "numpy.dtype":
		return dtypeClass{}, nil
	case "numpy.ndarray":
		return ndarrayClass{}, nil
	case "_codecs.encode":
		return codecsEncode{}, nil
	case "builtins.bytes", "__builtin__.bytes":
		return bytesClass{}, nil
	}
	return nil, fmt.Errorf("%w: global %s.%s (only numpy arrays, dtypes, scalars and plain containers are allowed)", ErrRefused, module, name)
}

func toShape(v any) ([]int, error) {
	t, ok := v.(*types.Tuple)
	if !ok {
		return nil, fmt.Errorf("%w: shape is %s, not a tuple", ErrFormat, typeName(v))
	}
	shape := make([]int, t.Len())
	for i, e := range *t {
		n, ok := e.(int)
		if !ok || n < 0 {
			if _, isBig := e.(*big.Int); isBig {
				return nil, fmt.Errorf("%w: shape dimension %v is too large", array.ErrShape, e)
			}
			return nil, fmt.Errorf("%w: shape dimension %v is not a non-negative int", array.ErrShape, e)
		}
		shape[i] = n
	}
	return shape, nil
}

// toBytes returns the bytes of a bytes, bytearray or (Python 2) str value.
func toBytes(v any) ([]byte, bool) {
	switch b := v.(type) {
	case []byte:
		return b, true
	case *types.ByteArray:
		return []byte(*b), true
	case string:
		return []byte(b), true
	}
	return nil, false
}

// typeName names the Python type of a decoded value, for error messages.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *types.ByteArray:
		return "bytearray"
	case *types.Tuple:
		return "tuple"
	case *types.List:
		return "list"
	case *types.Dict, *types.OrderedDict:
		return "dict"
	case *NDArray:
		return "ndarray"
	case *DType:
		return "dtype"
	case *Scalar:
		return "numpy scalar"
	case *types.GenericClass:
		return "class"
	}
	return fmt.Sprintf("%T", v)
}
