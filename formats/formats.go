// Package formats loads one clip's array from a source file of any format
// clipshard reads, so that callers need not care whether a modality is
// stored as .npy or as a pickle.
package formats

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

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
	format, err := FormatOf(path)
	if err != nil {
		return nil, nil, err
	}
	if format == NPY && keys != "" {
		return nil, nil, fmt.Errorf("%s: keys %q given for a .npy file, which holds one array", path, keys)
	}
	f, info, err := openRaw(dirs, path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if !info.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: not a regular file", path)
	}
	var a *array.Array
	switch format {
	case NPY:
		var b []byte
		if buf != nil {
			if int64(cap(*buf)) < info.Size() {
				*buf = make([]byte, info.Size())
			}
			b = *buf
		}
		a, err = npy.ReadBuffer(f, info.Size(), b)
	default:
		var obj any
		obj, err = pickle.Decode(f, info.Size())
		if err == nil {
			a, err = pickle.Select(obj, keys)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, info, nil
}
