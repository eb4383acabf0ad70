// Segments and versions (format 2, #61): a dataset that grew or changed
// by `convert --segments` is a list of immutable blobs per modality (the
// first convert's, under today's names, and one segment folder per later
// change), and numbered versions, each a manifest that says where every
// clip's rows are. See docs/FORMAT.md, "Segments and versions".

package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
)

// Names of format 2's folders and files.
const (
	SegmentsDir = "segments" // segments/<id>/<modality>.npy
	VersionsDir = "versions" // versions/<n>/ holds version n's manifests
	WhereFile   = "where.npy"
)

// Blob is one blob of a modality: a .npy of rows, data at DataOffset.
type Blob struct {
	File       string `json:"file"`
	Rows       int64  `json:"rows"`
	DataOffset int64  `json:"data_offset"`
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
}

// Previous names the version a version was made from.
type Previous struct {
	Version int    `json:"dataset_version"`
	SHA256  string `json:"sha256"` // of its dataset.json
}

// Segmented reports whether d is of format 2 (a dataset in segments).
func (d *Dataset) Segmented() bool { return d.Version == 2 }

// Number returns the dataset's version number (1 for format 1).
func (d *Dataset) Number() int { return max(1, d.DatasetVersion) }

// BlobList returns the modality's blobs: its Blobs (format 2), or its one
// blob (format 1).
func (m *Modality) BlobList() []Blob {
	if m.Blobs != nil {
		return m.Blobs
	}
	return []Blob{{File: m.File, Rows: m.Rows, DataOffset: m.DataOffset, Size: m.Size, SHA256: m.SHA256}}
}

// BlobFiles returns every blob file of d, modality by modality.
func (d *Dataset) BlobFiles() []string {
	var out []string
	for i := range d.Modalities {
		for _, b := range d.Modalities[i].BlobList() {
			out = append(out, b.File)
		}
	}
	return out
}

// Where is a format 2 version's where.npy: for clip i and modality k, the
// blob (an index into the modality's Blobs) and the first row there.
type Where struct {
	Clips, Mods int
	a           []int64
}

// NewWhere returns a Where of clips × mods, all zero.
func NewWhere(clips, mods int) *Where {
	return &Where{Clips: clips, Mods: mods, a: make([]int64, 2*clips*mods)}
}

// At returns the blob and first row of clip i's rows of modality k.
func (w *Where) At(i, k int) (blob int, first int64) {
	o := 2 * (i*w.Mods + k)
	return int(w.a[o]), w.a[o+1]
}

// Set records clip i's rows of modality k: in blob b from row first.
func (w *Where) Set(i, k, b int, first int64) {
	o := 2 * (i*w.Mods + k)
	w.a[o], w.a[o+1] = int64(b), first
}

// Locate returns where clip i's rows of modality k are: the blob's index
// in BlobList, its first row there and the number of rows, given the
// clip's start and length in frames (index.npy). w is nil for format 1.
func (d *Dataset) Locate(w *Where, k, i int, start, length int64) (blob int, first, n int64) {
	m := &d.Modalities[k]
	f, n := m.ClipRows(i, start, length)
	if w == nil {
		return 0, f, n
	}
	blob, first = w.At(i, k)
	return blob, first, n
}

// SampleRows returns where the rows of frames [from, from+frames) of clip
// i (start: its start in index.npy) of modality k are: the blob's index,
// its first row there and the number of rows (a per-clip modality: the
// clip's one row). w is nil for format 1.
func (d *Dataset) SampleRows(w *Where, k, i int, start, from, frames int64) (blob int, first, n int64) {
	m := &d.Modalities[k]
	if w == nil {
		f, n := m.ClipRows(i, start+from, frames)
		return 0, f, n
	}
	blob, first = w.At(i, k)
	if m.PerClip {
		return blob, first, 1
	}
	return blob, first + from*int64(m.Rate), frames * int64(m.Rate)
}

// WriteWhere writes w as a .npy of int64 [clips, modalities, 2].
func WriteWhere(p string, w *Where) error {
	data := make([]byte, 8*len(w.a))
	for i, v := range w.a {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(v))
	}
	f, err := atomicfile.Create(p)
	if err != nil {
		return err
	}
	defer f.Abort()
	a := &array.Array{DType: array.DType{Kind: array.Int, Size: 8}, Shape: []int{w.Clips, w.Mods, 2}, Data: data}
	if err := npy.WriteArray(f, a); err != nil {
		return err
	}
	return f.Commit()
}

// ReadWhere reads where.npy at p for d (of format 2) and checks it: its
// shape, and that every clip's rows, counted from starts and lengths
// (index.npy), lie inside the blob it names.
func ReadWhere(p string, d *Dataset, starts, lengths []int64) (*Where, error) {
	a, err := npy.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if a.DType != (array.DType{Kind: array.Int, Size: 8}) || len(a.Shape) != 3 || int64(a.Shape[0]) != d.Clips || a.Shape[1] != len(d.Modalities) || a.Shape[2] != 2 {
		return nil, fmt.Errorf("%w: %s is %s, want int64[%d, %d, 2] (clips, modalities, blob and first row)", ErrManifest, p, a, d.Clips, len(d.Modalities))
	}
	w := &Where{Clips: a.Shape[0], Mods: a.Shape[1], a: make([]int64, len(a.Data)/8)}
	for i := range w.a {
		w.a[i] = int64(binary.LittleEndian.Uint64(a.Data[8*i:]))
	}
	if len(starts) != w.Clips {
		return w, nil // the index's own problem, reported by its check
	}
	for i := 0; i < w.Clips; i++ {
		for k := range d.Modalities {
			b, first, n := d.Locate(w, k, i, starts[i], lengths[i])
			blobs := d.Modalities[k].BlobList()
			if b < 0 || b >= len(blobs) || first < 0 || n < 0 || first > blobs[b].Rows-n {
				return nil, fmt.Errorf("%w: %s: clip %d, modality %q: blob %d rows %d..%d: outside the modality's %d blobs or that blob's rows",
					ErrManifest, p, i, d.Modalities[k].Name, b, first, first+n, len(blobs))
			}
		}
	}
	return w, nil
}

// LoadWhere reads the where.npy of d in dir (nil for format 1) with the
// index it goes with.
func LoadWhere(dir string, d *Dataset, starts, lengths []int64) (*Where, error) {
	if !d.Segmented() {
		return nil, nil
	}
	return ReadWhere(filepath.Join(dir, d.Files.Where), d, starts, lengths)
}

// VersionDir returns the folder of version n's manifests (slash path).
func VersionDir(n int) string { return path.Join(VersionsDir, strconv.Itoa(n)) }

// VersionFile returns the path of version n's dataset.json (slash path).
func VersionFile(n int) string { return path.Join(VersionDir(n), DatasetFile) }

var (
	versionName = regexp.MustCompile(`^[1-9][0-9]{0,8}$`)
	segmentName = regexp.MustCompile(`^[0-9a-f]{16}$`)
)

// SegmentID returns the name of a segment's folder: 16 hex digits of the
// sha256 of its blobs' names and sha256s.
func SegmentID(blobs map[string]string) string {
	names := make([]string, 0, len(blobs))
	for n := range blobs {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	h.Write([]byte("clipshard segment 1\n"))
	for _, n := range names {
		fmt.Fprintf(h, "%s %s\n", n, blobs[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// KeptVersions returns the numbers of the versions whose dataset.json is
// in dir's versions folder, ascending (none for a dataset of format 1).
func KeptVersions(dir string) ([]int, error) {
	entries, err := os.ReadDir(filepath.Join(dir, VersionsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// A version above the current one is what a convert --segments killed
	// before its commit (dataset.json) left: not kept, never read.
	current := math.MaxInt
	if d, err := LoadDataset(dir); err == nil {
		current = d.Number()
	}
	var out []int
	for _, e := range entries {
		if !e.IsDir() || !versionName.MatchString(e.Name()) {
			continue
		}
		if n, _ := strconv.Atoi(e.Name()); n > current {
			continue
		}
		if st, err := os.Lstat(filepath.Join(dir, VersionsDir, e.Name(), DatasetFile)); err != nil || !st.Mode().IsRegular() {
			continue
		}
		n, _ := strconv.Atoi(e.Name())
		out = append(out, n)
	}
	sort.Ints(out)
	return out, nil
}

// LoadVersion reads version n's dataset.json of the dataset in dir (for
// n = the current version of a format 1 dataset: dataset.json itself).
func LoadVersion(dir string, n int) (*Dataset, []byte, error) {
	p := filepath.Join(dir, filepath.FromSlash(VersionFile(n)))
	b, err := regfile.ReadFile(p, MaxManifest)
	if errors.Is(err, fs.ErrNotExist) {
		if d, err2 := LoadDataset(dir); err2 == nil && !d.Segmented() && n == 1 {
			b, err := regfile.ReadFile(filepath.Join(dir, DatasetFile), MaxManifest)
			return d, b, err
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: version %d of %s: %w", ErrManifest, n, dir, err)
	}
	d, err := ParseDataset(p, b)
	if err != nil {
		return nil, nil, err
	}
	if d.Number() != n {
		return nil, nil, fmt.Errorf("%w: %s says version %d", ErrManifest, p, d.Number())
	}
	return d, b, nil
}

// FindVersion returns the version of the dataset in dir whose dataset.json
// has sha256 sum: the current one, or a kept one; nil if none has.
func FindVersion(dir, sum string) (*Dataset, error) {
	b, err := regfile.ReadFile(filepath.Join(dir, DatasetFile), MaxManifest)
	if err != nil {
		return nil, err
	}
	if h := sha256.Sum256(b); hex.EncodeToString(h[:]) == sum {
		return ParseDataset(filepath.Join(dir, DatasetFile), b)
	}
	ns, err := KeptVersions(dir)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		d, vb, err := LoadVersion(dir, n)
		if err != nil {
			continue
		}
		if h := sha256.Sum256(vb); hex.EncodeToString(h[:]) == sum {
			return d, nil
		}
	}
	return nil, nil
}

// DirFiles returns the files of the dataset in dir that some kept version
// lists (the current one's, and those of versions/*): what a replace may
// remove, and what verify expects to find.
func DirFiles(dir string, d *Dataset) (map[string]bool, error) {
	own := d.OwnFiles()
	if !d.Segmented() {
		return own, nil // (a versions folder beside it is a killed run's)
	}
	ns, err := KeptVersions(dir)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		v, _, err := LoadVersion(dir, n)
		if err != nil {
			return nil, err
		}
		for f := range v.OwnFiles() {
			own[f] = true
		}
		own[VersionFile(n)] = true
	}
	return own, nil
}

// Leftover reports whether rel (a slash path in a dataset folder, isDir
// if a folder) is what a convert --segments killed before its commit
// leaves: a segment's folder or a version's, which no kept version lists.
func Leftover(rel string, isDir bool) bool {
	parts := bytes.Split([]byte(rel), []byte("/"))
	if len(parts) < 2 || len(parts) > 3 {
		return false
	}
	switch string(parts[0]) {
	case SegmentsDir:
		return segmentName.Match(parts[1]) || bytes.HasPrefix(parts[1], []byte(atomicfile.TempPrefix))
	case VersionsDir:
		return versionName.Match(parts[1]) || bytes.HasPrefix(parts[1], []byte(atomicfile.TempPrefix))
	}
	return false
}

// ParseDataset parses and checks the dataset.json bytes b read from p.
func ParseDataset(p string, b []byte) (*Dataset, error) {
	var d Dataset
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, p, err)
	}
	if err := d.check(p); err != nil {
		return nil, err
	}
	return &d, nil
}

// DropPrefix names a version folder being dropped (convert --keep):
// versions/N is renamed to versions/<DropPrefix>N first, then the files
// only it listed are removed, then the folder (its dataset.json last).
const DropPrefix = atomicfile.TempPrefix + "drop-"

// DroppingFiles returns the files that the versions being dropped in dir
// (versions/<DropPrefix>N, of a convert --keep killed before it
// finished) list outside the versions folder, and those folders: what
// is left to remove of them where no kept version lists it.
func DroppingFiles(dir string) (map[string]bool, []string, error) {
	entries, err := os.ReadDir(filepath.Join(dir, VersionsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	files := map[string]bool{}
	var dirs []string
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), DropPrefix)
		if !ok || !e.IsDir() || !versionName.MatchString(num) {
			continue
		}
		rel := path.Join(VersionsDir, e.Name())
		dirs = append(dirs, rel)
		p := filepath.Join(dir, filepath.FromSlash(rel), DatasetFile)
		b, err := regfile.ReadFile(p, MaxManifest)
		if errors.Is(err, fs.ErrNotExist) {
			continue // (what it listed was removed already)
		}
		if err != nil {
			return nil, nil, err
		}
		v, err := ParseDataset(p, b)
		if err != nil {
			return nil, nil, err
		}
		for f := range v.OwnFiles() {
			if f != DatasetFile && !strings.HasPrefix(f, VersionsDir+"/") {
				files[f] = true
			}
		}
	}
	return files, dirs, nil
}
