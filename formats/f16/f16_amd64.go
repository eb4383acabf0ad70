// The amd64 fast path: F16C/AVX2 kernels, used when the CPU has them
// (tested bit-exact against the portable code over every float32).

package f16

import "math"

// useAsm reports whether the CPU and OS support the F16C/AVX2 kernel.
var useAsm = hasF16CAVX2()

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

func hasF16CAVX2() bool {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const osxsave, avx, f16c = 1 << 27, 1 << 28, 1 << 29
	if ecx1&(osxsave|avx|f16c) != osxsave|avx|f16c {
		return false
	}
	if xcr0, _ := xgetbv(); xcr0&6 != 6 { // OS saves XMM and YMM state
		return false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	return ebx7&(1<<5) != 0 // AVX2
}

// accum is the per-lane audit state of the kernel.
type accum struct {
	big, nonfin, nan, pos, small, max [8]uint32
}

//go:noescape
func f32ToF16AVX2(dst *uint16, src *float32, n int, acc *accum)

//go:noescape
func audit16AVX2(p *byte, n int) (maxBits uint16, special bool)

// audit16Block is audit16Words, 16 values a step with AVX2 where the CPU
// has it and b is a whole number of steps.
func audit16Block(b []byte) (maxBits uint16, ok bool) {
	if useAsm && len(b) > 0 && len(b)%32 == 0 {
		m, special := audit16AVX2(&b[0], len(b))
		return m, !special
	}
	return audit16Words(b)
}

//go:noescape
func f32ToF16AVX2NoAudit(dst *uint16, src *float32, n int)

//go:noescape
func f64ToF16Screen(dst *uint16, src *float64, n int, maxOut *[4]uint64) int

//go:noescape
func f32ToF16Screen(dst *uint16, src *float32, n int, maxOut *[8]uint32) int

// fromFloat32Asm converts the largest multiple of 8 elements of src it can
// and returns how many it converted.
//
// The audit runs in two tiers: f32ToF16Screen converts 64-element blocks
// checking only that a block has nothing to count (the common case: no
// NaN, Inf, overflow or underflow), and the counting kernel f32ToF16AVX2
// redoes just the blocks that fail that check.
func fromFloat32Asm(dst []uint16, src []float32, st *Stats) int {
	n := len(src) &^ 7
	if st == nil {
		f32ToF16AVX2NoAudit(&dst[0], &src[0], n)
		return n
	}
	var s Stats
	var maxBits uint32
	count := func(off, m int) {
		var acc accum
		f32ToF16AVX2(&dst[off], &src[off], m, &acc)
		for l := 0; l < 8; l++ {
			s.Overflow += int64(acc.big[l]) - int64(acc.nonfin[l])
			s.InfIn += int64(acc.nonfin[l]) - int64(acc.nan[l])
			s.NaN += int64(acc.nan[l])
			s.Underflow += int64(acc.pos[l]) - int64(acc.small[l])
			maxBits = max(maxBits, acc.max[l])
		}
	}
	blocks := n &^ 63
	for off := 0; off < blocks; {
		var m [8]uint32
		off += f32ToF16Screen(&dst[off], &src[off], blocks-off, &m)
		for _, v := range m {
			maxBits = max(maxBits, v)
		}
		if off < blocks {
			count(off, 64)
			off += 64
		}
	}
	if blocks < n {
		count(blocks, n-blocks)
	}
	s.MaxAbs = float64(math.Float32frombits(maxBits))
	st.Add(s)
	return n
}
