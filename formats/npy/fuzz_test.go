package npy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/formats/npy"
)

// FuzzRead feeds arbitrary files to the header parser and reader: they must
// never panic, and must not allocate more than a small multiple of the input.
func FuzzRead(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "formats", "npy", "*.npy"))
	np2, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "formats-numpy2", "npy", "*.npy"))
	for _, p := range append(paths, np2...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ms runtimeMem
		ms.start()
		a, err := npy.Read(bytes.NewReader(data), int64(len(data)))
		if got := ms.since(); got > uint64(4*len(data))+256<<10 {
			t.Fatalf("allocated %d bytes for a %d-byte file", got, len(data))
		}
		// The one-read path (a caller buffer with room for the file) must
		// agree with the header-first path.
		b, err2 := npy.ReadBuffer(bytes.NewReader(data), int64(len(data)), make([]byte, 0, len(data)))
		if (err == nil) != (err2 == nil) || (err == nil && !bytes.Equal(a.Data, b.Data)) {
			t.Fatalf("Read: %v, ReadBuffer: %v", err, err2)
		}
		if err != nil {
			return
		}
		if int64(len(a.Data)) != int64(a.Len()*a.DType.Size) {
			t.Fatalf("%v: %d data bytes", a, len(a.Data))
		}
	})
}
