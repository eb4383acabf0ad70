package array

import (
	"bytes"
	"math/rand/v2"
	"slices"
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
// byte reference, on shapes around the block and tile sizes (edges of 1-3
// rows or columns).
func TestFortranToC(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, size := range []int{1, 2, 4, 8} {
		for _, rows := range []int{1, 2, 3, 4, 5, 6, 7, 31, 32, 33, 100} {
			for _, cols := range []int{1, 2, 3, 4, 5, 7, 32, 63, 64, 65, 130} {
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
	for _, size := range []int{2, 4, 8} {
		src := make([]byte, 300*512*size)
		dst := make([]byte, len(src))
		b.Run(map[int]string{2: "float16", 4: "float32", 8: "float64"}[size], func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for range b.N {
				FortranToC(dst, src, []int{300, 512}, size)
			}
		})
	}
}

// TestSwapBytes: every item size, on lengths around the 8-byte step,
// against reversing each item's bytes one by one.
func TestSwapBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, size := range []int{2, 4, 8} {
		for items := range 12 {
			b := make([]byte, items*size)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			want := bytes.Clone(b)
			for i := 0; i < len(want); i += size {
				slices.Reverse(want[i : i+size])
			}
			SwapBytes(b, size)
			if !bytes.Equal(b, want) {
				t.Fatalf("size %d, %d items: %x, want %x", size, items, b, want)
			}
		}
	}
}

func BenchmarkSwapBytes(b *testing.B) {
	for _, size := range []int{2, 4, 8} {
		buf := make([]byte, 1<<20)
		b.Run(map[int]string{2: "2", 4: "4", 8: "8"}[size], func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				SwapBytes(buf, size)
			}
		})
	}
}

// TestNewFrom: NewFrom gives the array New gives, for every mix of byte
// order and memory order, and leaves its data as it was.
func TestNewFrom(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, descr := range []string{"<f4", ">f4", "<f2", ">f8", "|u1"} {
		for _, fortran := range []bool{false, true} {
			for _, shape := range [][]int{{5, 3}, {4}, {0, 2}, {2, 3, 2}} {
				dt, _, _ := ParseDescr(descr)
				n, _ := ByteSize(shape, dt.Size)
				data := make([]byte, n)
				for i := range data {
					data[i] = byte(r.Uint32())
				}
				orig := bytes.Clone(data)
				want, err := New(descr, shape, fortran, bytes.Clone(data))
				if err != nil {
					t.Fatal(err)
				}
				got, err := NewFrom(descr, shape, fortran, data)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(data, orig) {
					t.Fatalf("%s %v fortran=%v: NewFrom changed its data", descr, shape, fortran)
				}
				if !bytes.Equal(got.Data, want.Data) || got.SourceFortran != fortran {
					t.Fatalf("%s %v fortran=%v: NewFrom %x, New %x", descr, shape, fortran, got.Data, want.Data)
				}
			}
		}
	}
}
