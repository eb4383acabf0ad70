package atomicfile

// Directory commits: a folder built under a temporary name replaces its
// final name in one step.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ReplaceDir publishes the directory src as dst: with dst absent, a
// rename; otherwise an atomic exchange (renameat2 RENAME_EXCHANGE), after
// which the previous dst is at src, whose path is returned as prev for the
// caller to empty (only the caller knows which files in it are its own).
// On a filesystem without RENAME_EXCHANGE the previous dst is first moved
// to src+".old" (prev), so there is a moment without dst. The parent
// directory is synced.
func ReplaceDir(src, dst string) (prev string, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		prev = src
	case errors.Is(err, unix.ENOENT):
		if err := os.Rename(src, dst); err != nil {
			return "", err
		}
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		prev = src + ".old"
		if err := os.Rename(dst, prev); err != nil {
			return "", err
		}
		if err := os.Rename(src, dst); err != nil {
			return prev, err
		}
	default:
		return "", fmt.Errorf("publishing %s: %w", dst, err)
	}
	return prev, Sync(filepath.Dir(dst))
}
