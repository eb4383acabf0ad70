// Package formats loads one clip's array from a source file of any format
// clipshard reads, so that callers need not care whether a modality is
// stored as .npy or as a pickle.
package formats

import (
	"errors"
	"fmt"
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
	f, err := FormatOf(path)
	if err != nil {
		return nil, err
	}
	switch f {
	case NPY:
		if keys != "" {
			return nil, fmt.Errorf("%s: keys %q given for a .npy file, which holds one array", path, keys)
		}
		return npy.ReadFile(path)
	default:
		obj, err := pickle.DecodeFile(path)
		if err != nil {
			return nil, err
		}
		a, err := pickle.Select(obj, keys)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return a, nil
	}
}
