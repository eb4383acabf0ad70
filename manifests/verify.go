// Verification of a dataset directory (convert --out DIR; verify DIR):
// structure, sha256, per-clip hashes (--deep) and sources (--sources).

package manifests

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

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
	present := map[string]bool{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	for _, e := range entries {
		present[e.Name()] = true
		if !want[e.Name()] && e.Name() != BlockSumsFile && e.Name() != ClaimFile { // (a bucket's, synced down: checked below)
			r.add(Problem{File: e.Name(), What: "unexpected file (not in dataset.json)"})
		}
	}
	for f := range want {
		if !present[f] {
			r.add(Problem{File: f, What: "missing"})
		}
	}

	// SHA256SUMS lists every file but itself, and every listed hash holds.
	sums, err := ReadSums(filepath.Join(dir, d.Files.Sums))
	if err != nil {
		if present[d.Files.Sums] {
			r.add(Problem{File: d.Files.Sums, What: oneLine(err)})
		}
		sums = nil
	}
	if sums != nil {
		for f := range want {
			if _, ok := sums[f]; !ok && f != d.Files.Sums {
				r.add(Problem{File: d.Files.Sums, What: fmt.Sprintf("does not list %s", f)})
			}
		}
		for f := range sums {
			if !want[f] {
				r.add(Problem{File: d.Files.Sums, What: fmt.Sprintf("lists %s, which is not part of the dataset", f)})
			}
		}
	}
	for _, m := range d.Modalities {
		if sums != nil && sums[m.File] != "" && sums[m.File] != m.SHA256 {
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("modality %q sha256 differs from %s", m.Name, d.Files.Sums)})
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
	if present[BlockSumsFile] {
		var blobs []string
		for _, m := range d.Modalities {
			blobs = append(blobs, m.File)
		}
		checkBlockSums(dir, BlockSumsFile, blobs, sums, r)
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
		for _, m := range d.Modalities {
			blobs[m.File] = true
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
		if !present[m.File] {
			continue
		}
		f, st, err := regfile.Open(filepath.Join(dir, m.File))
		if err != nil {
			r.add(Problem{File: m.File, What: oneLine(err)})
			continue
		}
		if st.Size() != m.Size {
			r.add(Problem{File: m.File, What: fmt.Sprintf("size %d, dataset.json says %d (truncated or extended)", st.Size(), m.Size)})
		}
		h, err := npy.ReadHeader(f, st.Size())
		f.Close()
		if err != nil {
			if st.Size() == m.Size {
				r.add(Problem{File: m.File, What: oneLine(err)})
			}
			continue
		}
		if h.Descr != m.DType {
			r.add(Problem{File: m.File, What: fmt.Sprintf("header dtype %s, dataset.json says %s", h.Descr, m.DType)})
		}
		wantShape := append([]int{int(m.Rows)}, m.FrameShape...)
		if !slices.Equal(h.Shape, wantShape) || h.Fortran {
			r.add(Problem{File: m.File, What: fmt.Sprintf("header shape %s (fortran=%v), dataset.json says %s", array.FormatShape(h.Shape), h.Fortran, array.FormatShape(wantShape))})
		}
		if h.DataOffset != m.DataOffset || h.DataOffset%npy.DataAlign != 0 {
			r.add(Problem{File: m.File, What: fmt.Sprintf("data at offset %d, dataset.json says %d (must be 4096-aligned)", h.DataOffset, m.DataOffset)})
		}
		switch {
		case m.PerClip && (m.Rate != 0 || m.Rows != d.Clips):
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("per-clip modality %q has %d rows at rate %d, want a row for each of %d clips at rate 0", m.Name, m.Rows, m.Rate, d.Clips)})
		case !m.PerClip && (m.Rate < 1 || m.Rows != d.Frames*int64(m.Rate)):
			r.add(Problem{File: DatasetFile, What: fmt.Sprintf("modality %q has %d rows, but %d frames at rate %d make %d", m.Name, m.Rows, d.Frames, m.Rate, d.Frames*int64(m.Rate))})
		}
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
	for k, m := range d.Modalities {
		f, _, err := regfile.Open(filepath.Join(dir, m.File))
		if err != nil {
			continue // reported already
		}
		fb, err := array.ByteSize(m.FrameShape, dtypeSize(m.DType))
		if err != nil {
			f.Close()
			continue
		}
		off := m.DataOffset
		var sum Stats // over the clips, as recorded
		audited := len(rows) > 0
		for i, row := range rows {
			first, nr := m.ClipRows(i, row.Start, row.Length)
			n := nr * fb
			h := xxhash.New()
			audit, aerr := NewRowAudit(m.DType)
			if aerr != nil {
				break // the dtype is reported by checkBlobs
			}
			got, err := io.Copy(io.MultiWriter(h, audit), io.NewSectionReader(f, off, n))
			if err != nil || got != n {
				r.add(Problem{File: m.File, Clip: row.Clip, What: fmt.Sprintf("rows past the end of the file (%d of %d bytes)", got, n)})
				audited = false
				break
			}
			if h.Sum64() != row.Sources[k].XXH64 {
				r.add(Problem{File: m.File, Clip: row.Clip, What: fmt.Sprintf("xxh64 mismatch: rows %d..%d (bytes %d..%d) differ from what convert wrote",
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
			off += n
		}
		f.Close()
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
