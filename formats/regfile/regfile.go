// Package regfile opens files that must be regular files. A manifest names
// blobs, shards and sources by path; if one of them has been replaced by a
// FIFO, a socket or a link to a device (/dev/zero), an ordinary open or read
// blocks forever or never ends. Open never blocks (O_NONBLOCK) and refuses
// anything but a regular file, naming it and what it is.
package regfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular marks a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// Open opens path read-only if it is a regular file (after symlinks), and
// returns it with its FileInfo. The open cannot block: a FIFO with no
// writer, or a device, is refused with an error wrapping ErrNotRegular.
// The caller must Close the file.
func Open(path string) (*os.File, fs.FileInfo, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, Kind(st.Mode))
	}
	// Reads of a regular file ignore O_NONBLOCK; cleared all the same, so
	// that the runtime treats it as the blocking file it is.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, nil, &fs.PathError{Op: "fcntl", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// ReadFile reads the regular file at path whole, refusing one larger than
// limit bytes (a manifest is small: a huge one is not ours).
func ReadFile(path string, limit int64) ([]byte, error) {
	f, fi, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d a file of this kind may have", path, fi.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: grew past %d bytes while being read", path, limit)
	}
	return b, nil
}

// Kind names a file type (a stat's mode) for an error message: "a FIFO".
func Kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("file type %#o", mode&unix.S_IFMT)
}
