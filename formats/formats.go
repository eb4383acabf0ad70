// Package formats loads one clip's array from a source file of any format
// clipshard reads, so that callers need not care whether a modality is
// stored as .npy or as a pickle.
package formats

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/pickle"
)

// ErrUnknownFormat marks a path whose extension names no format clipshard
// reads.
var ErrUnknownFormat = errors.New("formats: unknown file extension (want .npy, .pkl or .pickle)")

// Format is a source file format.
type Format int

// Formats by extension.
const (
	NPY    Format = iota + 1 // .npy
	Pickle                   // .pkl, .pickle
)

// FormatOf returns the format of path from its extension.
func FormatOf(path string) (Format, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npy":
		return NPY, nil
	case ".pkl", ".pickle":
		return Pickle, nil
	}
	return 0, fmt.Errorf("%s: %w", path, ErrUnknownFormat)
}

// Load reads the array stored at path. For pickles, keys selects it (see
// pickle.Select; "" means the pickle holds a bare array); for .npy files
// keys must be empty. The array is C-ordered and little-endian. Errors name
// the path and, for pickles, the key.
func Load(path, keys string) (*array.Array, error) {
	a, _, err := LoadInto(path, keys, nil)
	return a, err
}

// LoadInto is Load with one open of path, returning the file's FileInfo
// from that same open (size and mtime of exactly what was read). If buf is
// not nil, a .npy file is read with a single read into *buf, which is grown
// first if it is too small, and the array aliases it; pickles allocate
// their own payloads.
func LoadInto(path, keys string, buf *[]byte) (*array.Array, fs.FileInfo, error) {
	return LoadIntoDirs(nil, path, keys, buf)
}

// LoadIntoDirs is LoadInto opening path relative to a directory kept open
// in dirs (see Dirs), if dirs is not nil.
func LoadIntoDirs(dirs *Dirs, path, keys string, buf *[]byte) (*array.Array, fs.FileInfo, error) {
	var bufFor func(int64) *[]byte
	if f, _ := FormatOf(path); buf != nil && f == NPY {
		bufFor = func(int64) *[]byte { return buf }
	}
	a, info, _, err := LoadOrRows(dirs, path, keys, bufFor, -1)
	return a, info, err
}

// LoadOrRows is LoadIntoDirs with its buffers taken from bufFor (if not
// nil; each grown if it is too small) once their sizes are known: the
// whole .npy file, or a pickle of up to 16 MiB and the array concatenated
// from several of its keys. The array may alias any of them: the caller
// keeps them until it is done with the array. A .npy file larger than
// above bytes (above >= 0) is not read: it comes back open as NPYRows
// (only its header read, as OpenNPYRows does), with a nil array and
// FileInfo. One open and stat of the file decide and read (a stat by path
// first cost a convert of many small clips a syscall a source).
// LabelKeys makes the keys of a label read from a pickle (convert --label
// NAME=TEMPLATE.pkl:KEY) for LoadOrRows: the array it gives holds the
// label's UTF-8 bytes (uint8 [n], source descr LabelDescr), a str at key
// or an int at key written in decimal (pickle.SelectLabel).
func LabelKeys(key string) string { return labelKeys + key }

// LabelDescr is the source descr of a label read with LabelKeys.
const LabelDescr = "label"

const labelKeys = "\x00label:"

func LoadOrRows(dirs *Dirs, path, keys string, bufFor func(size int64) *[]byte, above int64) (*array.Array, fs.FileInfo, *NPYRows, error) {
	format, err := FormatOf(path)
	if err != nil {
		return nil, nil, nil, err
	}
	if format == NPY && keys != "" {
		return nil, nil, nil, fmt.Errorf("%s: keys %q given for a .npy file, which holds one array", path, keys)
	}
	if format != NPY {
		above = -1
	}
	for try := 1; ; try++ {
		a, info, after, rows, err := loadOnce(dirs, path, format, keys, bufFor, above)
		switch {
		case rows != nil:
			return nil, nil, rows, nil
		case after == nil:
			return nil, nil, nil, err // not opened, or not a regular file, or never settled
		case !Changed(info, after) && err == nil && recent(info):
			// Changed shortly before the read: a writer may be paused in
			// the middle of a version (its timestamps are set as a write
			// begins, not as it ends). Read it again once it has been
			// quiet for QuietWindow: one version reads the same twice.
			if again(dirs, path, format, keys, a, info) {
				after.(*rawInfo).began = info.(*rawInfo).began
				return a, after, nil, nil
			}
			if try == stableTries {
				return nil, nil, nil, fmt.Errorf("%w: %s: %d reads, each read again %v later, saw it change (its bytes, size, mtime, ctime or inode); run again once it is written",
					ErrChanged, path, stableTries, QuietWindow)
			}
			time.Sleep(StableWait)
			continue
		case !Changed(info, after) && err == nil:
			after.(*rawInfo).began = info.(*rawInfo).began
			return a, after, nil, nil
		case !Changed(info, after):
			return nil, nil, nil, err // bad input, as read whole
		case try == stableTries:
			return nil, nil, nil, fmt.Errorf("%w: %s: %d reads %v apart each saw it change (size, mtime, ctime or inode) while it was read; run again once it is written",
				ErrChanged, path, stableTries, StableWait)
		}
		time.Sleep(StableWait)
	}
}

// ErrChanged marks a source that kept changing while it was read: what was
// read may hold parts of two versions.
var ErrChanged = errors.New("formats: the file changed while it was read")

// StableWait is how long a source must have been unchanged (by its ctime)
// when it is opened, and how long LoadIntoDirs waits before it reads again
// a file that changed while it was read; stableTries opens or reads are
// made. Timestamps advance by the kernel's tick (up to 10 ms): a write in
// the tick of the last one leaves the ctime as it was, but not one 20 ms
// later, so a change during a read that starts on a settled file always
// shows.
const (
	StableWait  = 20 * time.Millisecond
	stableTries = 5
)

// QuietWindow is how long a source must have been left alone (by its
// ctime) for one read of it to be trusted; one changed more recently is
// read a second time once it has been quiet that long, and kept only if
// both reads agree. A file's timestamps are set when a write begins, so a
// writer descheduled in the middle of a version leaves the file mixed and
// its ctime as it was: the second read, QuietWindow later, sees the rest
// of the version (a writer stalled longer than QuietWindow in the middle
// of a version is indistinguishable from one that finished). A ctime of a
// whole second (a filesystem that keeps no finer time) counts as recent
// for CoarseQuiet.
const (
	QuietWindow = 250 * time.Millisecond
	CoarseQuiet = 2 * time.Second
)

// recent reports whether the file info describes changed within its quiet
// window before its read began.
func recent(info fs.FileInfo) bool {
	ri := info.(*rawInfo)
	w := QuietWindow
	if ri.st.Ctim.Nsec == 0 {
		w = CoarseQuiet
	}
	return ri.st.Ctim.Nano() >= ri.began.Add(-w).UnixNano()
}

// again reads path a second time once its ctime is a quiet window old,
// and reports whether it read the same array with the same stat as the
// first read (a, info).
func again(dirs *Dirs, path string, format Format, keys string, a *array.Array, info fs.FileInfo) bool {
	ri := info.(*rawInfo)
	w := QuietWindow
	if ri.st.Ctim.Nsec == 0 {
		w = CoarseQuiet
	}
	if wait := time.Until(time.Unix(0, ri.st.Ctim.Nano()).Add(w)); wait > 0 {
		time.Sleep(min(wait, w))
	}
	b, info2, after2, _, err := loadOnce(dirs, path, format, keys, nil, -1)
	if after2 == nil || err != nil || Changed(info, info2) || Changed(info, after2) {
		return false
	}
	return b.SourceDescr == a.SourceDescr && slices.Equal(b.Shape, a.Shape) && bytes.Equal(b.Data, a.Data)
}

// Changed reports whether two stats of one open file differ in size,
// mtime, ctime or inode.
func Changed(a, b fs.FileInfo) bool {
	x, y := &a.(*rawInfo).st, &b.(*rawInfo).st
	return x.Size != y.Size || x.Mtim != y.Mtim || x.Ctim != y.Ctim || x.Ino != y.Ino || x.Dev != y.Dev
}

// pickleInBuf is the size up to which LoadOrRows reads a pickle into a
// buffer of bufFor.
const pickleInBuf = 16 << 20

// sized returns a buffer of bufFor of n bytes, grown if it is smaller.
func sized(bufFor func(int64) *[]byte, n int64) []byte {
	b := bufFor(n)
	if int64(cap(*b)) < n {
		*b = make([]byte, n)
	}
	return (*b)[:n]
}

// loadOnce opens path (openSettled), reads its array, and stats the open
// file again after the read (after is nil when it was not opened); a .npy
// file larger than above (>= 0) is returned open as rows instead.
func loadOnce(dirs *Dirs, path string, format Format, keys string, bufFor func(int64) *[]byte, above int64) (a *array.Array, info, after fs.FileInfo, rows *NPYRows, err error) {
	f, info, err := openSettled(dirs, path)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if above >= 0 && info.Size() > above {
		rows, err := npyRows(f, info, path)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		return nil, nil, nil, rows, nil
	}
	defer f.Close()
	switch format {
	case NPY:
		if err = checkWhole(info.Size()); err != nil {
			break
		}
		var b []byte
		if bufFor != nil {
			b = sized(bufFor, info.Size())
		}
		a, err = npy.ReadBuffer(f, info.Size(), b)
	default:
		var obj any
		if bufFor == nil || info.Size() > pickleInBuf {
			// (A larger one is scanned before anything is allocated: a
			// sparse file of a terabyte is refused, not allocated.)
			obj, err = pickle.Decode(f, info.Size())
		} else {
			// Read into a buffer of bufFor, which the arrays alias.
			obj, err = pickle.DecodeIn(f, info.Size(), sized(bufFor, info.Size()))
		}
		if key, label := strings.CutPrefix(keys, labelKeys); err == nil && label {
			var s string
			if s, err = pickle.SelectLabel(obj, key); err == nil {
				a = &array.Array{DType: array.DType{Kind: array.Uint, Size: 1}, Shape: []int{len(s)}, Data: []byte(s), SourceDescr: LabelDescr}
			}
		} else if err == nil {
			var alloc func(int) []byte
			if bufFor != nil {
				alloc = func(n int) []byte { return sized(bufFor, int64(n)) }
			}
			a, err = pickle.SelectIn(obj, keys, alloc)
		}
	}
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
	}
	after, serr := f.stat()
	if serr != nil {
		return nil, nil, nil, nil, serr
	}
	return a, info, after, nil, err
}
