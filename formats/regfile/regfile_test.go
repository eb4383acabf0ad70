package regfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "a.npy")
	if err := os.WriteFile(reg, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.npy")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	linkFifo := filepath.Join(dir, "link-fifo.npy")
	os.Symlink(fifo, linkFifo)
	linkZero := filepath.Join(dir, "zero.npy")
	os.Symlink("/dev/zero", linkZero)
	linkReg := filepath.Join(dir, "link.npy")
	os.Symlink(reg, linkReg)

	for _, p := range []string{reg, linkReg} {
		f, fi, err := Open(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if fi.Size() != 4 {
			t.Errorf("%s: size %d", p, fi.Size())
		}
		f.Close()
	}
	for _, p := range []string{fifo, linkFifo, linkZero, dir} {
		done := make(chan error, 1)
		go func() {
			f, _, err := Open(p)
			if err == nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("%s: err %v, want ErrNotRegular", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Open blocked", p)
		}
	}
	if _, err := ReadFile(reg, 3); err == nil {
		t.Error("ReadFile over the limit succeeded")
	}
	if b, err := ReadFile(reg, 4); err != nil || string(b) != "data" {
		t.Errorf("ReadFile: %q %v", b, err)
	}
}
