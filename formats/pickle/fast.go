// Fast path: small numpy pickles decoded without gopickle's generic
// objects.

package pickle

import (
	"bytes"
	"encoding/binary"
	"math"

	"github.com/nlpodyssey/gopickle/types"
)

// fastDecode decodes, from memory, the pickles numpy and pickle.dump make
// of dicts, lists and tuples of arrays, numbers, strings and bytes
// (protocols 2 to 5), building exactly what gopickle builds: the same
// container types, and arrays, dtypes and scalars through the same
// allow-list and the same callables. It exists for speed: gopickle copies
// every frame and allocates a 384-entry memo per pickle, which dominated
// the decoding of thousands of small pickles (14 µs for a 7 KB one).
//
// It gives up (ok false) at the first thing outside that subset, or that
// gopickle would treat differently or refuse (an unknown opcode, a read
// across a frame boundary, a sparse memo, a global outside the allow-list,
// a failing call, a stack or mark underflow): the caller then decodes with
// gopickle, which also produces the error for broken input. data has
// passed scan, which bounds every length by the bytes left; the bounds are
// checked again here all the same. TestFastMatchesGopickle and FuzzFast
// compare the two on every fixture and on fuzzed input.
func fastDecode(data []byte, alias bool) (obj any, ok bool) {
	d := &fastDecoder{data: data, alias: alias}
	d.stack, d.memo, d.marks = d.stackBuf[:0], d.memoBuf[:0], d.markBuf[:0]
	return d.run()
}

type fastDecoder struct {
	data     []byte
	alias    bool // byte strings may alias data (else they are copies: data is recycled)
	pos      int
	frameEnd int // end of the current frame, or -1 if outside any
	stack    []any
	marks    []int // stack heights at each MARK
	memo     []any
	// initial backing arrays: a numpy pickle rarely needs more
	stackBuf [32]any
	memoBuf  [64]any
	markBuf  [8]int
}

// take returns the next n bytes, or false if there are fewer, or if they
// straddle the end of the current frame (gopickle refuses that).
func (d *fastDecoder) take(n int) ([]byte, bool) {
	if n < 0 || n > len(d.data)-d.pos {
		return nil, false
	}
	if d.frameEnd >= 0 {
		if d.pos == d.frameEnd {
			d.frameEnd = -1 // the frame is used up: reads go on after it
		} else if d.pos+n > d.frameEnd {
			return nil, false
		}
	}
	b := d.data[d.pos : d.pos+n]
	d.pos += n
	return b, true
}

// uint reads a little-endian unsigned integer of w bytes (1, 2, 4 or 8).
// Values past MaxInt32 give up: no numpy pickle of a size decoded here
// has them.
func (d *fastDecoder) uint(w int) (int, bool) {
	b, ok := d.take(w)
	if !ok {
		return 0, false
	}
	var v uint64
	for i := w - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	if v > math.MaxInt32 {
		return 0, false
	}
	return int(v), true
}

// counted reads a length of w bytes, then that many bytes.
func (d *fastDecoder) counted(w int) ([]byte, bool) {
	n, ok := d.uint(w)
	if !ok {
		return nil, false
	}
	return d.take(n)
}

// argWidth is the width of the integer (a value, a length or a memo
// index) that follows the opcodes taking one.
var argWidth = [256]int{
	'K': 1, 'M': 2, // BININT1, BININT2 (the value itself)
	0x8c: 1, 'X': 4, 0x8d: 8, // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
	'C': 1, 'B': 4, 0x8e: 8, 0x96: 8, // SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
	'q': 1, 'r': 4, 'h': 1, 'j': 4, // BINPUT, LONG_BINPUT, BINGET, LONG_BINGET
}

func (d *fastDecoder) push(v any) { d.stack = append(d.stack, v) }

func (d *fastDecoder) pop() (any, bool) {
	n := len(d.stack)
	if n == 0 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] == n) {
		return nil, false // gopickle would pop across a mark: leave it to it
	}
	v := d.stack[n-1]
	d.stack = d.stack[:n-1]
	return v, true
}

func (d *fastDecoder) top() (any, bool) {
	n := len(d.stack)
	if n == 0 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] == n) {
		return nil, false
	}
	return d.stack[n-1], true
}

// operands pops an opcode's operands: the items above the last mark if
// marked, else the top n items (in stack order).
func (d *fastDecoder) operands(marked bool, n int) ([]any, bool) {
	if marked {
		return d.popMark()
	}
	items := make([]any, n)
	for i := n - 1; i >= 0; i-- {
		v, ok := d.pop()
		if !ok {
			return nil, false
		}
		items[i] = v
	}
	return items, true
}

// popMark returns a copy of the items above the last mark and drops them.
func (d *fastDecoder) popMark() ([]any, bool) {
	if len(d.marks) == 0 {
		return nil, false
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := append([]any{}, d.stack[m:]...)
	d.stack = d.stack[:m]
	return items, true
}

// put stores the top of the stack at memo index i; a gap in the indices
// would make gopickle's MEMOIZE (which uses the memo's length) differ.
func (d *fastDecoder) put(i int) bool {
	v, ok := d.top()
	switch {
	case !ok || i > len(d.memo):
		return false
	case i == len(d.memo):
		d.memo = append(d.memo, v)
	default:
		d.memo[i] = v
	}
	return true
}

// get pushes memo entry i; gopickle pushes nil for a missing one.
func (d *fastDecoder) get(i int) {
	if i < len(d.memo) {
		d.push(d.memo[i])
	} else {
		d.push(nil)
	}
}

func (d *fastDecoder) global(module, name string) bool {
	c, err := findClass(module, name)
	if err != nil {
		return false
	}
	d.push(c)
	return true
}

func (d *fastDecoder) line() (string, bool) {
	i := bytes.IndexByte(d.data[d.pos:], '\n')
	if i < 0 {
		return "", false
	}
	b, ok := d.take(i + 1)
	if !ok {
		return "", false
	}
	return string(b[:i]), true
}

func (d *fastDecoder) run() (any, bool) {
	d.frameEnd = -1
	for {
		op, ok := d.uint(1)
		if !ok {
			return nil, false
		}
		switch op {
		case 0x80: // PROTO
			if p, ok := d.uint(1); !ok || p > 5 {
				return nil, false
			}
		case 0x95: // FRAME
			if d.frameEnd >= 0 && d.pos < d.frameEnd {
				return nil, false
			}
			n, ok := d.uint(8)
			if !ok || n > len(d.data)-d.pos {
				return nil, false
			}
			d.frameEnd = d.pos + n
		case '.': // STOP
			v, ok := d.pop()
			return v, ok
		case '(': // MARK
			d.marks = append(d.marks, len(d.stack))
		case '}': // EMPTY_DICT
			d.push(types.NewDict())
		case ']': // EMPTY_LIST
			d.push(types.NewList())
		case ')': // EMPTY_TUPLE
			d.push(types.NewTupleFromSlice([]any{}))
		case 't': // TUPLE
			items, ok := d.popMark()
			if !ok {
				return nil, false
			}
			d.push(types.NewTupleFromSlice(items))
		case 0x85, 0x86, 0x87: // TUPLE1, TUPLE2, TUPLE3
			n := op - 0x84
			if len(d.stack)-n < 0 || (len(d.marks) > 0 && len(d.stack)-n < d.marks[len(d.marks)-1]) {
				return nil, false
			}
			items := append([]any{}, d.stack[len(d.stack)-n:]...)
			d.stack = d.stack[:len(d.stack)-n]
			d.push(types.NewTupleFromSlice(items))
		case 'N':
			d.push(nil)
		case 0x88:
			d.push(true)
		case 0x89:
			d.push(false)
		case 'K', 'M': // BININT1, BININT2
			v, ok := d.uint(argWidth[op])
			if !ok {
				return nil, false
			}
			d.push(v)
		case 'J': // BININT
			b, ok := d.take(4)
			if !ok {
				return nil, false
			}
			d.push(int(int32(binary.LittleEndian.Uint32(b))))
		case 'G': // BINFLOAT
			b, ok := d.take(8)
			if !ok {
				return nil, false
			}
			d.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
		case 0x8c, 'X', 0x8d: // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
			b, ok := d.counted(argWidth[op])
			if !ok {
				return nil, false
			}
			d.push(string(b))
		case 'C', 'B', 0x8e, 0x96: // SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
			b, ok := d.counted(argWidth[op])
			if !ok {
				return nil, false
			}
			if !d.alias {
				b = bytes.Clone(b) // data is a recycled buffer
			} else if b == nil {
				b = []byte{} // never nil, as gopickle's
			}
			if op == 0x96 {
				d.push(types.NewByteArrayFromSlice(b))
			} else {
				d.push(b)
			}
		case 0x94: // MEMOIZE
			if !d.put(len(d.memo)) {
				return nil, false
			}
		case 'q', 'r': // BINPUT, LONG_BINPUT
			i, ok := d.uint(argWidth[op])
			if !ok || !d.put(i) {
				return nil, false
			}
		case 'h', 'j': // BINGET, LONG_BINGET
			i, ok := d.uint(argWidth[op])
			if !ok {
				return nil, false
			}
			d.get(i)
		case 0x93: // STACK_GLOBAL
			name, ok1 := d.pop()
			module, ok2 := d.pop()
			n, ok3 := name.(string)
			m, ok4 := module.(string)
			if !ok1 || !ok2 || !ok3 || !ok4 || !d.global(m, n) {
				return nil, false
			}
		case 'c': // GLOBAL
			m, ok1 := d.line()
			n, ok2 := d.line()
			if !ok1 || !ok2 || !d.global(m, n) {
				return nil, false
			}
		case 'R': // REDUCE
			args, ok1 := d.pop()
			fn, ok2 := d.pop()
			t, ok3 := args.(*types.Tuple)
			c, ok4 := fn.(types.Callable)
			if !ok1 || !ok2 || !ok3 || !ok4 {
				return nil, false
			}
			v, err := c.Call(*t...)
			if err != nil {
				return nil, false
			}
			d.push(v)
		case 'b': // BUILD
			state, ok1 := d.pop()
			inst, ok2 := d.top()
			s, ok3 := inst.(types.PyStateSettable)
			if !ok1 || !ok2 || !ok3 || s.PySetState(state) != nil {
				return nil, false
			}
		case 's', 'u': // SETITEM (one key and value), SETITEMS (pairs above a mark)
			items, ok1 := d.operands(op == 'u', 2)
			obj, ok2 := d.top()
			dict, ok3 := obj.(types.DictSetter)
			if !ok1 || !ok2 || !ok3 || len(items)%2 != 0 {
				return nil, false
			}
			for i := 0; i < len(items); i += 2 {
				dict.Set(items[i], items[i+1])
			}
		case 'a', 'e': // APPEND (one value), APPENDS (the values above a mark)
			items, ok1 := d.operands(op == 'e', 1)
			obj, ok2 := d.top()
			list, ok3 := obj.(types.ListAppender)
			if !ok1 || !ok2 || !ok3 {
				return nil, false
			}
			for _, v := range items {
				list.Append(v)
			}
		default:
			return nil, false
		}
	}
}
