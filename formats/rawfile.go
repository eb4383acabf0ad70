// Raw files: sources opened with plain system calls, relative to folders
// kept open.

package formats

import (
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"github.com/clipshard/clipshard/formats/regfile"

	"golang.org/x/sys/unix"
)

// rawFile is a source file opened with plain system calls. os.Open costs
// five more per file (fcntl calls and a failing epoll registration, since
// the runtime poller does not take regular files), which is a third of the
// time spent per file on a set of thousands of small clips. O_NONBLOCK
// keeps a FIFO from blocking the open; it has no effect on regular files.
type rawFile struct {
	fd   int
	path string
}

// Dirs keeps directories open so that opening many files of a few folders
// resolves only the last path component per open (openat), not the whole
// path again; on a set of thousands of small clips the path walk was a
// tenth of convert's CPU time. At most maxDirs folders are kept (a layout
// with a folder per clip gains nothing and must not run out of
// descriptors). Safe for concurrent use; the zero value is ready.
type Dirs struct {
	mu  sync.Mutex
	fds map[string]int
}

const maxDirs = 64

// dir returns a descriptor of the directory dir, or -1 to use full paths.
func (d *Dirs) dir(dir string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if fd, ok := d.fds[dir]; ok {
		return fd
	}
	if d.fds == nil {
		d.fds = map[string]int{}
	}
	if len(d.fds) >= maxDirs {
		return -1
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fd = -1 // not cached: the open by full path reports the error
	} else {
		d.fds[dir] = fd
	}
	return fd
}

// Close closes the directories.
func (d *Dirs) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, fd := range d.fds {
		unix.Close(fd)
	}
	d.fds = nil
}

// at is where dirs resolves path from: a kept folder's descriptor and the
// last component, or AT_FDCWD and path.
func (d *Dirs) at(path string) (int, string) {
	if d != nil {
		dir, base := filepath.Split(path)
		if dir != "" && base != "" {
			if dfd := d.dir(dir); dfd >= 0 {
				return dfd, base
			}
		}
	}
	return unix.AT_FDCWD, path
}

func openRaw(dirs *Dirs, path string) (*rawFile, fs.FileInfo, error) {
	var fd int
	var err error
	at, name := dirs.at(path)
	for {
		fd, err = unix.Openat(at, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := &rawFile{fd: fd, path: path}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return f, &rawInfo{name: filepath.Base(path), st: st}, nil
}

// openSettled opens path as openRaw does, refusing anything but a regular
// file, once its ctime is StableWait old: a file changed just before the
// open is closed and opened again after StableWait (stableTries opens),
// so that a change while it is read shows in its ctime. The FileInfo's
// ReadBegan is when the last open began.
func openSettled(dirs *Dirs, path string) (*rawFile, fs.FileInfo, error) {
	for try := 1; ; try++ {
		began := time.Now()
		f, info, err := openRaw(dirs, path)
		if err != nil {
			return nil, nil, err
		}
		if !info.Mode().IsRegular() {
			f.Close()
			return nil, nil, fmt.Errorf("%s: %w (%s)", path, regfile.ErrNotRegular, regfile.Kind(info.(*rawInfo).st.Mode))
		}
		ri := info.(*rawInfo)
		ri.began = began
		if ri.st.Ctim.Nano() < began.Add(-StableWait).UnixNano() {
			return f, info, nil
		}
		f.Close()
		if try == stableTries {
			return nil, nil, fmt.Errorf("%w: %s: changed within %v of each of %d opens; run again once it is written", ErrChanged, path, StableWait, stableTries)
		}
		time.Sleep(StableWait)
	}
}

// ReadAt implements io.ReaderAt with pread.
func (f *rawFile) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Pread(f.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "read", Path: f.path, Err: err}
		}
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) Close() error { return unix.Close(f.fd) }

// stat fstats the open file.
func (f *rawFile) stat() (fs.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: f.path, Err: err}
	}
	return &rawInfo{name: filepath.Base(f.path), st: st}, nil
}

// rawInfo is the fs.FileInfo of a rawFile, from fstat.
type rawInfo struct {
	name  string
	st    unix.Stat_t
	began time.Time // when the read it describes began (see ReadBegan)
}

// ReadBegan returns when the read of the file that fi describes began, as
// LoadIntoDirs and OpenNPYRows return it (zero for other FileInfos).
func ReadBegan(fi fs.FileInfo) time.Time {
	if r, ok := fi.(*rawInfo); ok {
		return r.began
	}
	return time.Time{}
}

func (i *rawInfo) Name() string       { return i.name }
func (i *rawInfo) Size() int64        { return i.st.Size }
func (i *rawInfo) ModTime() time.Time { return time.Unix(i.st.Mtim.Sec, i.st.Mtim.Nsec) }
func (i *rawInfo) IsDir() bool        { return i.Mode().IsDir() }
func (i *rawInfo) Sys() any           { return &i.st }

func (i *rawInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.st.Mode & 0o777)
	switch i.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	return m
}
