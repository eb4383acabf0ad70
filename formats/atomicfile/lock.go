package atomicfile

// Locks that let processes share an output: flock on a directory (runs
// take turns at its manifests) and on lock files (a run claims a part of
// the output, or a whole output, for as long as it writes it).

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrLocked marks a lock another process holds (wraps EWOULDBLOCK).
var ErrLocked = fmt.Errorf("held by another process: %w", unix.EWOULDBLOCK)

// LockDir takes a flock on the directory dir, exclusive or (shared) not,
// waiting for it; the returned func releases it.
func LockDir(dir string, shared bool) (func(), error) {
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// TryLock creates (or opens, read-write) the lock file p and takes a
// non-blocking exclusive flock on it, making sure the lock is on the file
// that p names (a process removing a stale lock may have unlinked it
// meanwhile). A lock held for a moment (such a removal probing it) is
// waited out; one held longer fails with an error wrapping ErrLocked.
// Closing the file releases the lock.
func TryLock(p string) (*os.File, error) {
	var err error
	for try := 0; try < 20; try++ {
		if try > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		var f *os.File
		if f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644); err != nil {
			return nil, err
		}
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if !errors.Is(err, unix.EWOULDBLOCK) {
				return nil, err
			}
			err = fmt.Errorf("%s: %w", p, ErrLocked)
			continue
		}
		if SameFile(f, p) {
			return f, nil
		}
		f.Close() // unlinked by a stale-lock cleanup: take the new one
		err = fmt.Errorf("%s keeps being replaced", p)
	}
	return nil, err
}

// Held reports whether a live process holds a flock on the file p.
func Held(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
		return true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// SameFile reports whether the open file f is the one path p names.
func SameFile(f *os.File, p string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(p)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}
