package atomicfile

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/internal/faults"
)

// WriteFileUnnamed writes data to path atomically, as WriteFile, but
// while the data is written the file has no name (O_TMPFILE): a kill
// during the write leaves nothing in the directory, which may hold the
// user's own files and has no lock or cleanup of clipshard's. The file is
// given a temporary name (TempPrefix) only for the instant between its
// link and its rename into place. Where the filesystem has no O_TMPFILE,
// it is WriteFile.
func WriteFileUnnamed(path string, data []byte) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
			return WriteFile(path, data)
		}
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := writeHalves(f, data); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil { // the umask applies to O_TMPFILE too
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	faults.Point("atomicfile.written")
	for try := 0; ; try++ {
		tmp := filepath.Join(dir, fmt.Sprintf("%s%s.%d", TempPrefix, base, rand.Uint64()))
		err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.AT_FDCWD, tmp, unix.AT_SYMLINK_FOLLOW)
		if errors.Is(err, unix.EEXIST) && try < 10 {
			continue
		}
		if _, serr := os.Stat("/proc/self/fd"); err != nil && serr != nil { // no /proc to link from
			return WriteFile(path, data)
		}
		if err != nil {
			return &os.LinkError{Op: "link", Old: "(unnamed)", New: tmp, Err: err}
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return err
		}
		return Sync(dir)
	}
}
