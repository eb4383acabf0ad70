// Package directio writes files with O_DIRECT where the filesystem allows
// it: bytes go from the caller's buffer to the device without passing
// through the page cache (no kernel copy, no dirty pages for a later fsync
// to wait on, no eviction of other users' cache on a shared node).
//
// O_DIRECT needs the memory, the file offset and the length aligned; a
// File writes the whole pages of each write directly and a last partial
// page through the page cache, so callers only need aligned buffers
// (AlignedBuf) and aligned offsets. Where O_DIRECT is refused (tmpfs, some
// FUSE filesystems) everything goes through the page cache.
package directio

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Align is the memory, offset and length alignment of direct writes.
const Align = 4096

// Enabled chooses whether files are written with O_DIRECT when the
// filesystem supports it (tests turn it off to cover the fallback).
var Enabled = true

// AlignedBuf returns n bytes starting at an address that is a multiple of
// Align.
func AlignedBuf(n int) []byte {
	b := make([]byte, n+Align)
	skip := int(-uintptr(unsafe.Pointer(&b[0])) & (Align - 1))
	return b[skip : skip+n : skip+n]
}

// MapBuf returns n bytes of anonymous memory outside the Go heap, aligned
// to the page and, where the kernel offers transparent huge pages on
// request, backed by them: filling a fresh 4 MiB buffer then takes two
// page faults instead of a thousand. Release it with Unmap once nothing
// refers to it. If mapping fails it falls back to AlignedBuf (Unmap then
// does nothing).
func MapBuf(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return AlignedBuf(n)
	}
	unix.Madvise(b, unix.MADV_HUGEPAGE) // advisory: fine if refused
	return b
}

// Unmap releases a buffer from MapBuf. (For the AlignedBuf fallback,
// Munmap refuses memory it did not map, and the GC has it.)
func Unmap(b []byte) { unix.Munmap(b) }

// File writes to f, directly where it can. It does not own f.
type File struct {
	f   *os.File
	df  *os.File        // O_DIRECT, or nil
	raw syscall.RawConn // df's
}

// New returns a File writing to f (opened for writing), with a second,
// O_DIRECT descriptor on the same file if Enabled and possible.
func New(f *os.File) *File {
	d := &File{f: f}
	if Enabled {
		if df, err := os.OpenFile(f.Name(), os.O_WRONLY|unix.O_DIRECT, 0); err == nil {
			if d.raw, err = df.SyscallConn(); err != nil {
				df.Close()
			} else {
				d.df = df
			}
		}
	}
	return d
}

// Direct reports whether writes go around the page cache.
func (d *File) Direct() bool { return d.df != nil }

// WriteAt writes p at off, which must be a multiple of Align, as must be
// p's address for the direct path (see AlignedBuf). It is not safe for
// concurrent use.
func (d *File) WriteAt(p []byte, off int64) error {
	if off%Align != 0 {
		return fmt.Errorf("directio: %s: unaligned offset %d", d.f.Name(), off)
	}
	start := 0
	if whole := len(p) &^ (Align - 1); d.df != nil && whole > 0 {
		var err error
		if n, ok := d.writeAsync(p[:whole], off); !ok {
			_, err = d.df.WriteAt(p[n:whole], off+int64(n))
		}
		switch {
		case errors.Is(err, unix.EINVAL):
			// The filesystem took O_DIRECT at open but refuses the write.
			d.df.Close()
			d.df = nil
		case err != nil:
			return err
		default:
			start = whole
		}
	}
	if start < len(p) {
		if _, err := d.f.WriteAt(p[start:], off+int64(start)); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the direct descriptor (not the file given to New).
func (d *File) Close() error {
	if d.df == nil {
		return nil
	}
	err := d.df.Close()
	d.df = nil
	return err
}
