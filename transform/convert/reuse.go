// Reuse: an incremental convert copies the rows of the clips whose
// sources did not change from the dataset it replaces, without decoding
// them again, and decodes only the rest (or a modality the dataset does
// not have yet). The output is byte for byte what a full rebuild writes.

package convert

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/manifests"
)

// previous is the dataset in --out when a run starts, as far as its rows
// can be reused: its clips by id, and for each modality of this run the
// same modality there (same name, template, keys, rate or per-clip) with
// its blob open, or none.
type previous struct {
	ds       *manifests.Dataset
	rows     map[string]int // clip id -> row
	clips    []manifests.ClipRow
	mods     []int        // per modality of the run: its index in ds, or -1
	blobs    [][]*os.File // per modality of the run: its blobs (BlobList), open
	rowBytes []int64
	where    *manifests.Where // format 2's where.npy (nil for format 1)
	raw      []byte           // its dataset.json
	// sameFrames: ds's modalities with frames are the run's (by name),
	// so that a clip it trimmed is trimmed alike when all its sources
	// are reused.
	sameFrames bool
}

// openPrevious loads the dataset in --out for reuse, or returns nil when
// there is none, it is unreadable, or it shares no modality with the run
// (older datasets without the per-clip audit columns share none).
func (j *job) openPrevious() *previous {
	if _, err := os.Lstat(filepath.Join(j.opts.Out, manifests.DatasetFile)); err != nil {
		return nil
	}
	// Rows are reused only from a dataset whose manifests, SHA256SUMS and
	// blob headers agree (a damaged manifest would have its dtypes, shapes
	// or offsets copied into the new dataset).
	d, rows, err := manifests.Vouch(j.opts.Out)
	if err != nil {
		j.prevRefused = err
		return nil
	}
	raw, err := regfile.ReadFile(filepath.Join(j.opts.Out, manifests.DatasetFile), manifests.MaxManifest)
	if err != nil {
		j.prevRefused = err
		return nil
	}
	p := &previous{ds: d, clips: rows, rows: make(map[string]int, len(rows)), mods: make([]int, len(j.opts.Modalities)),
		blobs: make([][]*os.File, len(j.opts.Modalities)), rowBytes: make([]int64, len(j.opts.Modalities)), raw: raw}
	starts, lengths := make([]int64, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		starts[i], lengths[i] = r.Start, r.Length
	}
	if p.where, err = manifests.LoadWhere(j.opts.Out, d, starts, lengths); err != nil {
		j.prevRefused = err
		return nil
	}
	for i, r := range rows {
		p.rows[r.Clip] = i
	}
	found := false
	framed := map[string]bool{}
	for k, m := range j.opts.Modalities {
		p.mods[k] = -1
		if !m.PerClip {
			framed[m.Name] = true
		}
		for i, om := range d.Modalities {
			if om.Name != m.Name {
				continue
			}
			dt, _, err := array.ParseDescr(om.DType)
			rb, err2 := array.ByteSize(om.FrameShape, dt.Size)
			// (a label's rows hold codes: reused only where its earlier
			// vocabulary begins this run's, so that a code means the
			// same label in both)
			if om.Template != m.Template || om.Keys != m.Keys || om.PerClip != m.PerClip || (!m.PerClip && om.Rate != m.Rate) || om.LabelColumn != m.Label ||
				om.IsLabel() != m.IsLabel() || (m.IsLabel() && !j.keepsCodes(k, om.Labels)) ||
				err != nil || err2 != nil || rb <= 0 || (!m.KeepDType && om.DType != array.Float16.Descr()) ||
				len(rows) == 0 || !rows[0].Sources[i].Audited {
				break
			}
			var files []*os.File
			for _, b := range om.BlobList() {
				// (a FIFO or device put there is refused, not waited on)
				f, st, err := regfile.Open(filepath.Join(j.opts.Out, b.File))
				if err != nil {
					break
				}
				files = append(files, f)
				if st.Size() != b.Size {
					break
				}
			}
			if len(files) != len(om.BlobList()) || files[len(files)-1] == nil {
				for _, f := range files {
					f.Close()
				}
				break
			}
			p.mods[k], p.blobs[k], p.rowBytes[k] = i, files, rb
			found = true
		}
	}
	if !found {
		p.close()
		return nil
	}
	p.sameFrames = d.Align == j.opts.Align
	oldFramed := 0
	for _, om := range d.Modalities {
		if !om.PerClip {
			oldFramed++
			p.sameFrames = p.sameFrames && framed[om.Name]
		}
	}
	p.sameFrames = p.sameFrames && oldFramed == len(framed)
	return p
}

// keepsCodes reports whether labels (label modality k's vocabulary in the
// previous dataset) begin this run's: its rows' codes mean the same
// labels in both.
func (j *job) keepsCodes(k int, labels []string) bool {
	v := j.labelsOf(k)
	return len(labels) <= len(v) && slices.Equal(labels, v[:len(labels)])
}

func (p *previous) close() {
	if p == nil {
		return
	}
	for _, fs := range p.blobs {
		for _, f := range fs {
			f.Close()
		}
	}
}

// reusePlan is which modalities of a clip are taken from the previous
// dataset: its row there, and a flag per modality.
type reusePlan struct {
	row   *manifests.ClipRow
	index int // the row's index in the previous dataset
	use   []bool
	all   bool
}

// planReuse returns what of clip i (at path per modality) can be reused,
// or nil. A modality is reused when the previous dataset has it with the
// clip's source unchanged (same path, size and mtime) and its rows pass
// this run's checks as recorded (dtype, NaN/Inf, overflow): otherwise it
// is decoded, which also gives the error a full rebuild would. Rows cut
// by --align trim are reused only when every modality is (with the same
// modalities and alignment), since the cut depends on all of them.
func (j *job) planReuse(i int) *reusePlan {
	id := j.clips[i]
	p := j.prev
	if p == nil {
		return nil
	}
	ri, ok := p.rows[id]
	if !ok {
		return nil
	}
	row := &p.clips[ri]
	if row.Start < 0 || row.Length < 0 || row.Trimmed < 0 || row.Length > p.ds.Frames-row.Start {
		return nil // a damaged manifest: decode
	}
	plan := &reusePlan{row: row, index: ri, use: make([]bool, len(j.opts.Modalities)), all: true}
	some := false
	for k, m := range j.opts.Modalities {
		om := p.mods[k]
		if om < 0 {
			plan.all = false
			continue
		}
		s := row.Sources[om]
		if m.Label != "" {
			// A label's row is reused when it holds the code this run
			// gives the clip (its label and the codes before it
			// unchanged); otherwise it is written anew, which costs no
			// decoding and leaves the clip's other rows reused.
			if s.Audited && s.XXH64 == xxhash.Sum64(binary.LittleEndian.AppendUint32(nil, uint32(j.codes[k][i]))) {
				plan.use[k], some = true, true
			}
			continue
		}
		path := m.Path(j.root, id)
		// The stamp vouches only with ctime and inode, and only if the
		// source had not changed just before it was read (Racy).
		if s.Path != path || !s.Stamped || !s.Audited || s.Stamp().Racy() || manifests.Stamp(path) != s.Stamp() ||
			!j.acceptsRecorded(m, s, p.ds.Modalities[om].DType) {
			plan.all = false
			continue
		}
		plan.use[k], some = true, true
	}
	switch {
	case !some:
		return nil
	case row.Trimmed > 0 && !(plan.all && p.sameFrames && (j.opts.MaxTrim < 0 || row.Trimmed <= j.opts.MaxTrim)):
		return nil
	}
	return plan
}

// acceptsRecorded reports whether rows recorded with source dtype descr,
// stats s and output dtype out are what this run would write and accept.
func (j *job) acceptsRecorded(m Modality, s manifests.ClipSource, out string) bool {
	allF16 := true
	for _, d := range strings.FieldsFunc(s.Descr, func(r rune) bool { return r == ',' || r == '+' }) { // "<f4+<f4": exp+pose
		dt, _, err := array.ParseDescr(d)
		if err != nil {
			return false
		}
		if !dt.IsFloat() && !j.opts.AllowInt && !m.KeepDType {
			return false
		}
		allF16 = allF16 && dt == array.Float16
	}
	if m.KeepDType && out == array.Float16.Descr() && !allF16 {
		return false // converted last time, kept now: other bytes
	}
	st := s.Stats
	return (st.NaN+st.InfIn == 0 || j.opts.AllowNonFinite) && (st.Overflow == 0 || j.opts.AllowOverflow)
}

// reuseMod fills mo with the rows of modality k of the plan's clip, rows
// of them, from the previous dataset: read (and checked against their
// recorded xxHash64) into memory, or, above j.streamMin, checked a piece
// at a time now and copied by the writer (copyReused). It reports false
// when the rows are not what the previous dataset recorded.
func (j *job) reuseMod(ctx context.Context, plan *reusePlan, k int, rows int64, mo *modOut) (bool, error) {
	p := j.prev
	om := &p.ds.Modalities[p.mods[k]]
	s := plan.row.Sources[p.mods[k]]
	b, first, n := p.ds.Locate(p.where, p.mods[k], plan.index, plan.row.Start, plan.row.Length)
	if n != rows {
		return false, nil
	}
	blob := om.BlobList()[b]
	dt, _, _ := array.ParseDescr(om.DType)
	mo.rows, mo.dtype, mo.frameShape = rows, dt, append([]int{}, om.FrameShape...)
	mo.sourceDescr, mo.stats, mo.xxh = s.Descr, f16.Stats(s.Stats), s.XXH64
	mo.size = rows * p.rowBytes[k]
	mo.src = s
	off := blob.DataOffset + first*p.rowBytes[k]
	// The rows are audited as they are read: a clips.parquet whose figures
	// were edited (a NaN recorded as none) would have this run accept rows
	// it refuses when it decodes them.
	audit, err := manifests.NewRowAudit(om.DType)
	if err != nil {
		return false, nil
	}
	if mo.size <= j.streamMin {
		buf := getBuf(int(mo.size))
		mo.bufs = []*[]byte{buf}
		mo.data = *buf
		if _, err := p.blobs[k][b].ReadAt(mo.data, off); err != nil || xxhash.Sum64(mo.data) != s.XXH64 {
			return false, nil
		}
		audit.Write(mo.data)
		return s.Stats.Disagrees(audit.Stats(), om.DType) == "", nil
	}
	mo.reuse = &reused{f: p.blobs[k][b], off: off}
	if err := j.copyReused(ctx, mo, func(b []byte) error { audit.Write(b); return nil }); err != nil || s.Stats.Disagrees(audit.Stats(), om.DType) != "" {
		mo.reuse = nil
		return false, nil
	}
	return true, nil
}

// reused locates a modality's rows in the previous dataset's blob.
type reused struct {
	f   *os.File
	off int64
}

// copyReused reads mo's reused rows a piece at a time, checks them
// against their recorded xxHash64 and size, and hands them to write (if
// not nil).
func (j *job) copyReused(ctx context.Context, mo *modOut, write func([]byte) error) error {
	buf := getBuf(int(min(mo.size, pieceBytes)))
	defer putBuf(buf)
	h := xxhash.New()
	for done := int64(0); done < mo.size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := (*buf)[:min(int64(len(*buf)), mo.size-done)]
		if _, err := mo.reuse.f.ReadAt(b, mo.reuse.off+done); err != nil {
			return fmt.Errorf("%w: reading the previous dataset's %s: %w", ErrInput, mo.reuse.f.Name(), err)
		}
		h.Write(b)
		if write != nil {
			if err := write(b); err != nil {
				return err
			}
		}
		done += int64(len(b))
	}
	if h.Sum64() != mo.xxh {
		return fmt.Errorf("%w: the previous dataset's %s changed during the run (run again)", ErrInput, mo.reuse.f.Name())
	}
	return nil
}
