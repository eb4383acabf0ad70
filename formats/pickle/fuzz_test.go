package pickle_test

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/clipshard/clipshard/formats/pickle"
)

func totalAlloc() uint64 {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	return s.TotalAlloc
}

// allocBound is what decoding a file of n bytes may allocate at most: the
// payloads once, fixed buffers, and the unpickler's objects: each opcode
// byte can create one, and gopickle's error messages print whole
// containers (~170 bytes per opcode byte measured); scan caps the opcodes
// at MaxOpcodes, so that is bounded for large files too.
func allocBound(n int) uint64 { return uint64(256*n) + 1<<20 }

// FuzzDecode feeds arbitrary bytes to the decoder and key selection: no
// panic may escape, and allocation stays within a small multiple of the
// input size.
func FuzzDecode(f *testing.F) {
	for _, b := range pickle.SeedFiles(f) {
		f.Add(b, "exp")
	}
	f.Add([]byte("\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x04\x00xx."), "")
	f.Fuzz(func(t *testing.T, data []byte, keys string) {
		before := totalAlloc()
		obj, err := pickle.Decode(bytes.NewReader(data), int64(len(data)))
		if err == nil {
			pickle.Select(obj, keys)
			pickle.Select(obj, "")
			pickle.SelectLabel(obj, keys)
		}
		if got := totalAlloc() - before; got > allocBound(len(data)) {
			t.Fatalf("allocated %d bytes for a %d-byte pickle", got, len(data))
		}
		// Decoded in a buffer of the caller's (arrays aliasing it), the
		// pickle gives what Decode gives.
		buf := append(bytes.Clone(data), "spare"...)
		obj2, err2 := pickle.DecodeIn(bytes.NewReader(data), int64(len(data)), buf)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("Decode: %v; DecodeIn: %v", err, err2)
		}
		if err != nil {
			return
		}
		for _, k := range []string{keys, ""} {
			a, aerr := pickle.Select(obj, k)
			b, berr := pickle.SelectIn(obj2, k, func(n int) []byte { return make([]byte, n+3) })
			if (aerr == nil) != (berr == nil) || aerr == nil && (a.String() != b.String() || !bytes.Equal(a.Data, b.Data)) {
				t.Fatalf("keys %q: Select %v, %v; SelectIn %v, %v", k, a, aerr, b, berr)
			}
		}
	})
}
