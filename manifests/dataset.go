// Package manifests reads, writes and checks the manifests of a clipshard
// dataset directory (docs/FORMAT.md): dataset.json (the commit point),
// clips.parquet (one row per clip), index.npy (start and length per clip)
// and SHA256SUMS.
//
// Every path a manifest holds is relative to the manifest's directory and
// never escapes it; loaders refuse anything else before opening a file.
package manifests

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/regfile"
)

// Errors returned by this package; test with errors.Is.
var (
	// ErrManifest marks a manifest that cannot be read or is not one.
	ErrManifest = errors.New("manifests: bad manifest")
	// ErrPath marks a manifest path that is absolute or escapes its
	// directory.
	ErrPath = errors.New("manifests: path escapes the dataset directory")
	// ErrWrongKind marks a dataset given where an epochs folder is
	// wanted, or back, or a folder that is neither where a dataset is
	// wanted (no dataset.json: a folder of sources) (errors.Is it also
	// matches ErrManifest).
	ErrWrongKind = fmt.Errorf("%w: the other kind of folder", ErrManifest)
)

// Names of the files in a dataset directory.
const (
	DatasetFile = "dataset.json"
	ClipsFile   = "clips.parquet"
	IndexFile   = "index.npy"
	SumsFile    = "SHA256SUMS"
	SkippedFile = "skipped.tsv"
	IDsFile     = "clips.txt" // the clip ids, one a line, in row order
)

// DatasetFormat is the value of dataset.json's "format" key.
const DatasetFormat = "clipshard.dataset"

// Dataset is dataset.json.
type Dataset struct {
	Format     string           `json:"format"`
	Version    int              `json:"version"`
	Clips      int64            `json:"clips"`
	Frames     int64            `json:"frames"`
	Align      string           `json:"align"`
	Modalities []Modality       `json:"modalities"`
	Stats      map[string]Stats `json:"stats"`
	Created    string           `json:"created"`
	Tool       string           `json:"tool"`
	Files      Files            `json:"files"`
	// Fingerprint identifies the inputs (clip list, templates, flags): a
	// re-run with the same fingerprint and unchanged sources is a no-op.
	Fingerprint string `json:"fingerprint"`
	// Trimmed is the total of clip frames dropped by --align trim.
	Trimmed int64 `json:"trimmed"`
	// Skipped lists clips left out by --on-error skip.
	Skipped []Skipped `json:"skipped"`
	// Part is set on the dataset of one part of a partitioned convert
	// (convert --part); a merged or single-process dataset has none.
	Part *Part `json:"part,omitempty"`
	// DatasetVersion is the version's number (format 2; format 1 is
	// version 1), Previous the version it was made from.
	DatasetVersion int       `json:"dataset_version,omitempty"`
	Previous       *Previous `json:"previous,omitempty"`
}

// Part describes one part of a partitioned convert: clips
// [FirstClip, FirstClip+Clips-before-skips) of a clip list of TotalClips,
// part Index of Count.
type Part struct {
	Index      int    `json:"index"`
	Count      int    `json:"count"`
	FirstClip  int    `json:"first_clip"`
	ListClips  int    `json:"list_clips"` // clips of the list in this part (converted or skipped)
	TotalClips int    `json:"total_clips"`
	Job        string `json:"job_fingerprint"` // fingerprint of the whole job, as one process would record it
}

// Files names the dataset's other manifests.
type Files struct {
	Clips   string `json:"clips"`
	Index   string `json:"index"`
	Sums    string `json:"sha256sums"`
	Skipped string `json:"skipped,omitempty"`
	// IDs lists the clip ids, one a line in row order, for readers
	// without Parquet (numpy alone); datasets of earlier versions lack it.
	IDs string `json:"ids,omitempty"`
	// Where (format 2) locates every clip's rows in the blobs.
	Where string `json:"where,omitempty"`
}

// Modality describes one blob.
type Modality struct {
	Name        string `json:"name"`
	File        string `json:"file,omitempty"` // format 1: the one blob (format 2: Blobs)
	DType       string `json:"dtype"`
	SourceDType string `json:"source_dtype"`
	FrameShape  []int  `json:"frame_shape"`
	Rate        int    `json:"rate"`
	Rows        int64  `json:"rows"`
	DataOffset  int64  `json:"data_offset,omitempty"`
	Size        int64  `json:"size,omitempty"`
	SHA256      string `json:"sha256,omitempty"`
	Template    string `json:"template"`
	Keys        string `json:"keys"`
	// Blobs (format 2) are the modality's blobs: where.npy says which
	// holds each clip's rows.
	Blobs []Blob `json:"blobs,omitempty"`
	// PerClip marks a per-clip modality (convert's NAME@clip=...): the
	// blob holds one row per clip, row i being clip i's value (FrameShape
	// is the value's shape, [] for a scalar), and Rate is 0.
	PerClip bool `json:"per_clip,omitempty"`
	// Labels marks a label modality (convert --label): a per-clip int32
	// code of a string per clip, Labels being the vocabulary (code i
	// stands for Labels[i]; FORMAT.md says in which order). The strings
	// come from the clip list's column LabelColumn, or (LabelColumn
	// empty) from key Keys of each clip's pickle at Template.
	LabelColumn string   `json:"label_column,omitempty"`
	Labels      []string `json:"labels,omitempty"`
}

// IsLabel reports whether m is a label modality.
func (m *Modality) IsLabel() bool { return m.LabelColumn != "" || m.Labels != nil }

// LabelFromFile reports whether m is a label modality read from the
// clips' pickles (its sources are files, stamped as any other's).
func (m *Modality) LabelFromFile() bool { return m.IsLabel() && m.LabelColumn == "" }

// LabelDType is a label modality's dtype: int32 codes.
const LabelDType = "<i4"

// CheckLabels checks a label modality's description: one int32 code per
// clip (per clip, frame shape []), a vocabulary of distinct values, and no
// labels on another modality.
func (m *Modality) CheckLabels() error {
	if !m.IsLabel() {
		return nil
	}
	if m.LabelColumn == "" && (m.Template == "" || m.Keys == "") {
		return fmt.Errorf("label modality %q: neither a label_column nor a template and keys: where do its labels come from?", m.Name)
	}
	if !m.PerClip || m.DType != LabelDType || len(m.FrameShape) != 0 || len(m.Labels) == 0 {
		return fmt.Errorf("label modality %q: want per_clip, dtype %s, frame_shape [] and a vocabulary (labels), have per_clip %v, %s, %v and %d labels",
			m.Name, LabelDType, m.PerClip, m.DType, m.FrameShape, len(m.Labels))
	}
	seen := make(map[string]bool, len(m.Labels))
	for _, l := range m.Labels {
		if seen[l] {
			return fmt.Errorf("label modality %q: the label %q is in its vocabulary twice", m.Name, l)
		}
		seen[l] = true
	}
	return nil
}

// ClipRows returns the rows of the blob that clip i occupies, given its
// start and length in clip frames (index.npy): first row and count.
func (m *Modality) ClipRows(i int, start, length int64) (first, n int64) {
	if m.PerClip {
		return int64(i), 1
	}
	return start * int64(m.Rate), length * int64(m.Rate)
}

// Stats is the conversion audit of a modality.
type Stats struct {
	NaN       int64   `json:"nan"`
	InfIn     int64   `json:"inf_in"`
	Overflow  int64   `json:"overflow"`
	Underflow int64   `json:"underflow"`
	MaxAbs    float64 `json:"max_abs"`
}

// Skipped is a clip left out, and why, with the state of its sources then
// (so that a re-run can tell whether anything changed).
type Skipped struct {
	Clip    string        `json:"clip"`
	Reason  string        `json:"reason"`
	Sources []SourceStamp `json:"sources,omitempty"`
}

// SourceStamp is a source file's path, size, mtime, ctime and inode
// (size -1: missing). A rewrite keeps size and mtime when it is made to
// (touch -r, cp -p, rsync -t) or falls within the mtime's granularity; it
// changes the ctime (which no system call sets back) or, written to
// another file and renamed into place, the inode.
type SourceStamp struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns,omitempty"`
	Ino     uint64 `json:"inode,omitempty"`
}

// Stamp stats path now.
func Stamp(path string) SourceStamp {
	st, err := os.Stat(path)
	if err != nil {
		return SourceStamp{Path: path, Size: -1}
	}
	return StampOf(path, st)
}

// StampOf is the stamp of path from its FileInfo (os.Stat's, or the
// formats package's fstat).
func StampOf(path string, fi fs.FileInfo) SourceStamp {
	s := SourceStamp{Path: path, Size: fi.Size(), MtimeNS: fi.ModTime().UnixNano()}
	switch st := fi.Sys().(type) {
	case *syscall.Stat_t:
		s.CtimeNS, s.Ino = st.Ctim.Nano(), st.Ino
	case *unix.Stat_t:
		s.CtimeNS, s.Ino = st.Ctim.Nano(), st.Ino
	}
	return s
}

// RacyWindow is how long before a read a source must have last changed
// for its stamp to vouch for what was read: a file changed just before
// can change again without a new ctime, since timestamps advance by the
// kernel's tick (up to 10 ms; RacyWindow), or by whole seconds on
// filesystems that keep no finer time (CoarseWindow, for a ctime of a
// whole second).
const (
	RacyWindow   = int64(20 * time.Millisecond)
	CoarseWindow = int64(2 * time.Second)
)

// SettledAt returns s, without its ctime (so that it vouches for nothing,
// see Racy) when the source changed within the racy window before readNS,
// the time its read began.
func (s SourceStamp) SettledAt(readNS int64) SourceStamp {
	w := RacyWindow
	if s.CtimeNS%int64(time.Second) == 0 {
		w = CoarseWindow
	}
	if s.CtimeNS >= readNS-w {
		s.CtimeNS = 0
	}
	return s
}

// Differs words how the stamp now differs from the recorded s ("" if it
// does not): size, mtime, and the ctime and inode where s has them (a
// stamp recorded without them, or without a settled ctime, is compared on
// what it has).
func (s SourceStamp) Differs(now SourceStamp) string {
	var d []string
	if now.Size != s.Size {
		d = append(d, fmt.Sprintf("size %d -> %d", s.Size, now.Size))
	}
	if now.MtimeNS != s.MtimeNS {
		d = append(d, fmt.Sprintf("modified %s -> %s", stampTime(s.MtimeNS), stampTime(now.MtimeNS)))
	}
	if s.CtimeNS != 0 && now.CtimeNS != s.CtimeNS {
		d = append(d, fmt.Sprintf("status changed %s -> %s", stampTime(s.CtimeNS), stampTime(now.CtimeNS)))
	}
	if s.Ino != 0 && now.Ino != s.Ino {
		d = append(d, fmt.Sprintf("inode %d -> %d (replaced)", s.Ino, now.Ino))
	}
	return strings.Join(d, ", ")
}

// stampTime words a time in ns for a person: RFC 3339, UTC.
func stampTime(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// Racy reports whether s cannot vouch for the content it was recorded
// with: it has no ctime (recorded by an earlier version, or SettledAt
// found it changed just before it was read).
func (s SourceStamp) Racy() bool { return s.CtimeNS == 0 }

// CheckRelPath returns an error wrapping ErrPath unless p is a relative,
// clean, slash-separated path that stays inside its directory.
func CheckRelPath(p string) error {
	switch {
	case p == "" || p == ".":
		return fmt.Errorf("%w: empty path", ErrPath)
	case strings.HasPrefix(p, "/") || filepath.IsAbs(p) || strings.Contains(p, "\\") || strings.ContainsRune(p, 0):
		return fmt.Errorf("%w: %q is absolute", ErrPath, p)
	case path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("%w: %q", ErrPath, p)
	}
	return nil
}

// MaxManifest bounds the size of a manifest that LoadDataset, the epochs
// loader and the id list's readers will read: 256 MiB, as the Python
// readers bound theirs (a larger one is refused before it is parsed,
// which takes several times its size in memory).
const MaxManifest = 256 << 20

// LoadDataset reads and checks DIR/dataset.json: format, version, and that
// every path in it is relative and inside DIR. It opens nothing else.
func LoadDataset(dir string) (*Dataset, error) {
	p := filepath.Join(dir, DatasetFile)
	b, err := regfile.ReadFile(p, MaxManifest)
	if err != nil {
		if _, serr := os.Lstat(filepath.Join(dir, EpochsFile)); errors.Is(err, fs.ErrNotExist) && serr == nil {
			return nil, fmt.Errorf("%w: %s is an epochs folder (it holds %s), not a dataset (no %s): give the folder convert wrote (the one these epochs were cut from is in %s's dataset.dir, or sources[].dir)",
				ErrWrongKind, dir, EpochsFile, DatasetFile, EpochsFile)
		}
		if _, serr := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) && serr == nil {
			return nil, fmt.Errorf("%w: %s holds no %s: not a clipshard dataset (a folder of sources? convert it first: clipshard convert --clips LIST --root %s --out DS -m NAME=TEMPLATE ..., then give DS)",
				ErrWrongKind, dir, DatasetFile, dir)
		}
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	return ParseDataset(p, b)
}

// check checks a parsed dataset.json (read from p): format, version, and
// that every path in it is relative and inside its folder.
func (d *Dataset) check(p string) error {
	switch {
	case d.Format != DatasetFormat || (d.Version != 1 && d.Version != 2):
		return fmt.Errorf("%w: %s: format %q version %d, want %q version 1 or 2", ErrManifest, p, d.Format, d.Version, DatasetFormat)
	case d.Version == 1 && (d.DatasetVersion > 1 || d.Files.Where != ""):
		return fmt.Errorf("%w: %s: format 1 with a dataset_version or where.npy (format 2's)", ErrManifest, p)
	case d.Version == 2 && (d.DatasetVersion < 1 || d.Files.Where == ""):
		return fmt.Errorf("%w: %s: format 2 needs a dataset_version and files.where", ErrManifest, p)
	}
	paths := []string{d.Files.Clips, d.Files.Index, d.Files.Sums}
	if d.Files.Skipped != "" {
		paths = append(paths, d.Files.Skipped)
	}
	if d.Files.IDs != "" {
		paths = append(paths, d.Files.IDs)
	}
	if d.Files.Where != "" {
		paths = append(paths, d.Files.Where)
	}
	seen := map[string]bool{}
	for _, m := range d.Modalities {
		if m.Name == "" || seen[m.Name] {
			return fmt.Errorf("%w: %s: modality name %q empty or repeated", ErrManifest, p, m.Name)
		}
		seen[m.Name] = true
		if err := m.CheckLabels(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrManifest, p, err)
		}
		if (d.Version == 2) != (m.Blobs != nil) || (d.Version == 2 && (len(m.Blobs) == 0 || m.File != "")) {
			return fmt.Errorf("%w: %s: modality %q: format %d wants %s", ErrManifest, p, m.Name, d.Version,
				map[bool]string{true: "a list of blobs and no file", false: "a file and no list of blobs"}[d.Version == 2])
		}
		for _, b := range m.BlobList() {
			paths = append(paths, b.File)
		}
	}
	for _, f := range paths {
		if err := CheckRelPath(f); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// Write writes d to DIR/dataset.json atomically.
func (d *Dataset) Write(dir string) error {
	b, err := MarshalJSON(d)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, DatasetFile), b)
}

// MarshalJSON encodes a manifest as indented JSON with a final newline,
// without escaping <, > and & (dtypes read "<f2").
func MarshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Modality returns the modality called name, or nil.
func (d *Dataset) Modality(name string) *Modality {
	for i := range d.Modalities {
		if d.Modalities[i].Name == name {
			return &d.Modalities[i]
		}
	}
	return nil
}

// LabelCodes returns each clip's code of label modality k of d (wh: its
// where.npy, nil for format 1; starts and lengths: index.npy), reading
// each blob's rows whole, once, from what open gives for the blob's file
// (as the manifest names it). A code outside the vocabulary is an error
// naming the clip row and the blob.
func (d *Dataset) LabelCodes(wh *Where, k int, starts, lengths []int64, open func(file string) (io.ReaderAt, io.Closer, error)) ([]int32, error) {
	m := &d.Modalities[k]
	if !m.IsLabel() {
		return nil, fmt.Errorf("%w: modality %q is not a label", ErrManifest, m.Name)
	}
	blobs := map[int][]byte{}
	out := make([]int32, len(starts))
	for i := range starts {
		b, first, _ := d.Locate(wh, k, i, starts[i], lengths[i])
		bl := m.BlobList()[b]
		rows, ok := blobs[b]
		if !ok {
			if bl.Rows < 0 || bl.Rows > 1<<28 {
				return nil, fmt.Errorf("%w: %s: %d rows: not a label blob convert writes", ErrManifest, bl.File, bl.Rows)
			}
			r, c, err := open(bl.File)
			if err != nil {
				return nil, err
			}
			rows = make([]byte, 4*bl.Rows)
			n, err := r.ReadAt(rows, bl.DataOffset)
			c.Close()
			if n < len(rows) { // (a ReaderAt may say io.EOF beside a whole read)
				return nil, fmt.Errorf("%s: %d of its %d rows: %w", bl.File, n/4, bl.Rows, err)
			}
			blobs[b] = rows
		}
		if first < 0 || 4*first+4 > int64(len(rows)) {
			return nil, fmt.Errorf("%w: %s: clip row %d: row %d is past the blob's %d rows", ErrManifest, bl.File, i, first, len(rows)/4)
		}
		c := int32(binary.LittleEndian.Uint32(rows[4*first:]))
		if c < 0 || int(c) >= len(m.Labels) {
			return nil, fmt.Errorf("%w: %s: clip row %d: label %q code %d is outside its vocabulary of %d labels (dataset.json; run clipshard verify)", ErrManifest, bl.File, i, m.Name, c, len(m.Labels))
		}
		out[i] = c
	}
	return out, nil
}
