package f16_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/clipshard/clipshard/formats/f16"
)

// Two sizes: "L2" converts a 64 KiB float32 chunk that stays in cache;
// "stream" converts 256 MiB, far larger than any cache. Bytes are input
// bytes.
var sizes = []struct {
	name string
	n    int
}{{"L2", 16 << 10}, {"stream", 64 << 20}}

func randFloat32(n int) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64() * 100)
	}
	return s
}

func BenchmarkFromFloat32(b *testing.B) {
	for _, sz := range sizes {
		src := randFloat32(sz.n)
		dst := make([]uint16, sz.n)
		for _, k := range []struct {
			name string
			fn   func([]uint16, []float32, *f16.Stats)
		}{{"f16c", f16.FromFloat32}, {"x448", f16.FromFloat32Portable}} {
			for _, audit := range []bool{true, false} {
				b.Run(fmt.Sprintf("%s/%s/audit=%v", sz.name, k.name, audit), func(b *testing.B) {
					b.SetBytes(int64(4 * sz.n))
					var st *f16.Stats
					if audit {
						st = new(f16.Stats)
					}
					for b.Loop() {
						k.fn(dst, src, st)
					}
				})
			}
		}
	}
}

func BenchmarkFromFloat64(b *testing.B) {
	for _, sz := range sizes {
		f32 := randFloat32(sz.n)
		src := make([]float64, sz.n)
		for i, v := range f32 {
			src[i] = float64(v) * 1.000001
		}
		dst := make([]uint16, sz.n)
		for _, audit := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/audit=%v", sz.name, audit), func(b *testing.B) {
				b.SetBytes(int64(8 * sz.n))
				var st *f16.Stats
				if audit {
					st = new(f16.Stats)
				}
				for b.Loop() {
					f16.FromFloat64(dst, src, st)
				}
			})
		}
	}
}
