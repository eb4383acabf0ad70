package f16_test

import (
	"encoding/binary"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/internal/numpytest"
)

var stride = flag.Uint("f16.stride", 1, "test every Nth float32 bit pattern in the exhaustive sweep (1 = all 2^32)")

func isNaN16(h uint16) bool { return h&0x7fff > 0x7c00 }

func same16(a, b uint16) bool { return a == b || (isNaN16(a) && isNaN16(b)) }

// TestExhaustiveFloat32 compares the fast path with the portable path over
// every float32 bit pattern (or every -f16.stride'th), results and audit.
func TestExhaustiveFloat32(t *testing.T) {
	if !f16.Accelerated() {
		t.Skip("this CPU lacks F16C/AVX2 (or is not amd64): only the portable path exists here")
	}
	const chunk = 1 << 20
	step := uint64(*stride)
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fails int
	next := make(chan uint64)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := make([]float32, chunk)
			fast := make([]uint16, chunk)
			ref := make([]uint16, chunk)
			noAudit := make([]uint16, chunk)
			for start := range next {
				for i := range src {
					src[i] = math.Float32frombits(uint32(start + uint64(i)*step))
				}
				var sf, sr f16.Stats
				f16.FromFloat32(fast, src, &sf)
				f16.FromFloat32Portable(ref, src, &sr)
				f16.FromFloat32(noAudit, src, nil)
				for i := range src {
					if !same16(fast[i], ref[i]) || fast[i] != noAudit[i] {
						mu.Lock()
						if fails++; fails < 10 {
							t.Errorf("float32 bits %#08x: fast %#04x, portable %#04x, unaudited %#04x", math.Float32bits(src[i]), fast[i], ref[i], noAudit[i])
						}
						mu.Unlock()
					}
				}
				if sf != sr {
					mu.Lock()
					t.Errorf("chunk at %#x: audit fast %+v, portable %+v", start, sf, sr)
					fails++
					mu.Unlock()
				}
			}
		}()
	}
	span := uint64(chunk) * step
	for start := uint64(0); start < 1<<32; start += span {
		if fails > 10 {
			break
		}
		next <- start
	}
	close(next)
	wg.Wait()
}

func readBin(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAgainstNumpy converts over a million float32 and float64 values made
// by numpy (ties, subnormals, overflow edges, specials, random bits) and
// compares with numpy's own astype(np.float16), NaN payloads aside.
func TestAgainstNumpy(t *testing.T) {
	dir := t.TempDir()
	out := numpytest.Run(t, filepath.Join("..", "..", "testdata", "f16", "gen.py"), dir)
	t.Logf("%s", out)
	for _, c := range []struct {
		in, want string
		dt       array.DType
	}{
		{"f32.bin", "f32_to_f16.bin", array.Float32},
		{"f64.bin", "f64_to_f16.bin", array.Float64},
	} {
		src := readBin(t, filepath.Join(dir, c.in))
		want := readBin(t, filepath.Join(dir, c.want))
		n := len(src) / c.dt.Size
		if n < 1_000_000 || len(want) != 2*n {
			t.Fatalf("%s: %d values, %d expected bytes", c.in, n, len(want))
		}
		got := make([]byte, 2*n)
		var st f16.Stats
		if err := f16.Convert(got, src, c.dt, &st); err != nil {
			t.Fatal(err)
		}
		bad := 0
		for i := 0; i < n; i++ {
			g, w := binary.LittleEndian.Uint16(got[2*i:]), binary.LittleEndian.Uint16(want[2*i:])
			if !same16(g, w) {
				if bad++; bad < 10 {
					t.Errorf("%s[%d] = %x: got %#04x, numpy %#04x", c.in, i, src[i*c.dt.Size:(i+1)*c.dt.Size], g, w)
				}
			}
		}
		if st.NaN == 0 || st.InfIn == 0 || st.Overflow == 0 || st.Underflow == 0 {
			t.Errorf("%s: audit missed cases: %+v", c.in, st)
		}
		t.Logf("%s: %d values, %d differ; audit %+v", c.in, n, bad, st)
	}
}

func TestAudit(t *testing.T) {
	vals := []float64{0, math.Copysign(0, -1), 1, -2.5, 65504, 65519.99, 65520, -1e6, math.Inf(1), math.Inf(-1), math.NaN(),
		math.Ldexp(1, -24), math.Ldexp(1, -25), math.Ldexp(1.5, -25), -1e-30, 7}
	want := f16.Stats{NaN: 1, InfIn: 2, Overflow: 2, Underflow: 2, MaxAbs: 1e6}
	// float32, long enough for the fast path, padded with zeros
	f32 := make([]float32, 40)
	f64 := make([]float64, 40)
	for i, v := range vals {
		f32[i], f64[i] = float32(v), v
	}
	var s32, s64 f16.Stats
	f16.FromFloat32(make([]uint16, 40), f32, &s32)
	f16.FromFloat64(make([]uint16, 40), f64, &s64)
	if s32 != want || s64 != want {
		t.Fatalf("audit float32 %+v, float64 %+v, want %+v", s32, s64, want)
	}
	h := make([]uint16, 40)
	f16.FromFloat64(h, f64, new(f16.Stats))
	var s16 f16.Stats
	f16.FromFloat16(make([]uint16, 40), h, &s16)
	if want16 := (f16.Stats{NaN: 1, InfIn: 4, MaxAbs: 65504}); s16 != want16 {
		t.Fatalf("float16 audit %+v, want %+v", s16, want16)
	}
}

func TestFloat64Direct(t *testing.T) {
	// 1 + 2^-11 + 2^-40 lies just above a tie of float16 (ulp 2^-10 at 1):
	// rounding directly goes up; via float32 it first rounds to the tie,
	// then to even (down).
	x := 1 + math.Ldexp(1, -11) + math.Ldexp(1, -40)
	if got := f16.Float64ToBits(x); got != 0x3c01 {
		t.Fatalf("direct: %#04x, want 0x3c01", got)
	}
	for _, c := range []struct {
		v    float64
		want uint16
	}{{65504, 0x7bff}, {65520, 0x7c00}, {65519.99, 0x7bff}, {math.Ldexp(1, -24), 1}, {math.Ldexp(1, -25), 0},
		{math.Ldexp(1.0000001, -25), 1}, {math.Ldexp(3, -25), 2}, {math.Copysign(0, -1), 0x8000}, {math.Ldexp(1023.5, -24), 0x400}} {
		if got := f16.Float64ToBits(c.v); got != c.want {
			t.Errorf("%v: %#04x, want %#04x", c.v, got, c.want)
		}
	}
}

func TestIntegers(t *testing.T) {
	src := []int64{0, 1, -2048, 2049, 65504, 65520, -100000}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 8*len(src))
	dst := make([]byte, 2*len(src))
	var st f16.Stats
	if err := f16.Convert(dst, b, array.DType{Kind: array.Int, Size: 8}, &st); err != nil {
		t.Fatal(err)
	}
	want := []uint16{0, 0x3c00, 0xe800, 0x6800, 0x7bff, 0x7c00, 0xfc00}
	for i, w := range want {
		if g := binary.LittleEndian.Uint16(dst[2*i:]); g != w {
			t.Errorf("%d: %#04x, want %#04x", src[i], g, w)
		}
	}
	if st.Overflow != 2 {
		t.Errorf("overflow %d", st.Overflow)
	}
}

// TestAudit16: the word-at-a-time audit of float16 values equals the
// value-by-value one, on every float16 bit pattern (each with neighbours
// of all kinds), on random blocks with and without NaN/Inf, and on odd
// lengths.
func TestAudit16(t *testing.T) {
	slow := func(b []byte) f16.Stats {
		var s f16.Stats
		var m uint16
		for i := 0; i+1 < len(b); i += 2 {
			a := (uint16(b[i]) | uint16(b[i+1])<<8) &^ 0x8000
			switch {
			case a > 0x7c00:
				s.NaN++
			case a == 0x7c00:
				s.InfIn++
			default:
				m = max(m, a)
			}
		}
		s.MaxAbs = float64(array.Float16ToFloat32(m))
		return s
	}
	check := func(b []byte) {
		var got f16.Stats
		f16.Audit16(b, &got)
		if want := slow(b); got != want {
			t.Fatalf("%d bytes: %+v, want %+v", len(b), got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for v := 0; v < 1<<16; v++ {
		b := make([]byte, 64)
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], uint16(r.IntN(0x7c00))|uint16(r.IntN(2))<<15)
		}
		binary.LittleEndian.PutUint16(b[2*r.IntN(32):], uint16(v))
		check(b)
	}
	for n := 0; n < 300; n++ {
		b := make([]byte, 2*r.IntN(5000)+r.IntN(2))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if n%2 == 0 { // mostly finite
			for i := 1; i < len(b); i += 2 {
				b[i] &= 0x7b | 0x80
			}
		}
		check(b)
	}
}
