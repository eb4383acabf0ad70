// Package atomicfile writes a file under a temporary name in its target
// directory and renames it into place only when it is complete, so that a
// crash or kill leaves either the previous file or none, never a partial one.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/clipshard/clipshard/internal/faults"
)

// File is an *os.File being written under a temporary name. Call Commit to
// publish it under its final name, or Abort to remove it; exactly one of
// them must be called. A File is not safe for concurrent use.
type File struct {
	*os.File
	final string
	done  bool
}

// TempPrefix starts the name of every temporary file this package creates,
// so that cleanup tools and verify can recognise leftovers.
const TempPrefix = ".clipshard-tmp-"

// Create creates a temporary file in the directory of path. The file is
// named TempPrefix + base(path) + a random suffix.
func Create(path string) (*File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, TempPrefix+base+".*")
	if err != nil {
		return nil, err
	}
	// CreateTemp makes 0600 files; published files are readable like any
	// other output.
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return &File{File: f, final: path}, nil
}

// Final returns the name the file will have once committed.
func (f *File) Final() string { return f.final }

// Commit flushes the file to stable storage, closes it, renames it to its
// final name (replacing any file there) and syncs the directory. On error
// the temporary file is removed.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("atomicfile: %s: already finished", f.final)
	}
	f.done = true
	faults.Point("atomicfile.written")
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), f.final)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	faults.Point("atomicfile.renamed")
	return Sync(filepath.Dir(f.final))
}

// Abort closes and removes the temporary file. It is a no-op after Commit
// or a previous Abort, so it can be deferred.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.Close()
	os.Remove(f.Name())
}

// Sync fsyncs the file or directory at path (a directory, so that renames
// inside it are durable).
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// WriteFile writes data to path atomically.
func WriteFile(path string, data []byte) error {
	f, err := Create(path)
	if err != nil {
		return err
	}
	defer f.Abort()
	if err := writeHalves(f, data); err != nil {
		return err
	}
	return f.Commit()
}

// writeHalves writes data in two halves, with the fault point a crash
// test kills at between them (a file half written).
func writeHalves(w io.Writer, data []byte) error {
	half := len(data) / 2
	if _, err := w.Write(data[:half]); err != nil {
		return err
	}
	faults.Point("atomicfile.half")
	_, err := w.Write(data[half:])
	return err
}
