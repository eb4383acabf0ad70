package main_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMessages (#26.10): an integer overflow names its row (it said
// "first at row -1"), and a modality name too long for the shard files
// shuffle makes of it is refused where it is given (it was accepted, and
// every shuffle then failed "file name too long").
func TestMessages(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte("a\n"), 0o644)
	hdr := "{'descr': '<i8', 'fortran_order': False, 'shape': (6, 2), }"
	hdr += strings.Repeat(" ", 64-(10+len(hdr)+1)%64) + "\n"
	var b bytes.Buffer
	b.WriteString("\x93NUMPY\x01\x00")
	binary.Write(&b, binary.LittleEndian, uint16(len(hdr)))
	b.WriteString(hdr)
	for i := range 12 {
		v := int64(i)
		if i == 7 {
			v = 70000 // row 3
		}
		binary.Write(&b, binary.LittleEndian, v)
	}
	os.WriteFile(filepath.Join(src, "a.npy"), b.Bytes(), 0o644)
	args := func(name string) []string {
		return []string{"--clips", filepath.Join(src, "clips.txt"), "--out", filepath.Join(t.TempDir(), "ds"), "--allow-int", "-m", name + "=" + filepath.Join(src, "{clip}.npy")}
	}
	r := runConvert(t, nil, args("x")...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "overflow float16") || !strings.Contains(r.Stderr, "first at row 3") {
		t.Fatalf("int overflow: exit %d %q", r.Code, r.Stderr)
	}
	long := strings.Repeat("n", 245)
	r = runConvert(t, nil, args(long)...)
	if r.Code != 2 || !strings.Contains(r.Stderr, fmt.Sprintf("is %d bytes: at most 128", len(long))) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
		t.Fatalf("long name: exit %d %q", r.Code, r.Stderr)
	}
	if r := runConvert(t, nil, append(args(strings.Repeat("n", 128)), "--allow-overflow")...); r.Code != 0 {
		t.Fatalf("a 128-byte name: exit %d %q", r.Code, r.Stderr)
	}
}
