package f16

import (
	"math"
	"math/rand/v2"
	"testing"
)

// audit64 is the value-by-value audit of float64 values: what FromFloat64
// must add to its Stats.
func audit64(src []float64) Stats {
	var s Stats
	var maxBits uint64
	for _, f := range src {
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
			maxBits = max(maxBits, a)
		}
	}
	s.MaxAbs = math.Float64frombits(maxBits)
	return s
}

// checkFromFloat64 converts src with FromFloat64, with and without the
// audit, and compares each value with Float64ToBits and the audit with
// audit64.
func checkFromFloat64(t *testing.T, what string, src []float64) {
	t.Helper()
	for _, audit := range []bool{true, false} {
		dst := make([]uint16, len(src)+1)
		dst[len(src)] = 0xdead
		var st *Stats
		if audit {
			st = new(Stats)
		}
		FromFloat64(dst[:len(src)], src, st)
		for i, f := range src {
			if want := Float64ToBits(f); dst[i] != want {
				t.Fatalf("%s: [%d] of %d = %v (%#016x): %#04x, want %#04x", what, i, len(src), f, math.Float64bits(f), dst[i], want)
			}
		}
		if dst[len(src)] != 0xdead {
			t.Fatalf("%s: wrote past the end", what)
		}
		if want := audit64(src); audit && *st != want {
			t.Fatalf("%s: audit %+v, want %+v", what, *st, want)
		}
	}
}

// edges64 are values at and around the limits of the kernel's fast set
// (zero, or |x| in [2^-14, 65520)) and of float16's rounding.
func edges64() []float64 {
	var v []float64
	for _, x := range []float64{0, math.Ldexp(1, -14), 65520, 65504, 65519.99, 1, 2, 1000, math.Ldexp(1, -24), math.Ldexp(1, -25),
		math.Ldexp(1.5, -25), math.SmallestNonzeroFloat64, math.MaxFloat64, math.Inf(1), math.NaN(), 1e-30, 1e30,
		math.Float64frombits(0x7ff0000000000001), math.Float64frombits(0x7ff8000000000000 | 0xabcdef)} {
		v = append(v, x, -x, math.Nextafter(x, 0), math.Nextafter(x, math.Inf(1)))
	}
	// Ties of float16 at several exponents, and a float64 ulp either side.
	for e := -14; e <= 15; e += 3 {
		for _, m := range []float64{1, 1.5, 1023} {
			tie := math.Ldexp(1+(m+0.5)/1024, e)
			v = append(v, tie, -tie, math.Nextafter(tie, 0), math.Nextafter(tie, math.Inf(1)))
		}
	}
	return v
}

// TestFloat64AVX2: FromFloat64 through the AVX2 kernel agrees with
// Float64ToBits value by value and with the value-by-value audit: every
// edge value in every lane of a block of otherwise converted values, and
// random arrays (ties, normals, zeros, bit patterns of every kind) of
// every length to 300, so that blocks of 16 fall back in every position.
func TestFloat64AVX2(t *testing.T) {
	if !useAsm {
		t.Skip("the CPU has no AVX2/F16C: FromFloat64 is the Go code that TestAgainstNumpy checks")
	}
	r := rand.New(rand.NewPCG(5, 6))
	normal := func() float64 {
		x := math.Ldexp(1+r.Float64(), r.IntN(30)-14)
		if r.IntN(2) == 0 {
			x = -x
		}
		return x
	}
	for _, x := range edges64() {
		for lane := range 48 {
			src := make([]float64, 48)
			for i := range src {
				src[i] = normal()
			}
			src[lane] = x
			checkFromFloat64(t, "edge", src)
		}
	}
	edges := edges64()
	for n := range 301 {
		for rep := 0; rep < 20; rep++ {
			src := make([]float64, n)
			kind := rep % 4
			for i := range src {
				switch {
				case kind == 0 || r.IntN(50) > 0 && kind == 1:
					src[i] = normal()
				case kind == 2 && r.IntN(4) == 0:
					src[i] = 0
				case kind == 2:
					// A float16 tie, or a float64 ulp off one.
					tie := math.Ldexp(1+(float64(r.IntN(1024))+0.5)/1024, r.IntN(30)-14)
					src[i] = math.Float64frombits(math.Float64bits(tie) + uint64(r.IntN(3)) - 1)
				case r.IntN(2) == 0:
					src[i] = edges[r.IntN(len(edges))]
				default:
					src[i] = math.Float64frombits(r.Uint64())
				}
			}
			checkFromFloat64(t, "random", src)
		}
	}
}

// TestFloat64Screen: the kernel converts whole clean blocks, stops before
// the first block holding a value outside its set without writing it, and
// reports the clean blocks' largest |x|.
func TestFloat64Screen(t *testing.T) {
	if !useAsm {
		t.Skip("the CPU has no AVX2/F16C")
	}
	src := make([]float64, 64)
	for i := range src {
		src[i] = float64(i+1) * 0.25
	}
	src[37] = 1e-5 // a float16 subnormal: not the kernel's
	dst := make([]uint16, 64)
	var m [4]uint64
	if got := f64ToF16Screen(&dst[0], &src[0], 64, &m); got != 32 {
		t.Fatalf("converted %d, want 32 (the block of element 37 is not clean)", got)
	}
	for i, h := range dst {
		if want := Float64ToBits(src[i]); i < 32 && h != want || i >= 32 && h != 0 {
			t.Fatalf("dst[%d] = %#04x", i, h)
		}
	}
	if mx := max(m[0], m[1], m[2], m[3]); mx != math.Float64bits(8) {
		t.Fatalf("max |x| bits %#x, want those of 8", mx)
	}
}
