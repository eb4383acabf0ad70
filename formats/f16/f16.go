// Package f16 converts float32, float64, float16 and integer arrays to IEEE
// binary16 (float16) exactly as numpy's astype(np.float16) does: round to
// nearest, ties to even; float64 is converted directly, never via float32
// (which would round twice). NaN stays NaN (payload bits may differ).
//
// Every conversion audits its input in the same pass (see Stats): NaN and
// infinite inputs, finite values that overflow to ±Inf, non-zero values
// that underflow to ±0, and the largest finite magnitude. The kernels only
// count; callers decide what is an error.
//
// On amd64 CPUs with F16C and AVX2 the float32 path uses VCVTPS2PH; it is
// tested bit for bit against the portable path (github.com/x448/float16)
// over all 2^32 inputs.
package f16

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/x448/float16"

	"github.com/clipshard/clipshard/formats/array"
)

// Stats is the audit of a conversion.
type Stats struct {
	NaN       int64   // NaN inputs
	InfIn     int64   // ±Inf inputs
	Overflow  int64   // finite inputs that became ±Inf
	Underflow int64   // non-zero inputs that became ±0
	MaxAbs    float64 // largest finite |input|
}

// Add accumulates o into s.
func (s *Stats) Add(o Stats) {
	s.NaN += o.NaN
	s.InfIn += o.InfIn
	s.Overflow += o.Overflow
	s.Underflow += o.Underflow
	s.MaxAbs = max(s.MaxAbs, o.MaxAbs)
}

// Thresholds on |x| as float32 bits: at or above overflow32 a finite value
// rounds to Inf (65520 is a tie between 65504 and 65536 and goes to even,
// which is Inf); at or below underflow32 a value rounds to 0 (2^-25 is a tie
// between 0 and the smallest subnormal 2^-24 and goes to even, 0).
const (
	overflow32  = 0x477ff000 // 65520
	underflow32 = 0x33000000 // 2^-25
	inf32       = 0x7f800000
)

// Accelerated reports whether FromFloat32 uses the F16C assembly kernel on
// this machine.
func Accelerated() bool { return useAsm }

// FromFloat32 converts src into dst (len(dst) must be at least len(src))
// and adds the audit of src to st. With st nil nothing is audited.
func FromFloat32(dst []uint16, src []float32, st *Stats) {
	if len(dst) < len(src) {
		panic("f16: dst too short")
	}
	n := len(src)
	done := 0
	if useAsm && n >= 16 {
		done = fromFloat32Asm(dst, src, st)
	}
	if done < n {
		FromFloat32Portable(dst[done:n], src[done:], st)
	}
}

// FromFloat32Portable is FromFloat32 in pure Go, using
// github.com/x448/float16 for the rounding. It is the reference the
// assembly is tested against.
func FromFloat32Portable(dst []uint16, src []float32, st *Stats) {
	if st == nil {
		for i, f := range src {
			dst[i] = float16.Fromfloat32(f).Bits()
		}
		return
	}
	var s Stats
	var maxBits uint32
	for i, f := range src {
		b := math.Float32bits(f)
		dst[i] = float16.Fromfloat32(f).Bits()
		a := b &^ (1 << 31)
		switch {
		case a > inf32:
			s.NaN++
		case a == inf32:
			s.InfIn++
		case a >= overflow32:
			s.Overflow++
			maxBits = max(maxBits, a)
		case a != 0 && a <= underflow32:
			s.Underflow++
			maxBits = max(maxBits, a)
		default:
			maxBits = max(maxBits, a)
		}
	}
	s.MaxAbs = float64(math.Float32frombits(maxBits))
	st.Add(s)
}

// Float64ToBits converts f to float16 bits directly, rounding to nearest
// even once, as numpy's npy_double_to_half does.
func Float64ToBits(f float64) uint16 {
	b := math.Float64bits(f)
	a := b &^ (1 << 63)
	// Normal float16 range, 2^-14 <= |f| < 2^16: rebias the exponent
	// (1023-15 = 1008) and round the mantissa to 10 bits without branches;
	// a carry out of the mantissa bumps the exponent, up to Inf.
	if a-normLo64 < normHi64-normLo64 {
		v := a - 1008<<52
		return uint16(b>>48)&0x8000 | uint16((v+(1<<41-1)+(v>>42)&1)>>42)
	}
	return float64ToBitsRare(b)
}

// Bits of 2^-14 and 2^16: |x| in [normLo64, normHi64) converts to a normal
// float16 (or rounds up to Inf) on the branch-free path.
const normLo64, normHi64 = 0x3f10000000000000, 0x40f0000000000000

// float64ToBitsRare converts the values outside float16's normal range:
// zeros, subnormal results, overflow, Inf and NaN.
func float64ToBitsRare(b uint64) uint16 {
	sign := uint16(b>>48) & 0x8000
	exp := int((b >> 52) & 0x7ff)
	man := b & (1<<52 - 1)
	if exp == 0x7ff {
		if man != 0 {
			// Keep the top payload bits, and make sure it stays a NaN.
			return sign | 0x7e00 | uint16(man>>42)
		}
		return sign | 0x7c00
	}
	e := exp - 1023 + 15 // float16 biased exponent
	if e >= 31 {
		return sign | 0x7c00
	}
	if e <= 0 {
		if exp == 0 {
			return sign // zero or float64 subnormal: far below 2^-25
		}
		m := man | 1<<52
		shift := uint(42 + 1 - e)
		if shift > 53 {
			return sign // below half the smallest subnormal
		}
		r := m >> shift
		rem := m & (1<<shift - 1)
		half := uint64(1) << (shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint64(e)<<10 | man>>42
	rem := man & (1<<42 - 1)
	const half = 1 << 41
	if rem > half || (rem == half && r&1 == 1) {
		r++ // a carry into the exponent is right, up to Inf
	}
	return sign | uint16(r)
}

// Float64 thresholds on |x| bits, as for float32 above.
const (
	inf64       = 0x7ff0000000000000
	overflow64  = 0x40effe0000000000 // 65520
	underflow64 = 0x3e60000000000000 // 2^-25
)

// FromFloat64 converts src into dst directly (see Float64ToBits) and adds
// the audit of src to st (unless st is nil).
//
// On amd64 with AVX2, blocks of 16 values that are zeros or convert to
// normal float16 (the common case) go through f64ToF16Screen, the same
// integer arithmetic four lanes at a time; the other blocks, and the
// rest, through the Go code below, which screens blocks of 64 values with
// a running max and min of |x| and counts only in blocks that hold
// something to count.
func FromFloat64(dst []uint16, src []float64, st *Stats) {
	if len(dst) < len(src) {
		panic("f16: dst too short")
	}
	dst = dst[:len(src)]
	if st == nil && !useAsm {
		for i, f := range src {
			b := math.Float64bits(f)
			if a := b &^ (1 << 63); a-normLo64 < normHi64-normLo64 { // Float64ToBits, inlined
				v := a - 1008<<52
				dst[i] = uint16(b>>48)&0x8000 | uint16((v+(1<<41-1)+(v>>42)&1)>>42)
			} else {
				dst[i] = float64ToBitsRare(b)
			}
		}
		return
	}
	var s Stats
	var maxBits uint64
	off := 0
	if useAsm {
		blocks := len(src) &^ 15
		for off < blocks {
			var m [4]uint64
			off += f64ToF16Screen(&dst[off], &src[off], blocks-off, &m)
			maxBits = max(maxBits, m[0], m[1], m[2], m[3])
			if off < blocks {
				fromFloat64Block(dst[off:off+16], src[off:off+16], &s, &maxBits)
				off += 16
			}
		}
	}
	for ; off < len(src); off += 64 {
		end := min(off+64, len(src))
		fromFloat64Block(dst[off:end], src[off:end], &s, &maxBits)
	}
	if st != nil {
		s.MaxAbs = math.Float64frombits(maxBits)
		st.Add(s)
	}
}

// fromFloat64Block converts blk into out and adds its audit to s and
// *maxBits (the largest finite |x| bits).
func fromFloat64Block(out []uint16, blk []float64, s *Stats, maxBits *uint64) {
	out = out[:len(blk)]
	hiA, loA := uint64(0), ^uint64(0)
	for i, f := range blk {
		b := math.Float64bits(f)
		a := b &^ (1 << 63)
		if a-normLo64 < normHi64-normLo64 { // Float64ToBits, inlined
			v := a - 1008<<52
			out[i] = uint16(b>>48)&0x8000 | uint16((v+(1<<41-1)+(v>>42)&1)>>42)
		} else {
			out[i] = float64ToBitsRare(b)
		}
		hiA = max(hiA, a)
		loA = min(loA, a-1) // 0 wraps to the top and drops out
	}
	if hiA < overflow64 && loA >= underflow64 {
		*maxBits = max(*maxBits, hiA)
		return
	}
	for _, f := range blk {
		a := math.Float64bits(f) &^ (1 << 63)
		switch {
		case a > inf64:
			s.NaN++
		case a == inf64:
			s.InfIn++
		default:
			if a >= overflow64 {
				s.Overflow++
			} else if a != 0 && a <= underflow64 {
				s.Underflow++
			}
			*maxBits = max(*maxBits, a)
		}
	}
}

// FromFloat16 copies src into dst and adds the audit of src to st.
func FromFloat16(dst, src []uint16, st *Stats) {
	copy(dst, src)
	if st != nil {
		Audit16(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 2*len(src)), st)
	}
}

// Audit16 adds to st the audit of little-endian float16 values (float16
// to float16 is exact: only NaN, ±Inf and the largest magnitude are
// counted). Sixteen values are screened at a time with AVX2 (four in a
// 64-bit word without it; for finite values, the bits without the sign
// order as the magnitudes do); a block holding a NaN or an Inf is counted
// value by value.
func Audit16(src []byte, st *Stats) {
	const block = 2048 // bytes
	var s Stats
	var maxBits uint16
	for len(src) > 0 {
		b := src[:min(len(src), block)]
		src = src[len(b):]
		if m, ok := audit16Block(b); ok {
			maxBits = max(maxBits, m)
			continue
		}
		for i := 0; i+1 < len(b); i += 2 {
			a := (uint16(b[i]) | uint16(b[i+1])<<8) &^ 0x8000
			switch {
			case a > 0x7c00:
				s.NaN++
			case a == 0x7c00:
				s.InfIn++
			default:
				maxBits = max(maxBits, a)
			}
		}
	}
	s.MaxAbs = float64(array.Float16ToFloat32(maxBits))
	st.Add(s)
}

// audit16Words returns the largest magnitude bits of the float16 values
// in b, or ok=false if b holds a NaN or an Inf, or is not whole words.
func audit16Words(b []byte) (maxBits uint16, ok bool) {
	if len(b)%8 != 0 {
		return 0, false
	}
	const (
		abs  = 0x7fff7fff7fff7fff
		high = 0x8000800080008000
		one  = 0x0400040004000400 // carries into bit 15 of a lane >= 0x7c00
	)
	var special, m uint64 // m: the lanes' maxima
	for i := 0; i < len(b); i += 8 {
		a := binary.LittleEndian.Uint64(b[i:]) & abs
		special |= a + one
		// Lanes where a >= m: (a | 0x8000) - m keeps bit 15 set (no borrow
		// crosses a lane: a | 0x8000 > m there).
		ge := ((a | high) - m) & high
		mask := (ge >> 15) * 0xffff
		m = a&mask | m&^mask
	}
	if special&high != 0 {
		return 0, false
	}
	return max(uint16(m), uint16(m>>16), uint16(m>>32), uint16(m>>48)), true
}

// Convert converts the little-endian elements in src, of dtype dt, to
// float16 bits in dst (2 bytes per element, little-endian) and adds the
// audit to st (unless st is nil). Integer and bool sources convert through float64 (exact for
// every value float16 can represent). src must hold a whole number of
// elements and dst room for them.
func Convert(dst, src []byte, dt array.DType, st *Stats) error {
	n := len(src) / dt.Size
	if len(src)%dt.Size != 0 || len(dst) < 2*n {
		return fmt.Errorf("f16: %d source bytes of %s do not fit %d destination bytes", len(src), dt, len(dst))
	}
	if n == 0 {
		return nil
	}
	out := unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), n)
	switch dt {
	case array.Float32:
		FromFloat32(out, unsafe.Slice((*float32)(unsafe.Pointer(&src[0])), n), st)
	case array.Float64:
		FromFloat64(out, unsafe.Slice((*float64)(unsafe.Pointer(&src[0])), n), st)
	case array.Float16:
		FromFloat16(out, unsafe.Slice((*uint16)(unsafe.Pointer(&src[0])), n), st)
	default:
		return fromInteger(out, src, dt, st)
	}
	return nil
}

func fromInteger(dst []uint16, src []byte, dt array.DType, st *Stats) error {
	n := len(src) / dt.Size
	var s Stats
	var maxAbs float64
	for i := 0; i < n; i++ {
		f, ok := IntValue(src[i*dt.Size:], dt)
		if !ok {
			return fmt.Errorf("f16: cannot convert %s", dt)
		}
		dst[i] = Float64ToBits(f)
		a := math.Abs(f)
		if a >= 65520 {
			s.Overflow++
		}
		maxAbs = max(maxAbs, a)
	}
	s.MaxAbs = maxAbs
	if st != nil {
		st.Add(s)
	}
	return nil
}

// IntValue returns the little-endian integer or bool element at the start
// of p, of dtype dt, as a float64 (false for other dtypes).
func IntValue(p []byte, dt array.DType) (float64, bool) {
	switch dt {
	case array.DType{Kind: array.Bool, Size: 1}, array.DType{Kind: array.Uint, Size: 1}:
		return float64(p[0]), true
	case array.DType{Kind: array.Int, Size: 1}:
		return float64(int8(p[0])), true
	case array.DType{Kind: array.Int, Size: 2}:
		return float64(int16(uint16(p[0]) | uint16(p[1])<<8)), true
	case array.DType{Kind: array.Uint, Size: 2}:
		return float64(uint16(p[0]) | uint16(p[1])<<8), true
	case array.DType{Kind: array.Int, Size: 4}:
		return float64(int32(le32(p))), true
	case array.DType{Kind: array.Uint, Size: 4}:
		return float64(le32(p)), true
	case array.DType{Kind: array.Int, Size: 8}:
		return float64(int64(le64(p))), true
	case array.DType{Kind: array.Uint, Size: 8}:
		return float64(le64(p)), true
	}
	return 0, false
}

func le32(p []byte) uint32 {
	return uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
}

func le64(p []byte) uint64 { return uint64(le32(p)) | uint64(le32(p[4:]))<<32 }
