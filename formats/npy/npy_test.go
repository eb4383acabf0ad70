package npy_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"codeberg.org/sbinet/npyio"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/numpytest"
)

func f32bytes(vals []float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// writeRows writes rows of a [n, 3, 2] float32 array in uneven chunks.
func writeRows(t *testing.T, path string, n int) []float32 {
	t.Helper()
	w, err := npy.Create(path, array.Float32, []int{3, 2})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	vals := make([]float32, n*6)
	for i := range vals {
		vals[i] = float32(i)*0.25 - 7
	}
	data := f32bytes(vals)
	for len(data) > 0 {
		k := min(len(data), 17) // split rows across writes
		if _, err := w.Write(data[:k]); err != nil {
			t.Fatal(err)
		}
		data = data[k:]
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("final name exists before Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return vals
}

func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.npy")
	vals := writeRows(t, path, 50)

	a, err := npy.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Shape, []int{50, 3, 2}) || a.DType != array.Float32 {
		t.Fatalf("got %v", a)
	}
	if !bytes.Equal(a.Data, f32bytes(vals)) {
		t.Fatal("data differs")
	}
	f, _ := os.Open(path)
	defer f.Close()
	st, _ := f.Stat()
	h, err := npy.ReadHeader(f, st.Size())
	if err != nil || h.DataOffset != 4096 || h.Major != 1 {
		t.Fatalf("header %+v, %v", h, err)
	}

	// An independent reader agrees.
	f.Seek(0, 0)
	var got []float32
	if err := npyio.Read(f, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, vals) {
		t.Fatal("npyio reads different values")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left files behind: %v", entries)
	}
}

func TestWriterAbortAndPartialRow(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.npy")
	w, err := npy.Create(path, array.Float16, []int{4})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 7)) // not a whole 8-byte row
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "whole number") {
		t.Fatalf("Close: %v", err)
	}
	w, _ = npy.Create(path, array.Float16, []int{4})
	w.Write(make([]byte, 8))
	w.Abort()
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left files behind: %v", entries)
	}
}

// TestNumpyReadsWriter checks that numpy memory-maps what Writer wrote,
// including float16, and sees the same values.
func TestNumpyReadsWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "h.npy")
	w, err := npy.Create(path, array.Float16, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	// 1.0, -2.0, 65504, smallest subnormal
	w.Write([]byte{0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out := numpytest.Run(t, "-c", `
import sys, numpy as np
a = np.load(sys.argv[1], mmap_mode="r")
assert a.dtype == np.float16 and a.shape == (2, 2), (a.dtype, a.shape)
assert a.offset == 4096, a.offset
print(a.tolist())`, path)
	if want := "[[1.0, -2.0], [65504.0, 5.960464477539063e-08]]"; strings.TrimSpace(string(out)) != want {
		t.Fatalf("numpy read %s, want %s", out, want)
	}
}

func TestEncodeHeaderParses(t *testing.T) {
	for _, shape := range [][]int{{}, {5}, {0, 3}, {7, 2, 9}} {
		hdr, err := npy.EncodeHeader("<f2", false, shape, 4096)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := array.ByteSize(shape, 2)
		file := append(hdr, make([]byte, n)...)
		h, err := npy.ParseHeader(file, int64(len(file)))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(append([]int{}, h.Shape...), append([]int{}, shape...)) || h.DataOffset != 4096 {
			t.Fatalf("%v: got %+v", shape, h)
		}
	}
	if _, err := npy.EncodeHeader("<f2", false, []int{1}, 4000); err == nil {
		t.Fatal("unaligned offset accepted")
	}
}

// TestHostileHeaderNoAllocation: a header that claims 10^16 bytes must fail
// without allocating them.
func TestHostileHeaderNoAllocation(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "formats", "npy", "lying_header.npy")
	var ms runtimeMem
	ms.start()
	if _, err := npy.ReadFile(path); !errors.Is(err, npy.ErrTruncated) {
		t.Fatalf("got %v", err)
	}
	if got := ms.since(); got > 1<<20 {
		t.Fatalf("allocated %d bytes for a hostile header", got)
	}
}
