// The temporary folders of bucket mirrors: each locked by the process that
// made it for as long as it lives, so that one left by a killed process
// (kill -9, the OOM killer, a job's time limit) is removed by the next
// mirror made on the machine, and nothing else is.

package manifests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/regfile"
)

const (
	// mirrorPrefix starts the name of a mirror's folder in the temporary
	// folder ($TMPDIR, else /tmp).
	mirrorPrefix = "clipshard-bucket-"
	// mirrorMark is the file that says a folder is a mirror's (written
	// once the folder is locked); mirrorSub holds the mirror itself.
	mirrorMark = "clipshard-mirror"
	mirrorSub  = "mirror"
)

var errRemoved = errors.New("removed meanwhile")

var mirrorMarkText = []byte("A bucket folder's local mirror, made by clipshard (verify or inspect of s3://...). Removed when that run ends, or by the next one if the run was killed.\n")

// mirrorDir makes a mirror's folder, locked (flock on the folder) until
// the returned file is closed, after removing those of processes that are
// gone; it returns the folder and the mirror's place in it.
func mirrorDir() (root, dir string, lock *os.File, err error) {
	sweepMirrors(os.TempDir())
	for try := 0; try < 10; try++ {
		if root, err = os.MkdirTemp("", mirrorPrefix); err != nil {
			return "", "", nil, err
		}
		if lock, err = lockedDir(root); errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, errRemoved) {
			// Taken for an empty leftover by another process's sweep
			// between the two calls: make another.
			os.Remove(root)
			continue
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(root, mirrorMark), mirrorMarkText, 0o644)
		} else {
			// A file system without flock: not marked (a kill leaves it).
			lock, err = nil, nil
		}
		if err == nil {
			err = os.Mkdir(filepath.Join(root, mirrorSub), 0o755)
		}
		if err != nil {
			os.RemoveAll(root)
			lock.Close()
			return "", "", nil, err
		}
		return root, filepath.Join(root, mirrorSub), lock, nil
	}
	return "", "", nil, fmt.Errorf("manifests: a folder for a bucket's mirror in %s: %w", os.TempDir(), err)
}

// lockedDir opens the folder p (not a symbolic link) and takes a
// non-blocking exclusive flock on it, making sure it is still the folder p
// names.
func lockedDir(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: p, Err: err}
	}
	if !atomicfile.SameFile(f, p) {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: p, Err: errRemoved}
	}
	return f, nil
}

// sweepMirrors removes the mirror folders in tmp that no live process
// holds: a folder of mirrorPrefix, of this user, that can be locked and
// holds mirrorMark (a mirror whose process is gone), or is empty (one whose
// process was killed before it marked it). Nothing else is touched.
func sweepMirrors(tmp string) {
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), mirrorPrefix) {
			continue
		}
		p := filepath.Join(tmp, e.Name())
		if st, err := os.Lstat(p); err != nil || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
			continue
		}
		lock, err := lockedDir(p)
		if err != nil {
			continue // a live mirror's
		}
		// (A regular file of the marker's size at most: not a FIFO or a
		// link to /dev/zero, which would block or never end.)
		if mark, err := regfile.ReadFile(filepath.Join(p, mirrorMark), int64(len(mirrorMarkText))); err == nil && string(mark) == string(mirrorMarkText) {
			os.RemoveAll(p)
		} else if errors.Is(err, os.ErrNotExist) {
			os.Remove(p) // only if empty
		}
		lock.Close()
	}
}
