// Files: index.npy, SHA256SUMS and the sha256 of files.

package manifests

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
)

// WriteIndex writes index.npy: int64 [N, 2] of (start, length) per clip.
func WriteIndex(path string, starts, lengths []int64) error {
	if len(starts) != len(lengths) {
		return fmt.Errorf("manifests: %d starts, %d lengths", len(starts), len(lengths))
	}
	data := make([]byte, 16*len(starts))
	for i := range starts {
		binary.LittleEndian.PutUint64(data[16*i:], uint64(starts[i]))
		binary.LittleEndian.PutUint64(data[16*i+8:], uint64(lengths[i]))
	}
	f, err := atomicfile.Create(path)
	if err != nil {
		return err
	}
	defer f.Abort()
	a := &array.Array{DType: array.DType{Kind: array.Int, Size: 8}, Shape: []int{len(starts), 2}, Data: data}
	if err := npy.WriteArray(f, a); err != nil {
		return err
	}
	return f.Commit()
}

// A FileError is a problem of the content of one file: Path is the file,
// Err what is wrong with it (without the path, as verify reports it).
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// ReadIDs reads a dataset's clips.txt at path: its clip ids, one a line
// in row order, each line ending in a newline; a regular file (a FIFO is
// named, not waited on) of at most MaxManifest bytes.
func ReadIDs(path string) ([]string, error) {
	b, err := regfile.ReadFile(path, MaxManifest)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, nil
	}
	ids := strings.Split(string(b), "\n")
	if ids[len(ids)-1] != "" {
		return nil, &FileError{Path: path, Err: errors.New("does not end with a newline")}
	}
	return ids[:len(ids)-1], nil
}

// ReadIndex reads index.npy and returns starts and lengths.
func ReadIndex(path string) (starts, lengths []int64, err error) {
	a, err := npy.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if a.DType != (array.DType{Kind: array.Int, Size: 8}) || len(a.Shape) != 2 || a.Shape[1] != 2 {
		return nil, nil, fmt.Errorf("%w: %s is %s, want int64[N, 2]", ErrManifest, path, a)
	}
	n := a.Shape[0]
	starts, lengths = make([]int64, n), make([]int64, n)
	for i := 0; i < n; i++ {
		starts[i] = int64(binary.LittleEndian.Uint64(a.Data[16*i:]))
		lengths[i] = int64(binary.LittleEndian.Uint64(a.Data[16*i+8:]))
	}
	return starts, lengths, nil
}

// WriteSums writes a SHA256SUMS file that `sha256sum -c` accepts in its
// directory: one "HEX  NAME" line per file, sorted by name.
func WriteSums(path string, sums map[string]string) error {
	return atomicfile.WriteFile(path, FormatSums(sums))
}

// FormatSums is the text of a SHA256SUMS file of sums (WriteSums).
func FormatSums(sums map[string]string) []byte {
	names := make([]string, 0, len(sums))
	for n := range sums {
		names = append(names, n)
	}
	slices.Sort(names)
	var b bytes.Buffer
	for _, n := range names {
		fmt.Fprintf(&b, "%s  %s\n", sums[n], n)
	}
	return b.Bytes()
}

// ReadSums reads a SHA256SUMS file. Names are checked with CheckRelPath.
func ReadSums(path string) (map[string]string, error) {
	f, _, err := regfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSums(f, path)
}

// ParseSums parses the text of a SHA256SUMS file (read from elsewhere: a
// bucket), named name in errors.
func ParseSums(b []byte, name string) (map[string]string, error) {
	return parseSums(bytes.NewReader(b), name)
}

func parseSums(r io.Reader, path string) (map[string]string, error) {
	sums := map[string]string{}
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		hexsum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(hexsum) != 64 {
			if h, n, ok2 := strings.Cut(sc.Text(), " *"); ok2 && len(h) == 64 {
				hexsum, name, ok = h, n, true
			}
		}
		if _, err := hex.DecodeString(hexsum); !ok || err != nil || len(hexsum) != 64 {
			return nil, fmt.Errorf("%w: %s:%d: not a sha256sum line", ErrManifest, path, line)
		}
		if err := CheckRelPath(name); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		sums[name] = hexsum
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return sums, nil
}

// HashFile returns the hex sha256 of the file at path, read in 1 MiB blocks.
func HashFile(path string) (string, error) {
	s, _, err := hashFileCounting(path, nil, func(int64) {})
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Join joins a manifest-relative path to its directory after checking it.
// Confined is Join that also refuses a path whose symlinks resolve
// outside dir (as the Python readers' confined does): a reader never
// follows a link out of the dataset's folder.
func Confined(dir, rel string) (string, error) {
	p, err := Join(dir, rel)
	if err != nil {
		return "", err
	}
	top, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return p, nil // (missing: the open names it)
	}
	if r, err := filepath.Rel(top, real); err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return "", fmt.Errorf("%w: %s: %s resolves outside the folder (a symbolic link to %s)", ErrPath, dir, rel, real)
	}
	return p, nil
}

func Join(dir, rel string) (string, error) {
	if err := CheckRelPath(rel); err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.FromSlash(rel)), nil
}

// LinkOut words a problem for the entry rel of dir (e) that is a symbolic
// link to a file or folder outside dir, which no command or reader
// follows: "" for anything else (a link inside dir is followed as the
// readers follow it).
func LinkOut(dir, rel string, e fs.DirEntry) string {
	if e.Type()&fs.ModeSymlink == 0 {
		return ""
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if st, err := os.Stat(p); err != nil || !(st.Mode().IsRegular() || st.IsDir()) {
		return "" // (a dangling link is missing, a link to a FIFO or a device not a regular file: said as such)
	}
	if _, err := Confined(dir, rel); err != nil {
		to, _ := os.Readlink(p)
		return fmt.Sprintf("a symbolic link to %s, out of the folder: clipshard and its readers follow no link out of a folder they read (move what it points to here instead)", to)
	}
	return ""
}
