// Clip: one clip's sources decoded, checked, aligned and converted (by a
// worker), whole or, for a large .npy source, a piece at a time.

package convert

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/manifests"
)

// clipOut is one converted clip, ready to append.
type clipOut struct {
	index   int
	length  int64 // clip frames kept
	trimmed int64
	mods    []modOut
	err     error // the clip cannot be used (bad input)
	cost    int64 // budget held until written
	bytesIn int64
	journal []byte // the clip's journal record, encoded by the worker
	reused  int    // modalities taken from the previous dataset
}

// modOut is one modality of a clipOut.
type modOut struct {
	data        []byte    // converted rows, C order little-endian
	bufs        []*[]byte // data's buffers (of getBuf; data may alias the source's)
	rows        int64
	dtype       array.DType // of data
	frameShape  []int
	sourceDescr string
	xxh         uint64
	size        int64   // bytes of converted rows
	stream      bool    // data is nil: the writer reads the source again (see processClip)
	reuse       *reused // data is nil: the writer copies the rows from the previous dataset
	ref         *rowRef // data is nil: the rows stay where they are (convert --segments)
	stats       f16.Stats
	src         manifests.ClipSource
	// label: a pickle key's label, read by the worker; the writer gives
	// it its code (labelCodes) and fills data and the rest.
	label string
}

func (c *clipOut) release() {
	for i := range c.mods {
		for _, b := range c.mods[i].bufs {
			putBuf(b)
		}
		c.mods[i].bufs, c.mods[i].data = nil, nil
	}
}

// processClip decodes, checks, aligns and converts every modality of one
// clip. Errors are returned in clipOut.err and name the clip, the
// modality and the file. A .npy source larger than j.streamMin is not
// loaded: it is read and converted a piece at a time, here to check it
// and compute its hash and stats, and again by the writer (writeStream),
// so that a clip larger than memory takes only a few pieces of it.
func (j *job) processClip(ctx context.Context, i int) *clipOut {
	if plan := j.planReuse(i); plan != nil {
		if out := j.convertClip(ctx, i, plan); out != nil {
			return out
		}
	}
	return j.convertClip(ctx, i, nil)
}

// convertClip is processClip, with the modalities plan says taken from
// the previous dataset (see planReuse) rather than decoded; it returns
// nil when the plan cannot be followed (the clip's length would differ
// from the reused rows', or they are not what was recorded), and the
// clip is then decoded whole.
func (j *job) convertClip(ctx context.Context, i int, plan *reusePlan) *clipOut {
	id := j.clips[i]
	out := &clipOut{index: i, mods: make([]modOut, len(j.opts.Modalities))}
	reused := func(k int) bool { return plan != nil && plan.use[k] }
	rowsOf := make([]int64, len(j.opts.Modalities)) // source rows, per modality
	arrays := make([]*array.Array, len(j.opts.Modalities))
	srcBufs := make([][]*[]byte, len(j.opts.Modalities)) // of getBuf, per modality
	streams := make([]*formats.NPYRows, len(j.opts.Modalities))
	defer func() {
		for _, bs := range srcBufs {
			for _, b := range bs {
				putBuf(b)
			}
		}
		for _, s := range streams {
			if s != nil {
				s.Close()
			}
		}
	}()
	fail := func(m Modality, path string, err error) *clipOut {
		out.release()
		where := fmt.Sprintf("clip %q: modality %q", id, m.Name)
		if m.Keys != "" {
			where += fmt.Sprintf(" (keys %q)", m.Keys)
		}
		if path != "" {
			out.err = fmt.Errorf("%w: %s: %s: %w", ErrInput, path, where, err)
		} else {
			out.err = fmt.Errorf("%w: %s: %w", ErrInput, where, err)
		}
		return out
	}
	for k, m := range j.opts.Modalities {
		if reused(k) {
			// Unchanged and trimmed by nothing (see planReuse): its
			// recorded rows are the source's.
			rowsOf[k] = plan.row.Length * int64(m.Rate)
			continue
		}
		if m.Label != "" {
			// The clip list's value, as its int32 code: no file.
			out.mods[k].sourceDescr, rowsOf[k] = manifests.LabelDType, 1
			fillLabel(&out.mods[k], j.codes[k][i])
			continue
		}
		path := m.Path(j.root, id)
		var a *array.Array
		var info fs.FileInfo
		var err error
		above := int64(-1) // a .npy source larger than this is streamed
		if m.Keys == "" && !m.PerClip {
			above = j.streamMin
		}
		bufFor := func(size int64) *[]byte {
			b := getBuf(int(size))
			srcBufs[k] = append(srcBufs[k], b)
			return b
		}
		keys := m.Keys
		if m.LabelKey {
			keys = formats.LabelKeys(m.Keys)
		}
		if a, info, streams[k], err = formats.LoadOrRows(&j.dirs, path, keys, bufFor, above); err != nil {
			return fail(m, "", err)
		}
		if streams[k] != nil {
			a, info = streams[k].Array(), streams[k].Info
		}
		out.bytesIn += info.Size()
		if m.LabelKey {
			// A str (or int) at the key: coded by the writer (labelCodes).
			if err := manifests.CheckLabel(string(a.Data)); err != nil {
				return fail(m, path, err)
			}
			mo := &out.mods[k]
			st := manifests.StampOf(path, info).SettledAt(formats.ReadBegan(info).UnixNano())
			mo.src = manifests.ClipSource{Path: path, Size: st.Size, MtimeNS: st.MtimeNS, CtimeNS: st.CtimeNS, Ino: st.Ino, Stamped: true}
			mo.label, mo.sourceDescr, mo.frameShape, rowsOf[k] = string(a.Data), manifests.LabelDType, []int{}, 1
			continue
		}
		switch {
		case m.PerClip && slices.Contains(a.Shape, 0):
			return fail(m, path, fmt.Errorf("value is %s: it holds no values (an axis of length 0)", a))
		case m.PerClip:
		case len(a.Shape) == 0:
			return fail(m, path, fmt.Errorf("array is 0-d (%s), one value, but clips need a time axis [T, ...]; for one value per clip, declare the modality %s@clip=...", a, m.Name))
		case slices.Contains(a.FrameShape(), 0):
			return fail(m, path, fmt.Errorf("array is %s: its frames hold no values (an axis of length 0 after the time axis)", a))
		case a.Rows()%m.Rate != 0 && j.opts.Align != "trim":
			return fail(m, path, fmt.Errorf("%d rows is not a multiple of rate %d", a.Rows(), m.Rate))
		}
		if !a.DType.IsFloat() && !j.opts.AllowInt && !m.KeepDType {
			return fail(m, path, fmt.Errorf("array is %s, an integer/bool array; pass --allow-int to convert it to float16, or --keep-dtype %s to keep it", a, m.Name))
		}
		if m.PerClip {
			// One row: the whole value, whatever its shape.
			a = a.OneRow()
		}
		arrays[k], rowsOf[k] = a, int64(a.Rows())
		st := manifests.StampOf(path, info).SettledAt(formats.ReadBegan(info).UnixNano())
		out.mods[k].src = manifests.ClipSource{Path: path, Size: st.Size, MtimeNS: st.MtimeNS, CtimeNS: st.CtimeNS, Ino: st.Ino, Stamped: true}
		out.mods[k].sourceDescr = a.SourceDescr
		out.mods[k].frameShape = a.FrameShape()
	}

	// Alignment, in clip frames.
	length := int64(math.MaxInt64)
	var longest int64
	for k, rows := range rowsOf {
		if j.opts.Modalities[k].PerClip {
			continue
		}
		r := int64(j.opts.Modalities[k].Rate)
		length = min(length, rows/r)
		longest = max(longest, (rows+r-1)/r)
	}
	if plan != nil {
		switch {
		case plan.all && plan.row.Trimmed > 0:
			// Every source as it was: cut as it was (see planReuse).
			length, longest = plan.row.Length, plan.row.Length+plan.row.Trimmed
		case length != plan.row.Length, length != longest && (j.opts.Align != "trim" || longest-length > j.opts.MaxTrim && j.opts.MaxTrim >= 0):
			// A changed source changes the clip's length (the reused rows
			// would be cut otherwise than they were), or makes it bad
			// input: decoded whole, it gets a full rebuild's error.
			out.release()
			return nil
		}
	}
	within := j.opts.MaxTrim < 0 || longest-length <= j.opts.MaxTrim
	if length != longest && (j.opts.Align != "trim" || !within) {
		desc, vector := "", ""
		for k, a := range arrays {
			m := j.opts.Modalities[k]
			if m.PerClip {
				continue
			}
			desc += fmt.Sprintf(" %s=%d", m.Name, a.Rows())
			if m.Rate != 1 {
				desc += fmt.Sprintf("(@%d)", m.Rate)
			}
			if len(a.Shape) == 1 && vector == "" {
				vector = fmt.Sprintf("; if %s (%s) holds one vector per clip rather than a value per frame, declare it %s@clip=...", m.Name, a, m.Name)
			}
		}
		out.release()
		var hint string
		switch {
		case j.opts.Align != "trim" && within:
			hint = "use --align trim to cut to the shortest"
		case j.opts.Align != "trim":
			hint = fmt.Sprintf("more than trimming would cut (--max-trim %d): check the keys and the rates (@RATE) of the modalities", j.opts.MaxTrim)
		default:
			hint = fmt.Sprintf("trimming would cut %d frames, more than --max-trim %d: check the keys and the rates (@RATE) of the modalities, or raise --max-trim", longest-length, j.opts.MaxTrim)
		}
		out.err = fmt.Errorf("%w: clip %q: modalities disagree on length by %d frames (rows:%s); %s%s", ErrInput, id, longest-length, desc, hint, vector)
		return out
	}
	out.length, out.trimmed = length, longest-length

	for k, a := range arrays {
		m := j.opts.Modalities[k]
		mo := &out.mods[k]
		rows := length * int64(m.Rate)
		if m.PerClip {
			rows = 1
		}
		if reused(k) && j.segmented && !j.opts.Compact { // (compacting: copied into the new segment, below)
			if !j.refMod(plan, k, rows, mo) {
				out.release()
				return nil
			}
			out.reused++
			continue
		}
		if reused(k) {
			ok, err := j.reuseMod(ctx, plan, k, rows, mo)
			if err != nil || !ok {
				out.release()
				return nil
			}
			out.bytesIn += mo.size
			out.cost += int64(len(mo.data))
			out.reused++
			continue
		}
		if m.IsLabel() {
			continue // (filled above, or a pickle key's by the writer: labelCodes)
		}
		frameElems := 1
		for _, d := range a.FrameShape() {
			frameElems *= d
		}
		mo.rows = rows
		mo.dtype = array.Float16
		if m.KeepDType {
			mo.dtype = a.DType
		}
		var c converted
		var err error
		if streams[k] != nil {
			mo.stream = true
			c, err = j.convertStream(ctx, streams[k], rows, m.KeepDType, nil)
		} else if src := a.Data[:rows*int64(frameElems)*int64(a.DType.Size)]; a.DType == array.Float16 {
			// float16 to float16 is a checked copy: the rows are written
			// from the source's own buffer, which the clip now holds.
			c = audit16(src, frameElems)
			mo.data, mo.bufs, srcBufs[k] = src, srcBufs[k], nil
		} else {
			b := getBuf(int(rows) * frameElems * mo.dtype.Size)
			mo.bufs = []*[]byte{b}
			c, err = convertPiece(*b, src, a.DType, m.KeepDType, frameElems, 0)
			mo.data = *b
		}
		if err != nil {
			return fail(m, mo.src.Path, err)
		}
		mo.stats, mo.xxh, mo.size = c.stats, c.xxh, c.size
		if err := j.checkStats(m, c); err != nil {
			return fail(m, mo.src.Path, err)
		}
		mo.src.XXH64 = mo.xxh
		mo.src.Audited, mo.src.Descr, mo.src.Stats = true, mo.sourceDescr, manifests.Stats(mo.stats)
		out.cost += int64(len(mo.data))
	}
	if !j.segmented { // (a segmented run is not resumed: no journal records)
		out.journal = out.record(id)
	}
	return out
}

// labelDType is a label modality's dtype (manifests.LabelDType).
var labelDType, _, _ = array.ParseDescr(manifests.LabelDType)

// converted is what converting a modality of a clip found: the stats, the
// converted bytes' xxHash64 and size, and the first rows (clip rows, -1 if
// none) holding a NaN or ±Inf and a value that overflows float16.
type converted struct {
	stats                  f16.Stats
	xxh                    uint64
	size                   int64
	firstBad, firstOverflw int64
}

// audit16 is convertPiece for float16 rows, which are written as they
// are: their audit and hash.
func audit16(src []byte, frameElems int) converted {
	c := converted{firstBad: -1, firstOverflw: -1, size: int64(len(src))}
	f16.Audit16(src, &c.stats)
	if c.stats.NaN+c.stats.InfIn > 0 {
		c.firstBad = int64(firstRow(src, array.Float16, frameElems, isNonFinite))
	}
	c.xxh = xxhash.Sum64(src)
	return c
}

// checkStats refuses non-finite values and float16 overflow unless
// allowed.
func (j *job) checkStats(m Modality, c converted) error {
	st := c.stats
	if st.NaN+st.InfIn > 0 && !j.opts.AllowNonFinite {
		return fmt.Errorf("%d NaN and %d infinite values, first at row %d (pass --allow-nonfinite to keep them)",
			st.NaN, st.InfIn, c.firstBad)
	}
	if st.Overflow > 0 && !j.opts.AllowOverflow {
		return fmt.Errorf("%d finite values overflow float16 to ±Inf (|x| >= 65520; largest %g), first at row %d (pass --allow-overflow, or --keep-dtype %s)",
			st.Overflow, st.MaxAbs, c.firstOverflw, m.Name)
	}
	return nil
}

// record encodes the journal record of a converted clip (here, in the
// worker, rather than in the writer that appends clips in order).
func (c *clipOut) record(id string) []byte {
	rec := journalRecord{Index: c.index, Clip: id, Length: c.length, Trimmed: c.trimmed, Mods: make([]journalMod, len(c.mods))}
	for k := range c.mods {
		mo := &c.mods[k]
		rec.Mods[k] = journalMod{
			XXH64: fmt.Sprintf("%016x", mo.xxh), Path: mo.src.Path, Size: mo.src.Size, MtimeNS: mo.src.MtimeNS, CtimeNS: mo.src.CtimeNS, Ino: mo.src.Ino,
			Rows: mo.rows, DType: mo.dtype.Descr(), SourceDescr: mo.sourceDescr, FrameShape: mo.frameShape,
			Stats: encodeStats(manifests.Stats(mo.stats)), Label: mo.label,
		}
	}
	return appendRecord(nil, &rec)
}

func isNonFinite(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }

func overflows(f float64) bool { return !isNonFinite(f) && math.Abs(f) >= 65520 }

// firstRow returns the row of the first element for which bad is true
// (for error messages only), or -1.
func firstRow(src []byte, dt array.DType, frameElems int, bad func(float64) bool) int {
	n := len(src) / dt.Size
	for i := 0; i < n; i++ {
		var f float64
		p := src[i*dt.Size:]
		switch dt {
		case array.Float16:
			f = float64(array.Float16ToFloat32(uint16(p[0]) | uint16(p[1])<<8))
		case array.Float32:
			f = float64(math.Float32frombits(uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24))
		case array.Float64:
			var u uint64
			for b := 7; b >= 0; b-- {
				u = u<<8 | uint64(p[b])
			}
			f = math.Float64frombits(u)
		default:
			var ok bool
			if f, ok = f16.IntValue(p, dt); !ok {
				return -1
			}
		}
		if bad(f) {
			if frameElems == 0 {
				return 0
			}
			return i / frameElems
		}
	}
	return -1
}
