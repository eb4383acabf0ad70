// The sources of a shuffle: each dataset's blobs checked against its
// manifest, the schemas of several sources compared, their rows named.

package shuffle

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
)

type modInfo struct {
	name       string
	rate       int64 // rows per clip frame; 0 for a per-clip modality
	perClip    bool  // one row per clip: a sample takes its clip's row
	frameShape []int
	dtype      array.DType
	rowBytes   int64    // bytes per blob row
	winBytes   int64    // bytes per sample: W*rate rows (one row if perClip)
	labels     []string // a label modality's vocabulary (nil: not a label)
}

// srcInfo is one source dataset (a plain run has one): its blobs, and
// where its clips and frames lie in the job's global numbering (the
// sources' clips one after the other, in order).
type srcInfo struct {
	name   string
	dir    string
	ds     *manifests.Dataset
	sha    string // of its dataset.json
	clip0  int64  // global number of its first clip
	frame0 int64  // global number of its first frame
	files  []srcFile
}

// srcFile is a source's blob of one modality (in the order of job.mods),
// or the part of one that a run reads: from byte dataOffset, rows rows.
type srcFile struct {
	path       string
	dataOffset int64
	rows       int64
}

// runInfo is a run of a source's clips whose rows lie one after the other
// in one blob of each modality: all of a dataset of format 1, and each
// stretch of a segmented version (format 2) that stays in the same blobs.
// The readers cut samples from runs; clip0 and frame0 are global numbers.
type runInfo struct {
	src                          int
	clip0, frame0, clips, frames int64
	files                        []srcFile // per modality: the run's rows
}

// Source is one --source NAME=DIR of a mixed run.
type Source struct{ Name, Dir string }

// sourceNames lists the sources' names, in order.
func (j *job) sourceNames() []string {
	var out []string
	for _, s := range j.srcs {
		out = append(out, s.name)
	}
	return out
}

// srcWords names source s for a message: "source wild (/data/wild)", or
// the dataset's folder in a plain run.
func (j *job) srcWords(s int) string {
	if !j.mixed {
		return j.srcs[s].dir
	}
	return fmt.Sprintf("source %s (%s)", j.srcs[s].name, j.srcs[s].dir)
}

// addSource loads the dataset in dir, checks its index and blobs, and
// appends its clips to the job's; the first source's modalities are the
// job's.
func (j *job) addSource(name, dir string) error {
	ds, err := manifests.LoadDataset(dir)
	if errors.Is(err, manifests.ErrWrongKind) {
		return fmt.Errorf("%w: %s", ErrUsage, strings.TrimPrefix(err.Error(), manifests.ErrWrongKind.Error()+": "))
	}
	if err != nil {
		return err
	}
	sha, err := manifests.HashFile(filepath.Join(dir, manifests.DatasetFile))
	if err != nil {
		return err
	}
	if n := j.o.Version; n > 0 && n != ds.Number() {
		// A kept version (convert --segments): its manifest, by its bytes.
		v, raw, err := manifests.LoadVersion(dir, n)
		if err == nil && n > ds.Number() {
			err = fmt.Errorf("version %d is above the current one: left by a convert --segments killed before its commit (the next convert removes it)", n)
		}
		if err != nil {
			kept, _ := manifests.KeptVersions(dir)
			return fmt.Errorf("%w: --version %d: %s keeps versions %v (current: %d): %w", ErrUsage, n, dir, kept, ds.Number(), err)
		}
		h := sha256.Sum256(raw)
		ds, sha = v, hex.EncodeToString(h[:])
	}
	starts, lengths, err := manifests.ReadIndex(filepath.Join(dir, ds.Files.Index))
	if err != nil {
		return err
	}
	if int64(len(starts)) != ds.Clips {
		return fmt.Errorf("%w: %s: index.npy has %d clips, dataset.json %d (run verify)", manifests.ErrManifest, dir, len(starts), ds.Clips)
	}
	var next int64
	for i := range starts {
		if starts[i] != next || lengths[i] < 0 {
			return fmt.Errorf("%w: %s: index.npy row %d: start %d length %d, want start %d (contiguous from 0; run verify)",
				manifests.ErrManifest, dir, i, starts[i], lengths[i], next)
		}
		next += lengths[i]
	}
	if next != ds.Frames {
		return fmt.Errorf("%w: %s: index.npy's lengths add up to %d frames, dataset.json says %d (run verify)", manifests.ErrManifest, dir, next, ds.Frames)
	}
	src := srcInfo{name: name, dir: dir, ds: ds, sha: sha, clip0: int64(len(j.lengths))}
	if len(j.srcs) > 0 {
		last := &j.srcs[len(j.srcs)-1]
		src.frame0 = last.frame0 + last.ds.Frames
	}
	var mods []modInfo
	for _, m := range ds.Modalities {
		if strings.EqualFold(m.Name, "samples") {
			return fmt.Errorf("%w: %s: modality %q collides with the shards' samples files; convert again with another name", manifests.ErrManifest, dir, m.Name)
		}
		dt, _, err := array.ParseDescr(m.DType)
		if err != nil {
			return err
		}
		rb, err := array.ByteSize(m.FrameShape, dt.Size)
		if err != nil {
			return err
		}
		mi := modInfo{name: m.Name, rate: int64(m.Rate), perClip: m.PerClip, frameShape: m.FrameShape, dtype: dt,
			rowBytes: rb, winBytes: int64(j.o.Sampling.Window) * int64(m.Rate) * rb, labels: m.Labels}
		if m.PerClip {
			mi.rate, mi.winBytes = 0, rb
		}
		if ds.Segmented() {
			for _, b := range m.BlobList() {
				p, err := manifests.Confined(dir, b.File)
				if err != nil {
					return err
				}
				if err := checkSegmentBlob(mi, srcFile{path: p, dataOffset: b.DataOffset, rows: b.Rows}); err != nil {
					return err
				}
			}
		} else {
			p, err := manifests.Confined(dir, m.File)
			if err != nil {
				return err
			}
			f := srcFile{path: p, dataOffset: m.DataOffset, rows: m.Rows}
			if err := checkBlob(ds, starts, lengths, mi, f); err != nil {
				return err
			}
			src.files = append(src.files, f)
		}
		mods = append(mods, mi)
	}
	if len(j.srcs) == 0 {
		j.mods = mods
	} else if err := j.compareMods(name, dir, mods); err != nil {
		return err
	}
	wh, err := manifests.LoadWhere(dir, ds, starts, lengths)
	if err != nil {
		return err
	}
	if err := checkLabels(dir, ds, wh, starts, lengths); err != nil {
		return err
	}
	if ds.Segmented() {
		j.addRuns(len(j.srcs), &src, ds, wh, mods, starts, lengths)
	} else {
		j.runs = append(j.runs, runInfo{src: len(j.srcs), clip0: src.clip0, frame0: src.frame0, clips: ds.Clips, frames: ds.Frames, files: src.files})
	}
	for i := range starts {
		j.starts = append(j.starts, src.frame0+starts[i])
	}
	j.lengths = append(j.lengths, lengths...)
	j.srcs = append(j.srcs, src)
	return nil
}

// addRuns splits a segmented version's clips into runs: a run goes on
// while each modality's rows of the next clip follow the last one's in
// the same blob.
func (j *job) addRuns(s int, src *srcInfo, ds *manifests.Dataset, wh *manifests.Where, mods []modInfo, starts, lengths []int64) {
	var cur *runInfo
	blob := make([]int, len(mods))
	next := make([]int64, len(mods))
	for i := range starts {
		cont := cur != nil
		for k := range mods {
			b, first, n := ds.Locate(wh, k, i, starts[i], lengths[i])
			if n > 0 && (b != blob[k] || first != next[k]) {
				cont = false
			}
		}
		if !cont {
			j.runs = append(j.runs, runInfo{src: s, clip0: src.clip0 + int64(i), frame0: src.frame0 + starts[i], files: make([]srcFile, len(mods))})
			cur = &j.runs[len(j.runs)-1]
			for k := range mods {
				b, first, _ := ds.Locate(wh, k, i, starts[i], lengths[i])
				bl := ds.Modalities[k].BlobList()[b]
				blob[k], next[k] = b, first
				cur.files[k] = srcFile{path: filepath.Join(src.dir, bl.File), dataOffset: bl.DataOffset + first*mods[k].rowBytes}
			}
		}
		for k := range mods {
			_, _, n := ds.Locate(wh, k, i, starts[i], lengths[i])
			next[k] += n
			cur.files[k].rows += n
		}
		cur.clips++
		cur.frames += lengths[i]
	}
}

// checkSegmentBlob checks one blob of a segmented version against its
// entry in dataset.json: header, data offset and size (where.npy's clips
// were checked to lie within its rows).
func checkSegmentBlob(m modInfo, sf srcFile) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s (run verify)", manifests.ErrManifest, sf.path, fmt.Sprintf(format, args...))
	}
	if m.rowBytes <= 0 {
		return bad("modality %q: frame shape %v holds no values", m.name, m.frameShape)
	}
	f, fi, err := regfile.Open(sf.path)
	if err != nil {
		return err
	}
	h, err := npy.ReadHeader(f, fi.Size())
	f.Close()
	if err != nil {
		return bad("%v", err)
	}
	wantShape := append([]int{int(sf.rows)}, m.frameShape...)
	switch need := sf.dataOffset + sf.rows*m.rowBytes; {
	case h.Descr != m.dtype.Descr() || h.Fortran || !slices.Equal(h.Shape, wantShape):
		return bad("the header says %s %s, dataset.json %s %s", h.Descr, array.FormatShape(h.Shape), m.dtype.Descr(), array.FormatShape(wantShape))
	case h.DataOffset != sf.dataOffset:
		return bad("data at byte %d, dataset.json says %d", h.DataOffset, sf.dataOffset)
	case fi.Size() != need:
		return bad("%d bytes, dataset.json says %d", fi.Size(), need)
	}
	return nil
}

// runOf returns the run of global clip c.
func (j *job) runOf(c int64) int {
	if len(j.runs) == 1 {
		return 0
	}
	return sort.Search(len(j.runs), func(r int) bool { return j.runs[r].clip0 > c }) - 1
}

// compareMods refuses a source whose modality schema differs from the
// first source's, naming the difference.
func (j *job) compareMods(name, dir string, mods []modInfo) error {
	first := j.srcs[0].name
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: source %s (%s): %s (the sources must share their modalities: names, per-clip, rates, frame shapes, dtypes)", ErrUsage, name, dir, fmt.Sprintf(format, args...))
	}
	names := func(ms []modInfo) string {
		var n []string
		for _, m := range ms {
			n = append(n, m.name)
		}
		return strings.Join(n, ",")
	}
	if names(mods) != names(j.mods) {
		return bad("has modalities %s, source %s has %s", names(mods), first, names(j.mods))
	}
	clipWord := func(b bool) string {
		if b {
			return "per-clip"
		}
		return "per-frame"
	}
	for k, m := range mods {
		f := j.mods[k]
		switch {
		case m.perClip != f.perClip:
			return bad("modality %s is %s, source %s's %s", m.name, clipWord(m.perClip), first, clipWord(f.perClip))
		case m.rate != f.rate:
			return bad("modality %s has rate %d, source %s's %d", m.name, m.rate, first, f.rate)
		case !slices.Equal(m.frameShape, f.frameShape):
			return bad("modality %s has frame shape %s, source %s's %s", m.name, array.FormatShape(m.frameShape), first, array.FormatShape(f.frameShape))
		case m.dtype.Descr() != f.dtype.Descr():
			return bad("modality %s has dtype %s, source %s's %s", m.name, m.dtype.Descr(), first, f.dtype.Descr())
		case (m.labels == nil) != (f.labels == nil) || !labelsAgree(m.labels, f.labels):
			return fmt.Errorf("%w: source %s (%s): label %s has %s, source %s's %s: a code must mean one label in every source (convert %s with --labels-like %s: its vocabulary first, then its own labels)",
				ErrUsage, name, dir, m.name, ui.LabelList(m.labels, 5), first, ui.LabelList(f.labels, 5), dir, j.srcs[0].dir)
		case len(m.labels) > len(f.labels):
			j.mods[k].labels = m.labels // (the epochs' vocabulary: the longest)
		}
	}
	return nil
}

// checkLabels refuses a dataset whose label codes fall outside their
// vocabulary (the epochs would carry them to every reader): 4 bytes a
// clip read.
func checkLabels(dir string, ds *manifests.Dataset, wh *manifests.Where, starts, lengths []int64) error {
	for k, m := range ds.Modalities {
		if !m.IsLabel() {
			continue
		}
		_, err := ds.LabelCodes(wh, k, starts, lengths, func(file string) (io.ReaderAt, io.Closer, error) {
			p, err := manifests.Confined(dir, file)
			if err != nil {
				return nil, nil, err
			}
			f, _, err := regfile.Open(p)
			return f, f, err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

// labelsAgree reports whether two vocabularies give their shared codes
// the same labels: one is the other's beginning.
func labelsAgree(a, b []string) bool {
	n := min(len(a), len(b))
	return slices.Equal(a[:n], b[:n])
}

// checkBlob refuses a blob shorter than the manifest says (a damaged or
// replaced dataset), naming the first clip whose rows are missing: both
// paths read every row, and learning it half-way would waste the run.
//
// It also refuses a blob that disagrees with dataset.json and index.npy in
// any number the shuffle relies on (rows, header, size): every window is
// cut from the rows those numbers locate.
func checkBlob(ds *manifests.Dataset, starts, lengths []int64, m modInfo, sf srcFile) error {
	path, rows := sf.path, sf.rows
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s (run verify)", manifests.ErrManifest, path, fmt.Sprintf(format, args...))
	}
	if m.rowBytes <= 0 {
		return bad("modality %q: frame shape %v holds no values", m.name, m.frameShape)
	}
	if want := ds.Frames * m.rate; !m.perClip && rows != want {
		return bad("dataset.json says %d rows, but %d frames at rate %d make %d", rows, ds.Frames, m.rate, want)
	}
	if m.perClip && rows != ds.Clips {
		return bad("dataset.json says %d rows for per-clip modality %q, but there are %d clips", rows, m.name, ds.Clips)
	}
	f, fi, err := regfile.Open(path)
	if err != nil {
		return err
	}
	h, herr := npy.ReadHeader(f, fi.Size())
	f.Close()
	need := sf.dataOffset + rows*m.rowBytes
	if herr != nil && fi.Size() >= need {
		return bad("%v", herr)
	}
	if herr == nil {
		wantShape := append([]int{int(rows)}, m.frameShape...)
		switch {
		case h.Descr != m.dtype.Descr() || h.Fortran || !slices.Equal(h.Shape, wantShape):
			return bad("the header says %s %s, dataset.json %s %s", h.Descr, array.FormatShape(h.Shape), m.dtype.Descr(), array.FormatShape(wantShape))
		case h.DataOffset != sf.dataOffset:
			return bad("data at byte %d, dataset.json says %d", h.DataOffset, sf.dataOffset)
		case fi.Size() > need:
			return bad("%d bytes, dataset.json needs %d: %d bytes too many", fi.Size(), need, fi.Size()-need)
		}
	}
	if fi.Size() >= need {
		return nil
	}
	if len(starts) == 0 {
		return bad("%d bytes, dataset.json needs %d", fi.Size(), need)
	}
	have := max(0, (fi.Size()-sf.dataOffset)/m.rowBytes) // whole rows present
	c := sort.Search(len(starts), func(c int) bool { return (starts[c]+lengths[c])*m.rate > have })
	if m.perClip {
		c = int(have)
	}
	c = min(c, len(starts)-1)
	first := starts[max(c, 0)] * m.rate
	if m.perClip {
		first = int64(c)
	}
	return fmt.Errorf("%w: %s: %d bytes, dataset.json needs %d: the rows of clip %d on (from byte %d) are missing (run verify)",
		manifests.ErrManifest, path, fi.Size(), need, c, sf.dataOffset+first*m.rowBytes)
}

// srcOf returns the source of global clip c.
func (j *job) srcOf(c int64) int {
	if len(j.srcs) == 1 {
		return 0
	}
	return sort.Search(len(j.srcs), func(s int) bool { return j.srcs[s].clip0 > c }) - 1
}

// sampleRows returns the run of sample smp and the rows of that run's
// rows of modality k that it takes: its window's valid rows, or, for a
// per-clip modality, its clip's row.
func (j *job) sampleRows(k int, smp manifests.Sample) (run int, first, n int64) {
	run = j.runOf(smp.Clip)
	r := &j.runs[run]
	m := &j.mods[k]
	if m.perClip {
		return run, smp.Clip - r.clip0, 1
	}
	return run, (j.starts[smp.Clip] - r.frame0 + smp.Start) * m.rate, smp.Valid * m.rate
}

// readErr words a failed read of a blob from byte off on, where clip
// (if >= 0) is the first clip read (a blob that shrank since the run
// started, or a failing disk).
func readErr(path string, off int64, clip int, err error) error {
	if errors.Is(err, io.EOF) {
		err = errors.New("the file ends early (changed during the run? run verify)")
	}
	if clip >= 0 {
		return fmt.Errorf("%s: reading from byte %d (clip %d on): %w", path, off, clip, err)
	}
	return fmt.Errorf("%s: reading from byte %d: %w", path, off, err)
}
