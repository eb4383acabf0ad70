package npy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
)

// BenchmarkReadFile reads a 64 MiB float32 .npy file from the page cache
// into a reused buffer: header check plus one pread.
func BenchmarkReadFile(b *testing.B) {
	path := filepath.Join(b.TempDir(), "big.npy")
	w, err := npy.Create(path, array.Float32, []int{1024})
	if err != nil {
		b.Fatal(err)
	}
	row := make([]byte, 4096)
	for i := 0; i < 16384; i++ {
		w.Write(row)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	st, _ := f.Stat()
	buf := make([]byte, st.Size())
	b.SetBytes(st.Size())
	b.ResetTimer()
	for b.Loop() {
		if _, err := npy.ReadBuffer(f, st.Size(), buf); err != nil {
			b.Fatal(err)
		}
	}
}
