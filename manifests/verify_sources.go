// verify --sources: each clip re-read from its source files, converted as
// convert did, and compared with the blob; sources changed since recorded.

package manifests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/formats/regfile"
)

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
	wh, err := rowsWhere(dir, d, rows)
	if err != nil {
		return // reported by checkOffsets
	}
	files := map[string]*os.File{}
	open := func(name string) *os.File {
		f, ok := files[name]
		if !ok {
			f, _, _ = regfile.Open(filepath.Join(dir, name))
			files[name] = f // nil: reported by the structure checks
		}
		return f
	}
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	rowBytes := make([]int64, len(d.Modalities))
	for k, m := range d.Modalities {
		rowBytes[k], _ = array.ByteSize(m.FrameShape, dtypeSize(m.DType))
	}
	var blobRows []byte
	for i, row := range rows {
		for k := range d.Modalities {
			m := d.Modalities[k]
			if m.LabelColumn != "" {
				continue // the clip list's column: no file (the codes are checked by verify's own pass)
			}
			b, first, n := d.Locate(wh, k, i, row.Start, row.Length)
			blob := m.BlobList()[b]
			m.File, m.DataOffset = blob.File, blob.DataOffset // (the clip's blob, in the messages below)
			blobF := open(blob.File)
			s := row.Sources[k]
			st := Stamp(s.Path)
			if st.Size < 0 {
				r.add(Problem{File: s.Path, Clip: row.Clip, What: "source is gone"})
				continue
			}
			changed := s.Stamp().Differs(st)
			if m.IsLabel() {
				checkLabelSource(m, row, s, changed, blobF, m.DataOffset+first*4, r)
				continue
			}
			if f, _ := formats.FormatOf(s.Path); f == formats.NPY && !m.PerClip && st.Size > piece && blobF != nil {
				// Too large to hold with its conversion: a piece at a time.
				streamSource(d, m, row, s, changed, blobF, m.DataOffset+first*rowBytes[k], first, n, piece, r)
				continue
			}
			a, err := formats.Load(s.Path, m.Keys)
			if err != nil {
				r.add(Problem{File: s.Path, Clip: row.Clip, What: "source no longer decodes: " + oneLine(err)})
				continue
			}
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
			if blobF == nil {
				continue
			}
			off := m.DataOffset + first*rowBytes[k]
			if int64(cap(blobRows)) < int64(len(got)) {
				blobRows = make([]byte, len(got))
			}
			blobRows = blobRows[:len(got)]
			if k, err := blobF.ReadAt(blobRows, off); k != len(got) {
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

// checkLabelSource compares the label at a pickle label modality's key of
// the clip's source with the label its code at off names.
func checkLabelSource(m Modality, row ClipRow, s ClipSource, changed string, blobF *os.File, off int64, r *Report) {
	a, err := formats.Load(s.Path, formats.LabelKeys(m.Keys))
	if err != nil {
		r.add(Problem{File: s.Path, Clip: row.Clip, What: "source no longer decodes: " + oneLine(err)})
		return
	}
	if blobF == nil {
		return
	}
	var b [4]byte
	if _, err := blobF.ReadAt(b[:], off); err != nil {
		r.add(Problem{File: m.File, Clip: row.Clip, What: fmt.Sprintf("its code at byte %d: %v", off, err)})
		return
	}
	code := int32(binary.LittleEndian.Uint32(b[:]))
	switch {
	case code < 0 || int(code) >= len(m.Labels):
		// (verify's own pass names it)
	case m.Labels[code] != string(a.Data):
		what := fmt.Sprintf("content drift: the source's label %q at key %q differs from %q (code %d in %s)", a.Data, m.Keys, m.Labels[code], code, m.File)
		if changed != "" {
			what += " (changed since conversion: " + changed + ")"
		}
		r.add(Problem{File: s.Path, Clip: row.Clip, What: what})
	case changed != "":
		r.add(Problem{File: s.Path, Clip: row.Clip, What: "changed since conversion (" + changed + ") but gives the same label"})
	}
}
