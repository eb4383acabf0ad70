package directio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"
)

// TestWriteAt writes pieces of whole and partial pages at aligned offsets,
// through O_DIRECT (where the filesystem of the test's temp folder allows
// it) and through the page cache, overwriting a partial last page as an
// appender does, and checks the file.
func TestWriteAt(t *testing.T) {
	for _, direct := range []bool{true, false} {
		defer func(e bool) { Enabled = e }(Enabled)
		Enabled = direct
		path := filepath.Join(t.TempDir(), "f")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		d := New(f)
		if direct && !d.Direct() {
			t.Logf("%s: O_DIRECT refused here; fallback only", path)
		}
		want := make([]byte, 5*Align+123)
		for i := range want {
			want[i] = byte(i*31 + i>>9)
		}
		buf := AlignedBuf(len(want))
		copy(buf, want)
		steps := []struct{ off, end int }{{0, 2*Align + 10}, {2 * Align, 5*Align + 123}}
		for _, s := range steps {
			if err := d.WriteAt(buf[s.off:s.end], int64(s.off)); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.WriteAt(buf[:10], 100); err == nil {
			t.Fatal("unaligned offset accepted")
		}
		d.Close()
		f.Close()
		got, _ := os.ReadFile(path)
		if !bytes.Equal(got, want) {
			t.Fatalf("direct=%v: file differs (%d bytes, want %d)", direct, len(got), len(want))
		}
	}
}

// TestRefusedWrite: a direct write the kernel refuses (here: memory not
// aligned) falls back to the page cache for good, and the bytes land.
func TestRefusedWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := New(f)
	defer d.Close()
	if !d.Direct() {
		t.Skipf("%s: O_DIRECT refused at open here; the fallback is covered by TestWriteAt", path)
	}
	raw := make([]byte, 2*Align+1)
	p := raw[1:] // misaligned in memory: O_DIRECT fails with EINVAL
	for i := range p {
		p[i] = byte(i * 7)
	}
	if uintptr(unsafe.Pointer(&p[0]))%Align == 0 {
		p = raw[:2*Align]
	}
	if err := d.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if d.Direct() {
		t.Fatal("still direct after a refused write")
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, p) {
		t.Fatal("file differs from what was written")
	}
}
