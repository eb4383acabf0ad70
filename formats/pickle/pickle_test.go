package pickle_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/pickle"
)

// TestAllocationBounded decodes every fixture, good and hostile, and checks
// that none allocates more than a small multiple of its size.
func TestAllocationBounded(t *testing.T) {
	for path, b := range pickle.SeedFiles(t) {
		before := totalAlloc()
		pickle.Decode(bytes.NewReader(b), int64(len(b)))
		if got := totalAlloc() - before; got > allocBound(len(b)) {
			t.Errorf("%s: allocated %d bytes for %d", path, got, len(b))
		}
	}
}

func TestRefusalsAreTyped(t *testing.T) {
	for name, b := range pickle.SeedFiles(t) {
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
	for name, b := range pickle.SeedFiles(t) {
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

// TestCodecsLatin1 decodes protocol 2's spelling of bytes, which arrives as
// _codecs.encode(<utf-8 str>, 'latin1'), and refuses non-latin1 strings.
func TestCodecsLatin1(t *testing.T) {
	build := func(s string) []byte {
		// PROTO 2, GLOBAL _codecs.encode, BINUNICODE s, BINUNICODE latin1, TUPLE2, REDUCE, STOP
		b := []byte("\x80\x02c_codecs\nencode\nX")
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
		b = append(b, "X\x06\x00\x00\x00latin1\x86R."...)
		return b
	}
	all := make([]rune, 256)
	for i := range all {
		all[i] = rune(255 - i)
	}
	obj, err := pickle.Decode(bytes.NewReader(build(string(all))), int64(len(build(string(all)))))
	if err != nil {
		t.Fatal(err)
	}
	got := obj.([]byte)
	for i, r := range all {
		if got[i] != byte(r) {
			t.Fatalf("byte %d: %#x, want %#x", i, got[i], r)
		}
	}
	for _, s := range []string{"\u0100", "a\u00ff\u0180", "\u20ac", "\xc7\x80", "\xc3"} {
		b := build(s)
		if _, err := pickle.Decode(bytes.NewReader(b), int64(len(b))); !errors.Is(err, pickle.ErrFormat) {
			t.Errorf("%q: %v", s, err)
		}
	}
}

func TestOpcodeCap(t *testing.T) {
	body := bytes.Repeat([]byte("N0"), pickle.MaxOpcodes/2+1) // NONE, POP: harmless but endless
	data := append(append([]byte("\x80\x02"), body...), 'N', '.')
	_, err := pickle.Decode(bytes.NewReader(data), int64(len(data)))
	if !errors.Is(err, pickle.ErrRefused) || !strings.Contains(err.Error(), "opcodes") {
		t.Fatalf("got %v", err)
	}
}

// TestShortErrors: gopickle prints whole containers in some errors; what
// Decode returns stays one short line.
func TestShortErrors(t *testing.T) {
	data := []byte("\x80\x02]" + strings.Repeat("]a", 1900) + "}b.")
	_, err := pickle.Decode(bytes.NewReader(data), int64(len(data)))
	if err == nil || len(err.Error()) > 300 || !errors.Is(err, pickle.ErrFormat) {
		t.Fatalf("%d-byte error: %.100v", len(fmt.Sprint(err)), err)
	}
}

// TestNoAliasing decodes every fixture, then all of them again (small files
// are read into a recycled buffer), and checks that the arrays of the first
// round still hold their bytes: nothing decoded may point into that buffer.
func TestNoAliasing(t *testing.T) {
	type kept struct {
		name       string
		live, copy []byte
	}
	var all []kept
	files := pickle.SeedFiles(t)
	for name, b := range files {
		obj, err := pickle.Decode(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			continue
		}
		for _, key := range []string{"", "exp", "pose", "0"} {
			if a, err := pickle.Select(obj, key); err == nil && len(a.Data) > 0 {
				all = append(all, kept{name + ":" + key, a.Data, bytes.Clone(a.Data)})
			}
		}
	}
	if len(all) < 20 {
		t.Fatalf("only %d arrays selected from the fixtures", len(all))
	}
	for _, b := range files {
		// Overwrite the recycled buffer with other bytes.
		x := bytes.Repeat([]byte{0x5a}, len(b))
		copy(x, b[:min(len(b), 2)])
		pickle.Decode(bytes.NewReader(x), int64(len(x)))
		pickle.Decode(bytes.NewReader(b), int64(len(b)))
	}
	for _, k := range all {
		if !bytes.Equal(k.live, k.copy) {
			t.Errorf("%s: array bytes changed by later decodes: they alias a recycled buffer", k.name)
		}
	}
}
