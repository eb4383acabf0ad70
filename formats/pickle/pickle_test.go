package pickle_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/pickle"
)

// TestAllocationBounded decodes every fixture, good and hostile, and checks
// that none allocates more than a small multiple of its size.
func TestAllocationBounded(t *testing.T) {
	for path, b := range seedFiles(t) {
		before := totalAlloc()
		pickle.Decode(bytes.NewReader(b), int64(len(b)))
		if got := totalAlloc() - before; got > allocBound(len(b)) {
			t.Errorf("%s: allocated %d bytes for %d", path, got, len(b))
		}
	}
}

func TestRefusalsAreTyped(t *testing.T) {
	for name, b := range seedFiles(t) {
		_, err := pickle.Decode(bytes.NewReader(b), int64(len(b)))
		switch {
		case strings.Contains(name, "evil_"), strings.Contains(name, "persid"):
			if !errors.Is(err, pickle.ErrRefused) {
				t.Errorf("%s: %v, want ErrRefused", name, err)
			}
		case strings.Contains(name, "huge"), strings.Contains(name, "16g"), strings.Contains(name, "truncated"):
			if !errors.Is(err, pickle.ErrTruncated) {
				t.Errorf("%s: %v, want ErrTruncated", name, err)
			}
		}
	}
}

// TestPayloadNotCopied checks that a protocol 4/5 array's data is read
// straight into the buffer the array keeps: decoding allocates the payload
// once, not twice.
func TestPayloadNotCopied(t *testing.T) {
	for name, b := range seedFiles(t) {
		if !strings.Contains(name, "_big.pkl") {
			continue
		}
		before := totalAlloc()
		obj, err := pickle.Decode(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		got := totalAlloc() - before
		a, err := pickle.Select(obj, "exp")
		if err != nil {
			t.Fatal(err)
		}
		payload := uint64(len(a.Data))
		t.Logf("%s: payload %d, allocated %d", name, payload, got)
		// Fixed overhead: two 64 KiB read buffers and the unpickler memo.
		if got > payload+192<<10 {
			t.Errorf("%s: decoding a %d-byte payload allocated %d bytes (a copy?)", name, payload, got)
		}
	}
}
