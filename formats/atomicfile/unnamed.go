package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/internal/faults"
)

// ErrRefused is returned by WriteUserFile when path names something it
// may not replace; the error says what it is.
var ErrRefused = errors.New("refused")

// WriteUserFile writes data to a path the user named (a report, a page)
// atomically, without ever replacing what it was not allowed to: path
// must not exist, or be a regular file (not a symlink) that mayReplace,
// given it opened read-only, accepts. Anything else there (a device, a
// FIFO, a socket, a directory, a symlink, a file mayReplace refuses) is
// refused with an error wrapping ErrRefused, and nothing is written.
//
// While the data is written the file has no name (O_TMPFILE): a kill
// during the write leaves nothing in the directory, which may hold the
// user's own files. It is given a temporary name (TempPrefix) only for
// the instant before it takes the final one. The final step is atomic
// and checked: renameat2 RENAME_NOREPLACE for a new path (a file created
// there meanwhile is not replaced), RENAME_EXCHANGE for a checked file
// (if what came out is not the file that was checked, it is put back and
// the write refused). Where the filesystem has neither O_TMPFILE nor
// renameat2, a named temporary file and link(2) (create-only) or rename
// after the check stand in.
func WriteUserFile(path string, data []byte, mayReplace func(f *os.File, fi fs.FileInfo) error) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// Refuse before writing anything: the common mistakes (/dev/null, a
	// manifest) are named without a temporary file ever existing.
	checked, err := checkExisting(path, mayReplace)
	if err != nil {
		return err
	}
	tmp, err := writeTemp(dir, base, data)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // a no-op once it has been renamed
	for try := 0; ; try++ {
		if checked == nil {
			err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
				err = unix.Link(tmp, path) // create-only too
			}
			if err == nil {
				faults.Point("atomicfile.renamed")
				return Sync(dir)
			}
			if !errors.Is(err, unix.EEXIST) || try > 2 {
				return &os.LinkError{Op: "rename", Old: tmp, New: path, Err: err}
			}
			// Created meanwhile: check it like any existing file.
			if checked, err = checkExisting(path, mayReplace); err != nil {
				return err
			}
			continue
		}
		err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			if err := os.Rename(tmp, path); err != nil {
				return err
			}
			faults.Point("atomicfile.renamed")
			return Sync(dir)
		}
		if errors.Is(err, unix.ENOENT) && try <= 2 { // removed meanwhile: create it
			checked = nil
			continue
		}
		if err != nil {
			return &os.LinkError{Op: "exchange", Old: tmp, New: path, Err: err}
		}
		// tmp now names what was at path: it must be the file checked.
		out, serr := os.Lstat(tmp)
		if serr != nil || !os.SameFile(out, checked) {
			unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
			return fmt.Errorf("%w: %s changed while it was being replaced; nothing was written", ErrRefused, path)
		}
		faults.Point("atomicfile.renamed")
		return Sync(dir)
	}
}

// CheckUserFile returns the refusal WriteUserFile would give for path
// now, or nil: a check before the work that produces the data.
func CheckUserFile(path string, mayReplace func(f *os.File, fi fs.FileInfo) error) error {
	_, err := checkExisting(path, mayReplace)
	return err
}

// checkExisting returns nil if nothing is at path, the FileInfo of the
// regular file there if mayReplace accepts it, or a refusal.
func checkExisting(path string, mayReplace func(*os.File, fs.FileInfo) error) (fs.FileInfo, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is %s, not a file this command wrote: give a path that does not exist", ErrRefused, path, Kind(fi.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	got, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !os.SameFile(got, fi) || !got.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s changed while it was being checked", ErrRefused, path)
	}
	if err := mayReplace(f, got); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRefused, path, err)
	}
	return got, nil
}

// Kind words a file mode for a refusal: "a directory", "a FIFO", ...
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m.IsRegular():
		return "a regular file"
	}
	return "not a regular file"
}

// writeTemp writes data to a new file in dir with no name while it is
// written (O_TMPFILE), then links it to a temporary name, which it
// returns; without O_TMPFILE (or /proc to link from) it writes a named
// temporary file.
func writeTemp(dir, base string, data []byte) (string, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
			return writeNamedTemp(dir, base, data)
		}
		return "", &os.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, base))
	defer f.Close()
	if err := writeHalves(f, data); err != nil {
		return "", err
	}
	if err := f.Chmod(0o644); err != nil { // the umask applies to O_TMPFILE too
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	faults.Point("atomicfile.written")
	for try := 0; ; try++ {
		tmp := filepath.Join(dir, fmt.Sprintf("%s%s.%d", TempPrefix, base, rand.Uint64()))
		err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.AT_FDCWD, tmp, unix.AT_SYMLINK_FOLLOW)
		if errors.Is(err, unix.EEXIST) && try < 10 {
			continue
		}
		if _, serr := os.Stat("/proc/self/fd"); err != nil && serr != nil { // no /proc to link from
			return writeNamedTemp(dir, base, data)
		}
		if err != nil {
			return "", &os.LinkError{Op: "link", Old: "(unnamed)", New: tmp, Err: err}
		}
		return tmp, nil
	}
}

func writeNamedTemp(dir, base string, data []byte) (string, error) {
	f, err := Create(filepath.Join(dir, base))
	if err != nil {
		return "", err
	}
	if err := writeHalves(f, data); err != nil {
		f.Abort()
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Abort()
		return "", err
	}
	faults.Point("atomicfile.written")
	name := f.Name()
	f.done = true
	if err := f.Close(); err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}
