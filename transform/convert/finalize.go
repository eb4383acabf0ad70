// Finalize: the blobs finished, the manifests written (dataset.json
// last) in the staging directory, and the commit that publishes it.

package convert

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// hashRange returns the xxHash64 of n bytes of f at off.
func hashRange(f *os.File, off, n int64) (uint64, error) {
	d := xxhash.New()
	if _, err := io.Copy(d, io.NewSectionReader(f, off, n)); err != nil {
		return 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() < off+n {
		return 0, io.ErrUnexpectedEOF
	}
	return d.Sum64(), nil
}

// finalize finishes the blobs and writes the manifests into the staging
// directory, dataset.json last.
func (j *job) finalize(w *writer) (*manifests.Dataset, error) {
	o := j.opts
	if len(w.rows) == 0 {
		return nil, j.allSkipped(w)
	}
	report := func(phase string) {
		if o.Progress != nil {
			o.Progress(Progress{Clips: w.next, ClipsTotal: len(j.clips), BytesOut: w.bytesOut, Phase: phase})
		}
	}
	report("finish")
	d := &manifests.Dataset{
		Format:      manifests.DatasetFormat,
		Version:     1,
		Clips:       int64(len(w.rows)),
		Frames:      w.frames,
		Align:       o.Align,
		Stats:       map[string]manifests.Stats{},
		Created:     o.Now().UTC().Format(time.RFC3339),
		Tool:        o.Tool,
		Fingerprint: j.fingerprint,
		Trimmed:     w.trimmed,
		Skipped:     w.skipped,
		Files:       manifests.Files{Clips: manifests.ClipsFile, Index: manifests.IndexFile, Sums: manifests.SumsFile},
		Part:        j.part,
	}
	names := make([]string, len(o.Modalities))
	for k, m := range o.Modalities {
		st := w.mods[k]
		names[k] = m.Name
		if st.w == nil { // resumed with every clip already written
			var err error
			if st.w, err = blob.OpenMem(j.blobPath(k), st.dtype, st.frameShape, st.rows, j.blobMem); err != nil {
				return nil, err
			}
		}
		if st.w.Rows() != st.rows {
			return nil, fmt.Errorf("convert: %s: %d rows written, journal says %d", j.blobPath(k), st.w.Rows(), st.rows)
		}
		if st.w.HashedWhileWriting() {
			w.earlyHashed++
		}
		fb, _ := array.ByteSize(st.frameShape, st.dtype.Size)
		rate := m.Rate
		if m.PerClip {
			rate = 0
		}
		d.Modalities = append(d.Modalities, manifests.Modality{
			Name: m.Name, File: m.Name + ".npy", DType: st.dtype.Descr(), SourceDType: strings.Join(st.descrs, ","),
			FrameShape: append([]int{}, st.frameShape...), Rate: rate, Rows: st.rows, DataOffset: npy.DataAlign,
			Size: npy.DataAlign + st.rows*fb, Template: m.Template, Keys: m.Keys, PerClip: m.PerClip, LabelColumn: m.Label, Labels: j.labelsOf(k),
		})
		d.Stats[m.Name] = manifests.Stats(st.stats)
	}
	report("checksum")
	// Finish the blobs at once (those whose sum was not computed while
	// they were written are hashed now), while the other manifests are
	// written.
	known := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for k, m := range o.Modalities {
		bw := w.mods[k].w
		w.mods[k].w = nil
		wg.Go(func() {
			sum, err := bw.Finish()
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			known[m.Name+".npy"] = sum
		})
	}
	blobSums := func() (map[string]string, error) {
		wg.Wait()
		blob.ReleaseBuffers() // no later writer to keep them for
		return known, firstErr
	}
	if err := writeManifests(j.staging, d, names, w.rows, blobSums, o.Workers); err != nil {
		return nil, err
	}
	return d, nil
}

// writeManifests writes index.npy, clips.parquet, skipped.tsv (if any),
// SHA256SUMS and, last, dataset.json into dir, filling in the modalities'
// sha256. blobSums returns (waiting if need be) the sha256 of the blobs
// known already (hashed while written or copied); the other blobs and
// files are hashed here, while they are fsynced. The blobs are finished
// and synced while the other manifests are being written.
func writeManifests(dir string, d *manifests.Dataset, names []string, rows []manifests.ClipRow, blobSums func() (map[string]string, error), workers int) error {
	var blobs []string
	for _, m := range d.Modalities {
		blobs = append(blobs, m.File)
	}
	type result struct {
		sums map[string]string
		err  error
	}
	blobDone := make(chan result, 1)
	go func() {
		known, err := blobSums()
		if err != nil {
			blobDone <- result{nil, err}
			return
		}
		sums, err := hashAndSync(dir, blobs, known, workers)
		blobDone <- result{sums, err}
	}()
	err := writeSmallManifests(dir, d, rows, names)
	small := []string{manifests.IndexFile, manifests.ClipsFile, manifests.IDsFile}
	if d.Files.Skipped != "" {
		small = append(small, manifests.SkippedFile)
	}
	var sums map[string]string
	if err == nil {
		sums, err = hashAndSync(dir, small, nil, workers)
	}
	br := <-blobDone
	if err == nil {
		err = br.err
	}
	if err != nil {
		return err
	}
	maps.Copy(sums, br.sums)
	for i := range d.Modalities {
		d.Modalities[i].SHA256 = sums[d.Modalities[i].File]
	}
	js, err := manifests.MarshalJSON(d)
	if err != nil {
		return err
	}
	h := sha256.Sum256(js)
	sums[manifests.DatasetFile] = hex.EncodeToString(h[:])
	if err := manifests.WriteSums(filepath.Join(dir, manifests.SumsFile), sums); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, manifests.DatasetFile), js); err != nil {
		return err
	}
	return atomicfile.Sync(dir)
}

// writeSmallManifests writes index.npy, clips.parquet and, if clips were
// skipped, skipped.tsv (setting d.Files.Skipped).
func writeSmallManifests(dir string, d *manifests.Dataset, rows []manifests.ClipRow, names []string) error {
	starts := make([]int64, len(rows))
	lengths := make([]int64, len(rows))
	for i, r := range rows {
		starts[i], lengths[i] = r.Start, r.Length
	}
	if err := manifests.WriteIndex(filepath.Join(dir, manifests.IndexFile), starts, lengths); err != nil {
		return err
	}
	if err := manifests.WriteClips(filepath.Join(dir, manifests.ClipsFile), names, rows); err != nil {
		return err
	}
	var ids bytes.Buffer
	for _, r := range rows {
		ids.WriteString(r.Clip)
		ids.WriteByte('\n')
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, manifests.IDsFile), ids.Bytes()); err != nil {
		return err
	}
	d.Files.IDs = manifests.IDsFile
	if len(d.Skipped) > 0 {
		if err := atomicfile.WriteFile(filepath.Join(dir, manifests.SkippedFile), skippedTSV(d.Skipped)); err != nil {
			return err
		}
		d.Files.Skipped = manifests.SkippedFile
	}
	return nil
}

// hashAndSync fsyncs the named files of dir and returns their sha256,
// taken from known where it is there and computed (up to workers files at
// once) otherwise: the fsyncs wait on the disk while the hashes keep the
// CPUs busy.
func hashAndSync(dir string, files []string, known map[string]string, workers int) (map[string]string, error) {
	var toHash []string
	for _, f := range files {
		if known[f] == "" {
			toHash = append(toHash, f)
		}
	}
	syncErr := make(chan error, 1)
	go func() {
		var first error
		for _, f := range files {
			if err := atomicfile.Sync(filepath.Join(dir, f)); err != nil && first == nil {
				first = err
			}
		}
		syncErr <- first
	}()
	sums, err := hashFiles(dir, toHash, workers)
	if serr := <-syncErr; err == nil {
		err = serr
	}
	for _, f := range files {
		if h := known[f]; h != "" {
			sums[f] = h
		}
	}
	return sums, err
}

// hashFiles returns the sha256 of each named file in dir, hashing up to
// workers files at once.
func hashFiles(dir string, names []string, workers int) (map[string]string, error) {
	sums := make(map[string]string, len(names))
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, max(1, workers))
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s, err := manifests.HashFile(filepath.Join(dir, n))
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			sums[n] = s
		}()
	}
	wg.Wait()
	return sums, firstErr
}

// commit publishes the staging directory as o.Out: an atomic exchange with
// a previous dataset (whose listed files are then removed), or a rename if
// there is none. The staging directory must hold exactly the dataset d.
func (j *job) commit(d *manifests.Dataset) error {
	out := j.opts.Out
	if err := sweepTemp(j.staging); err != nil {
		return err
	}
	if extra, err := manifests.Unlisted(j.staging, d.OwnFiles(), nil); err != nil || len(extra) > 0 {
		return cmp.Or(err, fmt.Errorf("convert: internal error: %w", manifests.NotOurs(j.staging, extra)))
	}
	// Checked again now: files may have been put into out since the start.
	old, err := checkOut(out)
	if err != nil {
		return err
	}
	faults.Point("convert.commit")
	prev, err := atomicfile.ReplaceDir(j.staging, out)
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if prev == "" {
		return nil
	}
	faults.Point("convert.exchanged")
	return removeOld(prev, old)
}

var digits = regexp.MustCompile(`[0-9]+`)

// ErrAllSkipped marks a run in which every clip was skipped (--on-error
// skip): the error says why, by reason, and the staging folder keeps
// skipped.tsv, each clip's reason (convert --clean removes it).
var ErrAllSkipped = errors.New("no clip could be converted")

// allSkipped is the error of a run that converted no clip: the reasons
// counted (the clip's id in each made {clip}, so that one cause is one
// line, and so are reasons that differ only in their numbers), the
// commonest first, with their first clips; and skipped.tsv
// written into the staging folder.
func (j *job) allSkipped(w *writer) error {
	if len(w.skipped) == 0 {
		return fmt.Errorf("%w: %w: the clip list holds no clip", ErrInput, ErrAllSkipped)
	}
	type group struct {
		reason string
		clips  []string
	}
	var groups []*group
	byReason := map[string]*group{}
	for _, s := range w.skipped {
		r := strings.ReplaceAll(s.Reason, s.Clip, "{clip}")
		key := digits.ReplaceAllString(r, "#") // (79 frames, 32 frames: one cause)
		g := byReason[key]
		if g == nil {
			g = &group{reason: r}
			byReason[key] = g
			groups = append(groups, g)
		}
		g.clips = append(g.clips, s.Clip)
	}
	slices.SortStableFunc(groups, func(a, b *group) int { return len(b.clips) - len(a.clips) })
	var parts []string
	for i, g := range groups {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d other reasons", len(groups)-3))
			break
		}
		first := g.clips[:min(len(g.clips), 3)]
		more := ""
		if len(g.clips) > 3 {
			more = ", ..."
		}
		parts = append(parts, fmt.Sprintf("%d like %q (%s%s)", len(g.clips), g.reason, strings.Join(first, ", "), more))
	}
	where := ""
	if j.staging != "" {
		if err := atomicfile.WriteFile(filepath.Join(j.staging, manifests.SkippedFile), skippedTSV(w.skipped)); err == nil {
			where = "; each clip's reason: " + filepath.Join(j.staging, manifests.SkippedFile)
		}
	}
	return fmt.Errorf("%w: %w: all %d clips skipped (--on-error skip), for %s%s", ErrInput, ErrAllSkipped, len(w.skipped), strings.Join(parts, "; "), where)
}

// skippedTSV is skipped.tsv's bytes: a header, then a clip and its reason a
// line.
func skippedTSV(skipped []manifests.Skipped) []byte {
	var b bytes.Buffer
	b.WriteString("clip\treason\n")
	for _, s := range skipped {
		fmt.Fprintf(&b, "%s\t%s\n", s.Clip, strings.ReplaceAll(s.Reason, "\t", " "))
	}
	return b.Bytes()
}
