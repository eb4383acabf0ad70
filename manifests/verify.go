// Verification of a dataset directory (convert --out DIR; verify DIR):
// structure, sha256, per-clip hashes (--deep) and sources (--sources).

package manifests

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
)

// VerifyDataset checks the dataset in dir. The error is non-nil only when
// the manifest itself cannot be used (missing, unreadable, or naming paths
// outside dir): then nothing else was checked. Everything else found wrong
// is listed in the report.
func VerifyDataset(dir string, o VerifyOptions) (*Report, error) {
	d, err := LoadDataset(dir)
	if err != nil {
		return nil, err
	}
	r, _, err := verifyDataset(dir, d, o)
	return r, err
}

// Vouch checks what can be checked of the dataset in dir without reading
// its blobs' data: every file present and no other, SHA256SUMS against
// dataset.json's blob hashes, the sha256 of the manifests themselves
// (dataset.json, clips.parquet, index.npy, the id list), the blobs' .npy
// headers and sizes against dataset.json, and index.npy, clips.parquet and
// dataset.json against each other. It returns the dataset and its clip
// rows, or an error naming the first problem found (and how many more). A
// dataset it vouches for may still hold rotten blob bytes: verify reads
// them.
func Vouch(dir string) (*Dataset, []ClipRow, error) {
	d, err := LoadDataset(dir)
	if err != nil {
		return nil, nil, err
	}
	r, rows, err := verifyDataset(dir, d, VerifyOptions{manifestsOnly: true})
	if err != nil {
		return nil, nil, err
	}
	if n := len(r.Problems); n > 0 {
		more := ""
		if n > 1 {
			more = fmt.Sprintf(" (and %d more problems)", n-1)
		}
		return nil, nil, fmt.Errorf("%w: %s: %s%s", ErrManifest, dir, r.Problems[0], more)
	}
	if rows == nil {
		return nil, nil, fmt.Errorf("%w: %s: %s unreadable", ErrManifest, dir, d.Files.Clips)
	}
	return d, rows, nil
}

func verifyDataset(dir string, d *Dataset, o VerifyOptions) (*Report, []ClipRow, error) {
	if o.Workers <= 0 {
		o.Workers = 2
	}
	r := NewReport("dataset", dir, "structure+sha256")
	r.Clips = int(d.Clips)
	if o.Deep {
		r.Level += "+deep"
	}
	if o.Sources {
		r.Level += "+sources"
	}

	// Expected files: the manifests, the blobs, nothing else.
	want := d.OwnFiles()
	present, linked := map[string]bool{}, map[string]bool{} // (linked: links out of dir, not followed)
	if d.Segmented() {
		var err error
		if want, err = DirFiles(dir, d); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrManifest, err)
		}
		dropping, _, err := DroppingFiles(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrManifest, err)
		}
		err = WalkRel(dir, func(rel string, e fs.DirEntry) error {
			if what := LinkOut(dir, rel, e); what != "" {
				r.add(Problem{File: rel, What: what})
				linked[rel] = true
				return nil
			}
			switch {
			case e.IsDir() && (rel == SegmentsDir || rel == VersionsDir || wantsUnder(want, rel)):
				return nil
			case e.IsDir() && strings.HasPrefix(path.Base(rel), DropPrefix) && path.Dir(rel) == VersionsDir:
				r.add(Problem{File: rel + "/", What: "left by a convert --keep killed before it finished (a dropped version's; a re-run of convert removes it)"})
				return fs.SkipDir
			case e.IsDir() && Leftover(rel, true):
				r.add(Problem{File: rel + "/", What: "left by a convert --segments killed before its commit (no version lists it; a re-run of convert removes it)"})
				return fs.SkipDir
			case e.IsDir():
				r.add(Problem{File: rel + "/", What: "unexpected folder (not in dataset.json: a folder of yours? move it out of the dataset's folder)"})
				return fs.SkipDir
			}
			present[rel] = true
			switch {
			case want[rel] || rel == BlockSumsFile || rel == ClaimFile:
			case path.Base(rel) == BlockSumsFile && path.Dir(path.Dir(rel)) == SegmentsDir && wantsUnder(want, path.Dir(rel)):
				// (a segment's, of a push: checked below)
			case dropping[rel]:
				r.add(Problem{File: rel, What: "left by a convert --keep killed before it finished (a dropped version's; a re-run of convert removes it)"})
			default:
				r.add(Problem{File: rel, What: "unexpected file (not in dataset.json: a file of yours? move it out of the dataset's folder)"})
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrManifest, err)
		}
		top, err1 := regfile.ReadFile(filepath.Join(dir, DatasetFile), MaxManifest)
		ver, err2 := regfile.ReadFile(filepath.Join(dir, filepath.FromSlash(VersionFile(d.Number()))), MaxManifest)
		if err1 == nil && err2 == nil && !bytes.Equal(top, ver) {
			r.add(Problem{File: VersionFile(d.Number()), What: fmt.Sprintf("differs from %s (the current version's manifest, which it must equal)", DatasetFile)})
		}
	} else {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrManifest, err)
		}
		for _, e := range entries {
			if what := LinkOut(dir, e.Name(), e); what != "" {
				r.add(Problem{File: e.Name(), What: what})
				linked[e.Name()] = true
				continue
			}
			present[e.Name()] = true
			switch {
			case want[e.Name()] || e.Name() == BlockSumsFile || e.Name() == ClaimFile: // (a bucket's, synced down: checked below)
			case e.IsDir() && (e.Name() == SegmentsDir || e.Name() == VersionsDir):
				r.add(Problem{File: e.Name() + "/", What: "left by a convert --segments killed before its commit (no version lists it; a re-run of convert --segments removes it)"})
			default:
				r.add(Problem{File: e.Name(), What: "unexpected file (not in dataset.json: a file of yours? move it out of the dataset's folder)"})
			}
		}
	}
	for f := range want {
		if !present[f] && !linked[f] && !linked[path.Dir(f)] {
			r.add(Problem{File: f, What: "missing"})
		}
	}
	// The version's own files: those its SHA256SUMS lists (a format 2
	// version lists its dataset.json under versions/N, the top one being
	// the current version's copy).
	mine := d.OwnFiles()
	if d.Segmented() {
		delete(mine, DatasetFile)
	}

	// SHA256SUMS lists every file but itself, and every listed hash holds.
	var err error
	sums, err := ReadSums(filepath.Join(dir, d.Files.Sums))
	if err != nil {
		if present[d.Files.Sums] {
			r.add(Problem{File: d.Files.Sums, What: oneLine(err)})
		}
		sums = nil
	}
	if sums != nil {
		for f := range mine {
			if _, ok := sums[f]; !ok && f != d.Files.Sums {
				r.add(Problem{File: d.Files.Sums, What: fmt.Sprintf("does not list %s", f)})
			}
		}
		for f := range sums {
			if !mine[f] {
				r.add(Problem{File: d.Files.Sums, What: fmt.Sprintf("lists %s, which is not part of the dataset", f)})
			}
		}
	}
	for _, m := range d.Modalities {
		for _, b := range m.BlobList() {
			if sums != nil && sums[b.File] != "" && sums[b.File] != b.SHA256 {
				r.add(Problem{File: DatasetFile, What: fmt.Sprintf("modality %q: %s's sha256 differs from %s", m.Name, b.File, d.Files.Sums)})
			}
		}
	}

	// Blob headers and sizes against dataset.json.
	checkBlobs(dir, d, present, r)

	// index.npy, clips.parquet and dataset.json agree. A clips.parquet
	// whose sha256 is wrong is not parsed: a corrupt footer can make the
	// Parquet reader allocate what it declares.
	parquetOK := present[d.Files.Clips]
	if want := sums[d.Files.Clips]; parquetOK && want != "" {
		if got, err := HashFile(filepath.Join(dir, d.Files.Clips)); err != nil || got != want {
			parquetOK = false
		}
	}
	rows := checkOffsets(dir, d, present, parquetOK, r)

	// The blobs' block sums, if a push wrote them (checked as the blobs
	// are hashed).
	if !d.Segmented() && present[BlockSumsFile] {
		checkBlockSums(dir, BlockSumsFile, d.BlobFiles(), sums, r)
	}
	if d.Segmented() {
		// (a BLOCKSUMS a folder: the top one, each segment's; listing
		// the blobs of every kept version there)
		if k, err := KeptFiles(dir); err == nil {
			groups := map[string][]string{}
			for f := range k.Blobs {
				groups[BlockFolder(f)] = append(groups[BlockFolder(f)], f)
			}
			for f, g := range groups {
				if present[BlockSumsOf(f)] {
					checkBlockSums(dir, BlockSumsOf(f), g, k.Sums, r)
				}
			}
		}
	}
	if present[ClaimFile] {
		if js, err := regfile.ReadFile(filepath.Join(dir, DatasetFile), MaxManifest); err == nil {
			checkClaim(dir, DatasetClaim(js), r)
		}
	}

	// sha256 of every listed file, in parallel (of the manifests only,
	// for Vouch).
	if o.manifestsOnly {
		blobs := map[string]bool{}
		for _, f := range d.BlobFiles() {
			blobs[f] = true
		}
		small := map[string]string{}
		for f, h := range sums {
			if !blobs[f] {
				small[f] = h
			}
		}
		sums = small
	}
	CheckSums(dir, sums, present, o, r)

	if o.Deep && rows != nil {
		deepClips(dir, d, rows, r)
	}
	if o.Sources && rows != nil {
		checkSources(dir, d, rows, cmp.Or(o.Mem, DefaultVerifyMem), r)
	}
	r.Sort()
	return r, rows, nil
}

func checkBlobs(dir string, d *Dataset, present map[string]bool, r *Report) {
	for _, m := range d.Modalities {
		total := int64(0)
		for _, b := range m.BlobList() {
			total += b.Rows
			checkBlob(dir, m, b, present, r)
		}
		if d.Segmented() && total < m.Rows {
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("modality %q: its blobs hold %d rows, fewer than its %d", m.Name, total, m.Rows)})
		}
		switch {
		case m.PerClip && (m.Rate != 0 || m.Rows != d.Clips):
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("per-clip modality %q has %d rows at rate %d, want a row for each of %d clips at rate 0", m.Name, m.Rows, m.Rate, d.Clips)})
		case !m.PerClip && (m.Rate < 1 || m.Rows != d.Frames*int64(m.Rate)):
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("modality %q has %d rows, but %d frames at rate %d make %d", m.Name, m.Rows, d.Frames, m.Rate, d.Frames*int64(m.Rate))})
		}
	}
}

// checkBlob checks one blob's header and size against dataset.json.
func checkBlob(dir string, m Modality, b Blob, present map[string]bool, r *Report) {
	if !present[b.File] {
		return
	}
	f, st, err := regfile.Open(filepath.Join(dir, b.File))
	if err != nil {
		r.add(Problem{File: b.File, What: oneLine(err)})
		return
	}
	if st.Size() != b.Size {
		r.add(Problem{File: b.File, What: fmt.Sprintf("size %d, dataset.json says %d (truncated or extended)", st.Size(), b.Size)})
	}
	h, err := npy.ReadHeader(f, st.Size())
	f.Close()
	if err != nil {
		if st.Size() == b.Size {
			r.add(Problem{File: b.File, What: oneLine(err)})
		}
		return
	}
	if h.Descr != m.DType {
		r.add(Problem{File: b.File, What: fmt.Sprintf("header dtype %s, dataset.json says %s", h.Descr, m.DType)})
	}
	wantShape := append([]int{int(b.Rows)}, m.FrameShape...)
	if !slices.Equal(h.Shape, wantShape) || h.Fortran {
		r.add(Problem{File: b.File, What: fmt.Sprintf("header shape %s (fortran=%v), dataset.json says %s", array.FormatShape(h.Shape), h.Fortran, array.FormatShape(wantShape))})
	}
	if h.DataOffset != b.DataOffset || h.DataOffset%npy.DataAlign != 0 {
		r.add(Problem{File: b.File, What: fmt.Sprintf("data at offset %d, dataset.json says %d (must be 4096-aligned)", h.DataOffset, b.DataOffset)})
	}
}

// checkOffsets checks index.npy and clips.parquet against each other and
// dataset.json, and returns the parquet rows (nil if unreadable).
func checkOffsets(dir string, d *Dataset, present map[string]bool, parquetOK bool, r *Report) []ClipRow {
	names := make([]string, len(d.Modalities))
	for i, m := range d.Modalities {
		names[i] = m.Name
	}
	var starts, lengths []int64
	if present[d.Files.Index] {
		var err error
		if starts, lengths, err = ReadIndex(filepath.Join(dir, d.Files.Index)); err != nil {
			r.add(Problem{File: d.Files.Index, What: oneLine(err)})
			starts = nil
		}
	}
	if starts != nil {
		if int64(len(starts)) != d.Clips {
			r.add(Problem{File: d.Files.Index, What: fmt.Sprintf("%d clips, dataset.json says %d", len(starts), d.Clips)})
		}
		var next int64
		for i := range starts {
			if starts[i] != next || lengths[i] < 0 {
				r.add(Problem{File: d.Files.Index, What: fmt.Sprintf("row %d: start %d length %d, want start %d (contiguous from 0)", i, starts[i], lengths[i], next)})
				break
			}
			next += lengths[i]
		}
		if next != d.Frames {
			r.add(Problem{File: d.Files.Index, What: fmt.Sprintf("lengths add up to %d frames, dataset.json says %d", next, d.Frames)})
		}
		if d.Segmented() && present[d.Files.Where] {
			if _, err := ReadWhere(filepath.Join(dir, d.Files.Where), d, starts, lengths); err != nil {
				r.add(Problem{File: d.Files.Where, What: oneLine(err)})
			}
		}
	}
	if !parquetOK {
		return nil // missing, or its sha256 mismatch is reported
	}
	rows, err := ReadClips(filepath.Join(dir, d.Files.Clips), names)
	if err != nil {
		r.add(Problem{File: d.Files.Clips, What: oneLine(err)})
		return nil
	}
	if int64(len(rows)) != d.Clips {
		r.add(Problem{File: d.Files.Clips, What: fmt.Sprintf("%d rows, dataset.json says %d clips", len(rows), d.Clips)})
	}
	if d.Files.IDs != "" && present[d.Files.IDs] {
		checkIDs(dir, d.Files.IDs, rows, r)
	}
	seen := map[string]bool{}
	for i, row := range rows {
		if seen[row.Clip] {
			r.add(Problem{File: d.Files.Clips, Clip: row.Clip, What: "clip listed twice"})
		}
		seen[row.Clip] = true
		if starts != nil && i < len(starts) && (row.Start != starts[i] || row.Length != lengths[i]) {
			r.add(Problem{File: d.Files.Clips, Clip: row.Clip, What: fmt.Sprintf("row %d: start %d length %d, index.npy says %d %d", i, row.Start, row.Length, starts[i], lengths[i])})
		}
		if row.Trimmed < 0 {
			r.add(Problem{File: d.Files.Clips, Clip: row.Clip, What: fmt.Sprintf("negative trimmed %d", row.Trimmed)})
		}
	}
	return rows
}

// checkIDs checks that the clip id list names the clips of clips.parquet,
// in order.
func checkIDs(dir, name string, rows []ClipRow, r *Report) {
	ids, err := ReadIDs(filepath.Join(dir, name))
	if err != nil {
		var fe *FileError
		if errors.As(err, &fe) {
			err = fe.Err
		}
		r.add(Problem{File: name, What: oneLine(err)})
		return
	}
	if len(ids) != len(rows) {
		r.add(Problem{File: name, What: fmt.Sprintf("%d ids, clips.parquet has %d clips", len(ids), len(rows))})
		return
	}
	for i, row := range rows {
		if ids[i] != row.Clip {
			r.add(Problem{File: name, Clip: row.Clip, What: fmt.Sprintf("line %d says %q, clips.parquet row %d is %q", i+1, ids[i], i, row.Clip)})
			return
		}
	}
}

// deepClips checks every clip's xxHash64 in every blob.
func deepClips(dir string, d *Dataset, rows []ClipRow, r *Report) {
	wh, err := rowsWhere(dir, d, rows)
	if err != nil {
		return // reported by checkOffsets
	}
	for k, m := range d.Modalities {
		fb, err := array.ByteSize(m.FrameShape, dtypeSize(m.DType))
		if err != nil {
			continue
		}
		blobs := m.BlobList()
		files := make([]*os.File, len(blobs))
		opened := make([]bool, len(blobs))
		var sum Stats // over the clips, as recorded
		audited := len(rows) > 0
		for i, row := range rows {
			b, first, nr := d.Locate(wh, k, i, row.Start, row.Length)
			if !opened[b] {
				opened[b] = true
				files[b], _, _ = regfile.Open(filepath.Join(dir, blobs[b].File))
				if files[b] != nil {
					defer files[b].Close()
				}
			}
			f := files[b]
			if f == nil {
				audited = false
				continue // reported already
			}
			off := blobs[b].DataOffset + first*fb
			n := nr * fb
			h := xxhash.New()
			audit, aerr := NewRowAudit(m.DType)
			if aerr != nil {
				break // the dtype is reported by checkBlobs
			}
			got, err := io.Copy(io.MultiWriter(h, audit), io.NewSectionReader(f, off, n))
			if err != nil || got != n {
				r.add(Problem{File: blobs[b].File, Clip: row.Clip, What: fmt.Sprintf("rows past the end of the file (%d of %d bytes)", got, n)})
				audited = false
				continue
			}
			if m.IsLabel() {
				var code [4]byte
				f.ReadAt(code[:], off) // (read whole just above)
				if c := int32(binary.LittleEndian.Uint32(code[:])); c < 0 || int(c) >= len(m.Labels) {
					r.add(Problem{File: blobs[b].File, Clip: row.Clip, What: fmt.Sprintf("label %q: code %d is outside its vocabulary of %d labels (dataset.json)", m.Name, c, len(m.Labels))})
				}
			}
			if h.Sum64() != row.Sources[k].XXH64 {
				r.add(Problem{File: blobs[b].File, Clip: row.Clip, What: fmt.Sprintf("xxh64 mismatch: rows %d..%d (bytes %d..%d) differ from what convert wrote",
					first, first+nr, off, off+n)})
			}
			// The clip's recorded figures against what its rows determine.
			if src := row.Sources[k]; src.Audited {
				if what := src.Stats.Disagrees(audit.Stats(), m.DType); what != "" {
					r.add(Problem{File: d.Files.Clips, Clip: row.Clip, What: fmt.Sprintf("modality %q: recorded %s", m.Name, what)})
				}
				sum.NaN += src.Stats.NaN
				sum.InfIn += src.Stats.InfIn
				sum.Overflow += src.Stats.Overflow
				sum.Underflow += src.Stats.Underflow
				sum.MaxAbs = max(sum.MaxAbs, src.Stats.MaxAbs)
			} else {
				audited = false
			}
		}
		// dataset.json's totals are the clips' figures added up.
		if tot, ok := d.Stats[m.Name]; audited && (!ok || tot != sum) {
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("stats of %q: nan %d, inf_in %d, overflow %d, underflow %d, max_abs %v; the clips' figures in %s add up to %d, %d, %d, %d, %v",
				m.Name, tot.NaN, tot.InfIn, tot.Overflow, tot.Underflow, tot.MaxAbs, d.Files.Clips, sum.NaN, sum.InfIn, sum.Overflow, sum.Underflow, sum.MaxAbs)})
		}
		if audited {
			checkSourceDTypes(d, k, m, rows, r)
		}
	}
	checkAlign(d, rows, r)
}

// wantsUnder reports whether want lists a file under folder rel.
func wantsUnder(want map[string]bool, rel string) bool {
	for f := range want {
		if strings.HasPrefix(f, rel+"/") {
			return true
		}
	}
	return false
}

// rowsWhere reads d's where.npy (nil for format 1) against the starts and
// lengths of its clip rows.
func rowsWhere(dir string, d *Dataset, rows []ClipRow) (*Where, error) {
	if !d.Segmented() {
		return nil, nil
	}
	starts, lengths := make([]int64, len(rows)), make([]int64, len(rows))
	for i, row := range rows {
		starts[i], lengths[i] = row.Start, row.Length
	}
	return LoadWhere(dir, d, starts, lengths)
}
