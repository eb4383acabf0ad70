package array

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// fortranRef is FortranToC's 2-d case byte by byte.
func fortranRef(src []byte, rows, cols, size int) []byte {
	dst := make([]byte, len(src))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			copy(dst[(r*cols+c)*size:(r*cols+c+1)*size], src[(c*rows+r)*size:])
		}
	}
	return dst
}

// TestFortranToC: 2-d transposes of every item size equal the byte-by-
// byte reference, on shapes around the tile size.
func TestFortranToC(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, size := range []int{1, 2, 4, 8} {
		for _, rows := range []int{1, 3, 31, 32, 33, 100} {
			for _, cols := range []int{1, 7, 32, 65} {
				src := make([]byte, rows*cols*size)
				for i := range src {
					src[i] = byte(r.Uint32())
				}
				dst := make([]byte, len(src))
				FortranToC(dst, src, []int{rows, cols}, size)
				if !bytes.Equal(dst, fortranRef(src, rows, cols, size)) {
					t.Fatalf("size %d, %dx%d: differs from the reference", size, rows, cols)
				}
			}
		}
	}
}

func BenchmarkFortranToC(b *testing.B) {
	for _, size := range []int{2, 4} {
		src := make([]byte, 300*512*size)
		dst := make([]byte, len(src))
		b.Run(map[int]string{2: "float16", 4: "float32"}[size], func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for range b.N {
				FortranToC(dst, src, []int{300, 512}, size)
			}
		})
	}
}
