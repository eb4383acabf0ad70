// Scan: the opcode stream checked before anything is built (lengths
// bounded by the file, numbers and nesting bounded).

package pickle

import (
	"encoding/binary"
	"fmt"
	"io"
)

// argKind is the shape of a pickle opcode's inline argument, as in
// CPython's Lib/pickletools.py.
type argKind uint8

const (
	argNone  argKind = iota
	argFixed         // fixed number of bytes (argLen)
	argLen1          // 1-byte length, then data
	argLen4          // 4-byte little-endian length, then data
	argLen8          // 8-byte little-endian length, then data
	argLine          // one newline-terminated line
	argLine2         // two newline-terminated lines
	argFrame         // 8-byte length of the frame that follows
	argBad           // opcode clipshard refuses
)

type opInfo struct {
	name string
	kind argKind
	n    int // argFixed: bytes
}

// opcodes lists every opcode of pickle protocols 0-5.
var opcodes = func() [256]opInfo {
	var t [256]opInfo
	set := func(op byte, name string, kind argKind, n int) { t[op] = opInfo{name, kind, n} }
	for _, op := range []struct {
		op   byte
		name string
	}{
		{'(', "MARK"}, {'.', "STOP"}, {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"},
		{'N', "NONE"}, {'R', "REDUCE"}, {'a', "APPEND"}, {'b', "BUILD"}, {'d', "DICT"},
		{'}', "EMPTY_DICT"}, {'e', "APPENDS"}, {'l', "LIST"}, {']', "EMPTY_LIST"},
		{'s', "SETITEM"}, {'t', "TUPLE"}, {')', "EMPTY_TUPLE"},
		{'u', "SETITEMS"}, {0x81, "NEWOBJ"}, {0x85, "TUPLE1"}, {0x86, "TUPLE2"},
		{0x87, "TUPLE3"}, {0x88, "NEWTRUE"}, {0x89, "NEWFALSE"}, {0x8f, "EMPTY_SET"},
		{0x90, "ADDITEMS"}, {0x91, "FROZENSET"}, {0x92, "NEWOBJ_EX"},
		{0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"}, {0x98, "READONLY_BUFFER"},
	} {
		set(op.op, op.name, argNone, 0)
	}
	set('J', "BININT", argFixed, 4)
	set('K', "BININT1", argFixed, 1)
	set('M', "BININT2", argFixed, 2)
	set('G', "BINFLOAT", argFixed, 8)
	set('h', "BINGET", argFixed, 1)
	set('j', "LONG_BINGET", argFixed, 4)
	set('q', "BINPUT", argFixed, 1)
	set('r', "LONG_BINPUT", argFixed, 4)
	set(0x80, "PROTO", argFixed, 1)
	set(0x8a, "LONG1", argLen1, 0)
	set(0x8b, "LONG4", argLen4, 0)
	set('U', "SHORT_BINSTRING", argLen1, 0)
	set('C', "SHORT_BINBYTES", argLen1, 0)
	set(0x8c, "SHORT_BINUNICODE", argLen1, 0)
	set('T', "BINSTRING", argLen4, 0)
	set('B', "BINBYTES", argLen4, 0)
	set('X', "BINUNICODE", argLen4, 0)
	set(0x8d, "BINUNICODE8", argLen8, 0)
	set(0x8e, "BINBYTES8", argLen8, 0)
	set(0x96, "BYTEARRAY8", argLen8, 0)
	set(0x95, "FRAME", argFrame, 0)
	for _, op := range []struct {
		op   byte
		name string
	}{{'F', "FLOAT"}, {'I', "INT"}, {'L', "LONG"}, {'S', "STRING"}, {'V', "UNICODE"}, {'g', "GET"}, {'p', "PUT"}} {
		set(op.op, op.name, argLine, 0)
	}
	set('c', "GLOBAL", argLine2, 0)
	// OBJ and INST build instances the protocol 0/1 way; numpy pickles of
	// protocol 2+ never use them.
	set('o', "OBJ", argBad, 0)
	set('i', "INST", argBad, 0)
	set('P', "PERSID", argBad, 0)
	set('Q', "BINPERSID", argBad, 0)
	set(0x82, "EXT1", argBad, 0)
	set(0x83, "EXT2", argBad, 0)
	set(0x84, "EXT4", argBad, 0)
	set(0x97, "NEXT_BUFFER", argBad, 0)
	return t
}()

// MaxOpcodes bounds the opcodes of a pickle. Every opcode can make the
// unpickler allocate an object (and its error messages print them), so a
// file of millions of small opcodes could cost far more memory than its
// size; a pickle of numpy arrays has a few per array.
const MaxOpcodes = 1 << 20

// Bounds on numbers: LONG1/LONG4 integers (bytes) and the text lines of
// INT, LONG, FLOAT, GET and PUT. Arbitrary-precision integers decode in
// quadratic time, so a small file could cost minutes.
const (
	maxIntBytes   = 16
	maxNumberLine = 64
	// maxMarks bounds the MARKs open at once: each makes the unpickler
	// set a stack aside, and a pickle of numpy arrays nests containers a
	// few levels deep.
	maxMarks = 1000
)

// scanner reads a pickle held by an io.ReaderAt through a small window,
// skipping over payloads without reading them.
type scanner struct {
	r    io.ReaderAt
	size int64
	off  int64 // next byte to scan
	win  []byte
	woff int64 // file offset of win[0]
}

func (s *scanner) byteAt(off int64) (byte, error) {
	if off < s.woff || off >= s.woff+int64(len(s.win)) {
		n := min(int64(cap(s.win)), s.size-off)
		s.win = s.win[:n]
		if _, err := s.r.ReadAt(s.win, off); err != nil && err != io.EOF {
			return 0, err
		}
		s.woff = off
	}
	return s.win[off-s.woff], nil
}

func (s *scanner) readN(n int) ([]byte, error) {
	var b [8]byte
	for i := 0; i < n; i++ {
		c, err := s.byteAt(s.off + int64(i))
		if err != nil {
			return nil, err
		}
		b[i] = c
	}
	s.off += int64(n)
	return b[:n], nil
}

// scan walks the opcode stream of the pickle held by r (size bytes) without
// building anything. It checks that every opcode is known and allowed, that
// every length-prefixed argument fits in the bytes left in the file, that
// lines end before the file does, that the stream ends with STOP, and that
// nothing follows it. This bounds every allocation the unpickler makes by
// the file size. Errors name the byte offset of the offending opcode.
// If mem is not nil it holds the whole file.
func scan(r io.ReaderAt, size int64, mem []byte) error {
	s := &scanner{r: r, size: size, win: mem}
	if mem == nil {
		s.win, s.woff = make([]byte, 0, min(size, 64<<10)), -1
	}
	ops, marks := 0, 0
	if size == 0 {
		return fmt.Errorf("%w: empty file", ErrTruncated)
	}
	if first, err := s.byteAt(0); err != nil {
		return err
	} else if first != 0x80 {
		return fmt.Errorf("%w: starts with byte 0x%02x, not the PROTO opcode 0x80: not a pickle of protocol 2-5 (a protocol 0/1 pickle must be re-saved with protocol>=2)", ErrFormat, first)
	}
	for {
		if s.off >= size {
			return fmt.Errorf("%w: no STOP opcode before the end of the file at offset %d", ErrTruncated, size)
		}
		at := s.off
		op, err := s.byteAt(at)
		if err != nil {
			return err
		}
		if ops++; ops > MaxOpcodes {
			return fmt.Errorf("%w: more than %d opcodes (at offset %d): not a pickle of numpy arrays", ErrRefused, MaxOpcodes, at)
		}
		s.off++
		info := opcodes[op]
		if info.name == "" {
			return fmt.Errorf("%w: unknown opcode 0x%02x at offset %d", ErrFormat, op, at)
		}
		left := size - s.off
		need := func(n uint64) error {
			if n > uint64(left) {
				return fmt.Errorf("%w: %s at offset %d declares %d bytes, only %d left in the file", ErrTruncated, info.name, at, n, left)
			}
			s.off += int64(n)
			return nil
		}
		switch info.kind {
		case argFixed:
			err = need(uint64(info.n))
		case argLen1, argLen4, argLen8, argFrame:
			w := 8
			switch info.kind {
			case argLen1:
				w = 1
			case argLen4:
				w = 4
			}
			if err = need(uint64(w)); err != nil {
				break
			}
			s.off -= int64(w)
			b, rerr := s.readN(w)
			if rerr != nil {
				return rerr
			}
			left = size - s.off
			var n uint64
			switch w {
			case 1:
				n = uint64(b[0])
			case 4:
				v := int32(binary.LittleEndian.Uint32(b))
				if v < 0 {
					return fmt.Errorf("%w: %s at offset %d has negative length %d", ErrFormat, info.name, at, v)
				}
				n = uint64(v)
			case 8:
				n = binary.LittleEndian.Uint64(b)
			}
			if (op == 0x8a || op == 0x8b) && n > maxIntBytes { // LONG1, LONG4
				// Python ints of any size decode in time quadratic in their
				// length; numpy pickles never need one beyond 64 bits.
				return fmt.Errorf("%w: %s at offset %d is an integer of %d bytes; a pickle of numpy arrays needs at most %d", ErrRefused, info.name, at, n, maxIntBytes)
			}
			if info.kind == argFrame {
				// The frame's contents are opcodes: check its length, then
				// keep scanning inside it.
				if n > uint64(left) {
					return fmt.Errorf("%w: FRAME at offset %d declares %d bytes, only %d left in the file", ErrTruncated, at, n, left)
				}
				break
			}
			err = need(n)
		case argLine, argLine2:
			lines := 1
			if info.kind == argLine2 {
				lines = 2
			}
			numeric := op == 'I' || op == 'L' || op == 'F' || op == 'g' || op == 'p'
			for l := 0; l < lines; l++ {
				for start := s.off; ; {
					if s.off >= size {
						return fmt.Errorf("%w: %s at offset %d: line not terminated before the end of the file", ErrTruncated, info.name, at)
					}
					if numeric && s.off-start > maxNumberLine {
						return fmt.Errorf("%w: %s at offset %d: a number longer than %d characters; a pickle of numpy arrays has none", ErrRefused, info.name, at, maxNumberLine)
					}
					c, rerr := s.byteAt(s.off)
					if rerr != nil {
						return rerr
					}
					s.off++
					if c == '\n' {
						break
					}
				}
			}
		case argBad:
			return fmt.Errorf("%w: %s at offset %d (protocol 0/1 instances, persistent ids, extension codes and out-of-band buffers are not supported)", ErrRefused, info.name, at)
		}
		if err != nil {
			return err
		}
		switch op {
		case '(': // MARK
			if marks++; marks > maxMarks {
				return fmt.Errorf("%w: more than %d MARKs open at once (at offset %d): not a pickle of numpy arrays", ErrRefused, maxMarks, at)
			}
		case 'e', 'u', 't', 'l', 'd', '1', 0x90, 0x91: // APPENDS, SETITEMS, TUPLE, LIST, DICT, POP_MARK, ADDITEMS, FROZENSET
			marks = max(0, marks-1)
		}
		if op == 0x80 { // PROTO
			if v, _ := s.byteAt(at + 1); v > 5 {
				return fmt.Errorf("%w: protocol %d at offset %d is newer than 5", ErrFormat, v, at)
			}
		}
		if op == '.' {
			if s.off != size {
				return fmt.Errorf("%w: %d bytes after STOP at offset %d (more than one pickle in the file?)", ErrFormat, size-s.off, at)
			}
			return nil
		}
	}
}
