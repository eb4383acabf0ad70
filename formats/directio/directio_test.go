package directio

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestWriteAt writes pieces of whole and partial pages at aligned offsets,
// through O_DIRECT (where the filesystem of the test's temp folder allows
// it; through io_uring or pwrite) and through the page cache, overwriting
// a partial last page as an appender does, and checks the file.
func TestWriteAt(t *testing.T) {
	defer func(e, a bool) { Enabled, Async = e, a }(Enabled, Async)
	for _, mode := range []struct{ direct, async bool }{{true, true}, {true, false}, {false, false}} {
		Enabled, Async = mode.direct, mode.async
		path := filepath.Join(t.TempDir(), "f")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		d := New(f)
		if mode.direct && !d.Direct() {
			t.Logf("%s: O_DIRECT refused here; fallback only", path)
		}
		want := make([]byte, 5*Align+123)
		for i := range want {
			want[i] = byte(i*31 + i>>9)
		}
		buf := AlignedBuf(len(want))
		copy(buf, want)
		before := ringWrites.Load()
		steps := []struct{ off, end int }{{0, 2*Align + 10}, {2 * Align, 5*Align + 123}}
		for _, s := range steps {
			if err := d.WriteAt(buf[s.off:s.end], int64(s.off)); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.WriteAt(buf[:10], 100); err == nil {
			t.Fatal("unaligned offset accepted")
		}
		viaRing := ringWrites.Load() - before
		switch {
		case !mode.async || !d.Direct():
			if viaRing != 0 {
				t.Errorf("%+v: %d writes went through io_uring", mode, viaRing)
			}
		case asyncRing() == nil:
			t.Logf("io_uring refused here (kernel before 5.6, seccomp or kernel.io_uring_disabled): direct writes are pwrites")
		case viaRing != int64(len(steps)):
			t.Errorf("%+v: %d of %d direct writes went through io_uring", mode, viaRing, len(steps))
		}
		d.Close()
		f.Close()
		got, _ := os.ReadFile(path)
		if !bytes.Equal(got, want) {
			t.Fatalf("%+v: file differs (%d bytes, want %d)", mode, len(got), len(want))
		}
	}
}

// TestRingConcurrent: more writers at once than the ring has entries (the
// rest go through pwrite), each appending to its own file, as the blobs of
// a convert and the shards of a shuffle do; every file ends as written.
func TestRingConcurrent(t *testing.T) {
	dir := t.TempDir()
	const writers, chunks, size = 3 * ringEntries / 2, 6, 16 * Align
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(w)))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			d := New(f)
			defer d.Close()
			buf := AlignedBuf(size)
			for c := range chunks {
				for i := range buf {
					buf[i] = byte(w + c*7 + i>>12)
				}
				n := size
				if c == chunks-1 {
					n -= 100 // a last partial page
				}
				if err := d.WriteAt(buf[:n], int64(c*size)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for w := range writers {
		got, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(w)))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != chunks*size-100 {
			t.Fatalf("writer %d: %d bytes, want %d", w, len(got), chunks*size-100)
		}
		for i, b := range got {
			if c := i / size; b != byte(w+c*7+(i%size)>>12) {
				t.Fatalf("writer %d: byte %d is %d, want %d", w, i, b, byte(w+c*7+(i%size)>>12))
			}
		}
	}
}

// TestRingWriteError: a direct write the kernel fails (here: the direct
// descriptor is read-only) is an error naming the file, whichever way it
// was sent.
func TestRingWriteError(t *testing.T) {
	defer func(a bool) { Async = a }(Async)
	for _, async := range []bool{true, false} {
		Async = async
		path := filepath.Join(t.TempDir(), "f")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		ro, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			f.Close()
			t.Logf("%s: O_DIRECT refused here (%v); the error path is pwrite's", path, err)
			return
		}
		raw, err := ro.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		d := &File{f: f, df: ro, raw: raw}
		err = d.WriteAt(AlignedBuf(2*Align), 0)
		if err == nil || !errors.Is(err, unix.EBADF) || !strings.Contains(err.Error(), path) {
			t.Errorf("async=%v: write through a read-only descriptor: %v, want EBADF naming %s", async, err, path)
		}
		d.Close()
		f.Close()
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
