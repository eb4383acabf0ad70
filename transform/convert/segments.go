// Segments (convert --segments, #61): over a dataset it can reuse, a run
// writes only the rows it decodes, into one new segment, and commits a new
// version in place whose where.npy points every other clip at the rows it
// already has. Nothing of an earlier version is rewritten, moved or
// removed: a reader of version N keeps reading it while N+1 is written and
// after. See docs/FORMAT.md, "Segments and versions".

package convert

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// rowRef locates a modality's rows of a clip in a blob of the dataset
// being grown: the blob's file (relative to --out) and its first row.
type rowRef struct {
	file  string
	first int64
}

// refMod fills mo with a reference to modality k's rows of the plan's
// clip in the previous dataset: nothing is read or written. It reports
// false when the rows there are not rows rows (the clip's length changed).
func (j *job) refMod(plan *reusePlan, k int, rows int64, mo *modOut) bool {
	p := j.prev
	om := &p.ds.Modalities[p.mods[k]]
	s := plan.row.Sources[p.mods[k]]
	b, first, n := p.ds.Locate(p.where, p.mods[k], plan.index, plan.row.Start, plan.row.Length)
	if n != rows {
		return false
	}
	dt, _, _ := array.ParseDescr(om.DType)
	mo.rows, mo.dtype, mo.frameShape = rows, dt, append([]int{}, om.FrameShape...)
	mo.sourceDescr, mo.stats, mo.xxh = s.Descr, f16.Stats(s.Stats), s.XXH64
	mo.src = s
	mo.ref = &rowRef{file: om.BlobList()[b].File, first: first}
	return true
}

// segLoc is where a clip's rows of one modality are in the version being
// written: in the previous dataset's blob file, or (file "") in the new
// segment's blob, from row first.
type segLoc struct {
	file  string
	first int64
}

var leftoverFile = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// finalizeSegments finishes the new segment's blobs and writes the new
// version's manifests into the staging directory: its blobs as
// <modality>.npy, its manifests under version/.
func (j *job) finalizeSegments(w *writer) (*manifests.Dataset, []byte, string, error) {
	o := j.opts
	if len(w.rows) == 0 {
		return nil, nil, "", j.allSkipped(w)
	}
	p := j.prev
	num := p.ds.Number() + 1
	vdir := manifests.VersionDir(num)
	prevSum := sha256.Sum256(p.raw)
	d := &manifests.Dataset{
		Format: manifests.DatasetFormat, Version: 2, DatasetVersion: num,
		Previous: &manifests.Previous{Version: p.ds.Number(), SHA256: hex.EncodeToString(prevSum[:])},
		Clips:    int64(len(w.rows)), Frames: w.frames, Align: o.Align, Stats: map[string]manifests.Stats{},
		Created: o.Now().UTC().Format(time.RFC3339), Tool: o.Tool, Fingerprint: j.fingerprint, Trimmed: w.trimmed, Skipped: w.skipped,
	}
	// The new blobs, finished (and hashed) at once.
	sums := make([]string, len(o.Modalities))
	errs := make([]error, len(o.Modalities))
	var wg sync.WaitGroup
	for k := range o.Modalities {
		st := w.mods[k]
		if st.w == nil {
			continue
		}
		if st.w.Rows() != st.rows-st.refRows {
			return nil, nil, "", fmt.Errorf("convert: %s: %d rows written, the clips need %d", j.blobPath(k), st.w.Rows(), st.rows-st.refRows)
		}
		bw := st.w
		st.w = nil
		wg.Go(func() { sums[k], errs[k] = bw.Finish() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, "", err
	}
	fresh := map[string]string{}
	for k, m := range o.Modalities {
		if sums[k] != "" {
			fresh[m.Name+".npy"] = sums[k]
		}
	}
	seg := ""
	if len(fresh) > 0 {
		seg = manifests.SegmentID(fresh)
	}
	where := manifests.NewWhere(len(w.rows), len(o.Modalities))
	names := make([]string, len(o.Modalities))
	fileSums := map[string]string{}
	for k, m := range o.Modalities {
		st := w.mods[k]
		names[k] = m.Name
		rate := m.Rate
		if m.PerClip {
			rate = 0
		}
		fb, _ := array.ByteSize(st.frameShape, st.dtype.Size)
		mod := manifests.Modality{Name: m.Name, DType: st.dtype.Descr(), SourceDType: strings.Join(st.descrs, ","),
			FrameShape: append([]int{}, st.frameShape...), Rate: rate, Rows: st.rows, Template: m.Template, Keys: m.Keys, PerClip: m.PerClip, LabelColumn: m.Label, Labels: j.labelsOf(k), Blobs: []manifests.Blob{}}
		// The previous version's blobs that some clip still reads, in
		// their order, then the new one.
		index := map[string]int{}
		var old []manifests.Blob
		if pk := p.mods[k]; pk >= 0 {
			old = p.ds.Modalities[pk].BlobList()
		}
		used := map[string]bool{}
		for i := range w.rows {
			used[w.where[i][k].file] = true
		}
		for _, b := range old {
			if used[b.File] {
				index[b.File] = len(mod.Blobs)
				mod.Blobs = append(mod.Blobs, b)
			}
		}
		if sums[k] != "" {
			f := path.Join(manifests.SegmentsDir, seg, m.Name+".npy")
			index[""] = len(mod.Blobs)
			rows := st.rows - st.refRows
			mod.Blobs = append(mod.Blobs, manifests.Blob{File: f, Rows: rows, DataOffset: npy.DataAlign, Size: npy.DataAlign + rows*fb, SHA256: sums[k]})
		}
		for _, b := range mod.Blobs {
			fileSums[b.File] = b.SHA256
		}
		for i := range w.rows {
			l := w.where[i][k]
			where.Set(i, k, index[l.file], l.first)
		}
		d.Modalities = append(d.Modalities, mod)
		d.Stats[m.Name] = manifests.Stats(st.stats)
	}
	// The version's manifests, in staging/version; paths in them are
	// relative to --out.
	sdir := filepath.Join(j.staging, "version")
	if err := os.Mkdir(sdir, 0o755); err != nil {
		return nil, nil, "", err
	}
	if err := writeSmallManifests(sdir, d, w.rows, names); err != nil {
		return nil, nil, "", err
	}
	if err := manifests.WriteWhere(filepath.Join(sdir, manifests.WhereFile), where); err != nil {
		return nil, nil, "", err
	}
	d.Files = manifests.Files{Clips: path.Join(vdir, manifests.ClipsFile), Index: path.Join(vdir, manifests.IndexFile), Sums: path.Join(vdir, manifests.SumsFile),
		IDs: path.Join(vdir, manifests.IDsFile), Where: path.Join(vdir, manifests.WhereFile)}
	small := []string{manifests.IndexFile, manifests.ClipsFile, manifests.IDsFile, manifests.WhereFile}
	if len(d.Skipped) > 0 {
		d.Files.Skipped = path.Join(vdir, manifests.SkippedFile)
		small = append(small, manifests.SkippedFile)
	}
	hs, err := hashAndSync(sdir, small, nil, o.Workers)
	if err != nil {
		return nil, nil, "", err
	}
	for n, h := range hs {
		fileSums[path.Join(vdir, n)] = h
	}
	js, err := manifests.MarshalJSON(d)
	if err != nil {
		return nil, nil, "", err
	}
	h := sha256.Sum256(js)
	fileSums[manifests.VersionFile(num)] = hex.EncodeToString(h[:])
	if err := manifests.WriteSums(filepath.Join(sdir, manifests.SumsFile), fileSums); err != nil {
		return nil, nil, "", err
	}
	if err := atomicfile.WriteFile(filepath.Join(sdir, manifests.DatasetFile), js); err != nil {
		return nil, nil, "", err
	}
	if err := atomicfile.Sync(sdir); err != nil {
		return nil, nil, "", err
	}
	return d, js, seg, atomicfile.Sync(j.staging)
}

// commitSegments publishes the version finalizeSegments staged: the new
// segment's folder, then the version's folder, then (for a dataset of
// format 1) its dataset.json kept as version 1, then dataset.json, the
// commit point. A kill before that last rename leaves the previous
// version current and whole; what the run had moved in is removed by the
// next run (see removeLeftovers).
func (j *job) commitSegments(d *manifests.Dataset, js []byte, seg string) error {
	out := j.opts.Out
	if err := removeLeftovers(out, j.prev.ds); err != nil {
		return err
	}
	own, err := manifests.DirFiles(out, j.prev.ds)
	if err != nil {
		return err
	}
	// Under the journal's lock, nothing else writes out: the version
	// current now must be the one this run grew.
	if cur, err := os.ReadFile(filepath.Join(out, manifests.DatasetFile)); err != nil || !bytes.Equal(cur, j.prev.raw) {
		return fmt.Errorf("%w: %s changed during the run (another program wrote it): nothing committed; run again", ErrInput, filepath.Join(out, manifests.DatasetFile))
	}
	if seg != "" {
		if err := j.moveSegment(seg, own); err != nil {
			return err
		}
	}
	faults.Point("convert.segment")
	vdir := filepath.Join(out, filepath.FromSlash(manifests.VersionDir(d.Number())))
	if err := os.MkdirAll(filepath.Dir(vdir), 0o755); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(j.staging, "version"), vdir); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if err := atomicfile.Sync(filepath.Dir(vdir)); err != nil {
		return err
	}
	faults.Point("convert.version")
	if !j.prev.ds.Segmented() {
		// Version 1 kept, by its very bytes: epochs cut from it name it
		// by their sha256.
		v1 := filepath.Join(out, filepath.FromSlash(manifests.VersionFile(1)))
		if err := os.MkdirAll(filepath.Dir(v1), 0o755); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(v1, j.prev.raw); err != nil {
			return err
		}
		faults.Point("convert.version1")
	}
	if err := atomicfile.WriteFile(filepath.Join(out, manifests.DatasetFile), js); err != nil {
		return err
	}
	return atomicfile.Sync(out)
}

// moveSegment moves the staged blobs into segments/SEG. A folder of that
// name that a kept version lists holds these very blobs (the name is
// their sha256s'): it is used as it is.
func (j *job) moveSegment(seg string, own map[string]bool) error {
	out := j.opts.Out
	rel := path.Join(manifests.SegmentsDir, seg)
	sdir := filepath.Join(out, filepath.FromSlash(rel))
	for f := range own {
		if strings.HasPrefix(f, rel+"/") {
			return nil // kept already, by a version that reads it
		}
	}
	if err := os.MkdirAll(filepath.Dir(sdir), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(sdir), atomicfile.TempPrefix+seg)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	for k, m := range j.opts.Modalities {
		if _, err := os.Lstat(j.blobPath(k)); err != nil {
			continue
		}
		if err := os.Rename(j.blobPath(k), filepath.Join(tmp, m.Name+".npy")); err != nil {
			return err
		}
	}
	if err := atomicfile.Sync(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, sdir); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	return atomicfile.Sync(filepath.Dir(sdir))
}

// removeLeftovers removes what a convert --segments killed before its
// commit left in out (see unlistedOrLeft); anything else that is not the
// dataset's is the user's, and is named, not removed.
func removeLeftovers(out string, d *manifests.Dataset) error {
	// A drop (convert --keep) killed before it finished: its files first,
	// in its order (a dropped version's dataset.json last).
	if _, dirs, err := manifests.DroppingFiles(out); err != nil {
		return err
	} else if len(dirs) > 0 {
		if err := removeDropped(out, d, &Dropped{}); err != nil {
			return err
		}
	}
	own, err := manifests.DirFiles(out, d)
	if err != nil {
		return err
	}
	listed := maps.Clone(own)
	extra, err := unlistedOrLeft(out, own)
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		return fmt.Errorf("%w: --out %w: refusing to write into it (move them elsewhere)", ErrUsage, manifests.NotOurs(out, extra))
	}
	left := map[string]bool{}
	for f := range own {
		if !listed[f] {
			left[f] = true
		}
	}
	return removeUnder(out, left)
}

// removeUnder removes the listed files and folders of dir, not dir itself.
func removeUnder(dir string, listed map[string]bool) error {
	var folders []string
	for f := range listed {
		if d, ok := strings.CutSuffix(f, "/"); ok {
			folders = append(folders, d)
			continue
		}
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(f))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	slices.SortFunc(folders, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, f := range folders {
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(f))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func hasUnder(own map[string]bool, rel string) bool {
	for f := range own {
		if strings.HasPrefix(f, rel+"/") {
			return true
		}
	}
	return false
}
