// Verification of a dataset directory (convert --out DIR; verify DIR):
// structure, sha256, per-clip hashes (--deep) and sources (--sources).

package manifests

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
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
		if !want[e.Name()] && e.Name() != BlockSumsFile { // (a bucket's, synced down: checked below)
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
	b, err := regfile.ReadFile(filepath.Join(dir, name), MaxManifest)
	if err != nil {
		r.add(Problem{File: name, What: oneLine(err)})
		return
	}
	ids := strings.Split(string(b), "\n")
	if len(ids) == 0 || ids[len(ids)-1] != "" {
		r.add(Problem{File: name, What: "does not end with a newline"})
		return
	}
	ids = ids[:len(ids)-1]
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

// checkSourceDTypes checks a modality's source_dtype in dataset.json: the
// clips' source dtypes, each once, in the order they first come.
func checkSourceDTypes(d *Dataset, k int, m Modality, rows []ClipRow, r *Report) {
	var descrs []string
	for _, row := range rows {
		if s := row.Sources[k].Descr; !slices.Contains(descrs, s) {
			descrs = append(descrs, s)
		}
	}
	if want := strings.Join(descrs, ","); m.SourceDType != want {
		r.add(Problem{File: DatasetFile, What: fmt.Sprintf("modality %q: source_dtype %q, the clips' in %s make %q", m.Name, m.SourceDType, d.Files.Clips, want)})
	}
}

// checkAlign checks dataset.json's align and trimmed against the clips'.
func checkAlign(d *Dataset, rows []ClipRow, r *Report) {
	var trimmed int64
	for _, row := range rows {
		trimmed += row.Trimmed
	}
	switch {
	case d.Align != "strict" && d.Align != "trim":
		r.add(Problem{File: DatasetFile, What: fmt.Sprintf("align %q: want strict or trim", d.Align)})
	case d.Align == "strict" && trimmed > 0:
		r.add(Problem{File: DatasetFile, What: fmt.Sprintf("align strict, but the clips of %s were trimmed by %d frames", d.Files.Clips, trimmed)})
	}
	if d.Trimmed != trimmed {
		r.add(Problem{File: DatasetFile, What: fmt.Sprintf("trimmed %d, the clips of %s add up to %d", d.Trimmed, d.Files.Clips, trimmed)})
	}
}

func dtypeSize(descr string) int {
	dt, _, err := array.ParseDescr(descr)
	if err != nil {
		return 0
	}
	return dt.Size
}

// checkSources re-decodes every clip's sources, converts them as convert
// would, and compares the bytes with the clip's rows in the blob itself
// (not with a recorded hash, which an edit of the manifests could have
// made agree with a tampered blob).
func checkSources(dir string, d *Dataset, rows []ClipRow, mem int64, r *Report) {
	// A .npy source larger than piece is compared a piece at a time: its
	// rows, their conversion and the blob's rows take about 4 pieces.
	piece := max(1<<20, mem/8)
	blobs := make([]*os.File, len(d.Modalities))
	rowBytes := make([]int64, len(d.Modalities))
	for k, m := range d.Modalities {
		f, _, err := regfile.Open(filepath.Join(dir, m.File))
		if err != nil {
			continue // reported by the structure checks
		}
		defer f.Close()
		blobs[k] = f
		rowBytes[k], _ = array.ByteSize(m.FrameShape, dtypeSize(m.DType))
	}
	var blobRows []byte
	for i, row := range rows {
		for k, m := range d.Modalities {
			s := row.Sources[k]
			st := Stamp(s.Path)
			if st.Size < 0 {
				r.add(Problem{File: s.Path, Clip: row.Clip, What: "source is gone"})
				continue
			}
			changed := s.Stamp().Differs(st)
			if f, _ := formats.FormatOf(s.Path); f == formats.NPY && !m.PerClip && st.Size > piece && blobs[k] != nil {
				// Too large to hold with its conversion: a piece at a time.
				first, n := m.ClipRows(i, row.Start, row.Length)
				streamSource(d, m, row, s, changed, blobs[k], m.DataOffset+first*rowBytes[k], first, n, piece, r)
				continue
			}
			a, err := formats.Load(s.Path, m.Keys)
			if err != nil {
				r.add(Problem{File: s.Path, Clip: row.Clip, What: "source no longer decodes: " + oneLine(err)})
				continue
			}
			first, n := m.ClipRows(i, row.Start, row.Length)
			if m.PerClip {
				a = a.OneRow() // one row: the whole value
			}
			if !slices.Equal(a.FrameShape(), m.FrameShape) {
				r.add(Problem{File: s.Path, Clip: row.Clip, What: fmt.Sprintf("source %s: its frames are %s, the dataset's %s", a, array.FormatShape(a.FrameShape()), array.FormatShape(m.FrameShape))})
				continue
			}
			got, audit, err := converted(a, n, m.DType)
			if err != nil {
				r.add(Problem{File: s.Path, Clip: row.Clip, What: oneLine(err)})
				continue
			}
			checkRecorded(d, m, row, s, audit, a.SourceDescr, r)
			if blobs[k] == nil {
				continue
			}
			off := m.DataOffset + first*rowBytes[k]
			if int64(cap(blobRows)) < int64(len(got)) {
				blobRows = make([]byte, len(got))
			}
			blobRows = blobRows[:len(got)]
			if k, err := blobs[k].ReadAt(blobRows, off); k != len(got) {
				r.add(Problem{File: m.File, Clip: row.Clip, What: fmt.Sprintf("rows %d..%d (bytes %d..%d): %v", first, first+n, off, off+int64(len(got)), err)})
				continue
			}
			switch {
			case !bytes.Equal(got, blobRows):
				what := fmt.Sprintf("content drift: the converted source differs from %s rows %d..%d", m.File, first, first+n)
				if changed != "" {
					what += " (changed since conversion: " + changed + ")"
				}
				r.add(Problem{File: s.Path, Clip: row.Clip, What: what})
			case changed != "":
				r.add(Problem{File: s.Path, Clip: row.Clip, What: "changed since conversion (" + changed + ") but converts to the same bytes"})
			}
		}
	}
}

// streamSource is checkSources' comparison of a large .npy source s of
// modality m of clip row with the blob's rows [first, first+n) at off, a
// piece of about piece bytes at a time, and of the clip's recorded
// figures with the conversion's.
func streamSource(d *Dataset, m Modality, row ClipRow, s ClipSource, changed string, blob *os.File, off, first, n, piece int64, r *Report) {
	src, err := formats.OpenNPYRows(nil, s.Path)
	if err != nil {
		r.add(Problem{File: s.Path, Clip: row.Clip, What: "source no longer decodes: " + oneLine(err)})
		return
	}
	defer src.Close()
	a := src.Array()
	if !slices.Equal(a.FrameShape(), m.FrameShape) {
		r.add(Problem{File: s.Path, Clip: row.Clip, What: fmt.Sprintf("source %s: its frames are %s, the dataset's %s", a, array.FormatShape(a.FrameShape()), array.FormatShape(m.FrameShape))})
		return
	}
	if len(a.Shape) == 0 || int64(a.Shape[0]) < n {
		r.add(Problem{File: s.Path, Clip: row.Clip, What: fmt.Sprintf("source has %d rows, the dataset holds %d", a.Rows(), n)})
		return
	}
	keep := m.DType != array.Float16.Descr()
	if keep && a.DType.Descr() != m.DType {
		r.add(Problem{File: s.Path, Clip: row.Clip, What: fmt.Sprintf("source dtype %s, dataset keeps %s", a.DType.Descr(), m.DType)})
		return
	}
	outRow := int64(dtypeSize(m.DType))
	for _, x := range m.FrameShape {
		outRow *= int64(x)
	}
	step := max(1, piece/max(1, src.RowBytes()))
	var raw, dst, out, scratch, have []byte
	var audit f16.Stats
	drift := false
	for r0 := int64(0); r0 < n && !drift; r0 += step {
		r1 := min(n, r0+step)
		data, err := src.Read(r0, r1, &raw, &dst)
		if err != nil {
			r.add(Problem{File: s.Path, Clip: row.Clip, What: "source no longer decodes: " + oneLine(err)})
			return
		}
		scratch = grown(scratch, 2*len(data)/a.DType.Size)
		if err := f16.Convert(scratch, data, a.DType, &audit); err != nil {
			r.add(Problem{File: s.Path, Clip: row.Clip, What: oneLine(err)})
			return
		}
		out = scratch
		if keep {
			out = data
		}
		have = grown(have, len(out))
		if k, err := blob.ReadAt(have, off+r0*outRow); k != len(out) {
			r.add(Problem{File: m.File, Clip: row.Clip, What: fmt.Sprintf("rows %d..%d (bytes %d..%d): %v", first+r0, first+r1, off+r0*outRow, off+r1*outRow, err)})
			return
		}
		if !bytes.Equal(out, have) {
			drift = true
			what := fmt.Sprintf("content drift: the converted source differs from %s rows %d..%d (in rows %d..%d)", m.File, first, first+n, first+r0, first+r1)
			if changed != "" {
				what += " (changed since conversion: " + changed + ")"
			}
			r.add(Problem{File: s.Path, Clip: row.Clip, What: what})
		}
	}
	if drift {
		return
	}
	if keep {
		audit.Overflow, audit.Underflow = 0, 0
	}
	checkRecorded(d, m, row, s, audit, a.SourceDescr, r)
	if changed != "" {
		r.add(Problem{File: s.Path, Clip: row.Clip, What: "changed since conversion (" + changed + ") but converts to the same bytes"})
	}
}

// checkRecorded compares every figure clips.parquet records for a clip's
// modality (if it records them) with its source's conversion, exactly:
// the audit and the source dtype descr.
func checkRecorded(d *Dataset, m Modality, row ClipRow, s ClipSource, audit f16.Stats, descr string, r *Report) {
	if !s.Audited {
		return
	}
	if rec := Stats(audit); s.Stats != rec {
		r.add(Problem{File: d.Files.Clips, Clip: row.Clip, What: fmt.Sprintf("modality %q: recorded nan %d, inf_in %d, overflow %d, underflow %d, max_abs %v; its source converts with %d, %d, %d, %d, %v",
			m.Name, s.Stats.NaN, s.Stats.InfIn, s.Stats.Overflow, s.Stats.Underflow, s.Stats.MaxAbs, rec.NaN, rec.InfIn, rec.Overflow, rec.Underflow, rec.MaxAbs)})
	}
	if s.Descr != descr {
		r.add(Problem{File: d.Files.Clips, Clip: row.Clip, What: fmt.Sprintf("modality %q: recorded source dtype %s, the source's is %s", m.Name, s.Descr, descr)})
	}
}

// grown returns b with length n, reallocated if too small.
func grown(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// converted converts the first rows of a as convert would (float16, or
// kept in its dtype) and returns the bytes and the audit convert records.
func converted(a *array.Array, rows int64, dtype string) ([]byte, f16.Stats, error) {
	var st f16.Stats
	if len(a.Shape) == 0 || int64(a.Rows()) < rows {
		return nil, st, fmt.Errorf("source has %d rows, the dataset holds %d", a.Rows(), rows)
	}
	frame := int64(1)
	for _, d := range a.FrameShape() {
		frame *= int64(d)
	}
	src := a.Data[:rows*frame*int64(a.DType.Size)]
	out := make([]byte, 2*rows*frame)
	if err := f16.Convert(out, src, a.DType, &st); err != nil {
		return nil, st, err
	}
	if dtype != array.Float16.Descr() {
		if a.DType.Descr() != dtype {
			return nil, st, fmt.Errorf("source dtype %s, dataset keeps %s", a.DType.Descr(), dtype)
		}
		st.Overflow, st.Underflow = 0, 0 // kept: nothing rounded
		return src, st, nil
	}
	return out, st, nil
}

// mtime words a modification time in ns for a person: RFC 3339, UTC.
func mtime(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }
