package convert

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/f16"
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
}

// modOut is one modality of a clipOut.
type modOut struct {
	data        []byte // converted rows, C order little-endian
	buf         *[]byte
	rows        int64
	dtype       array.DType // of data
	frameShape  []int
	sourceDescr string
	xxh         uint64
	stats       f16.Stats
	src         manifests.ClipSource
}

// bufPool recycles byte buffers of any size between clips.
var bufPool = sync.Pool{New: func() any { return new([]byte) }}

func getBuf(n int) *[]byte {
	b := bufPool.Get().(*[]byte)
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	*b = (*b)[:n]
	return b
}

func putBuf(b *[]byte) {
	if b != nil {
		bufPool.Put(b)
	}
}

func (c *clipOut) release() {
	for i := range c.mods {
		putBuf(c.mods[i].buf)
		c.mods[i].buf, c.mods[i].data = nil, nil
	}
}

// processClip decodes, checks, aligns and converts every modality of one
// clip. Errors are returned in clipOut.err and name the clip, the
// modality and the file.
func (j *job) processClip(i int) *clipOut {
	id := j.clips[i]
	out := &clipOut{index: i, mods: make([]modOut, len(j.opts.Modalities))}
	arrays := make([]*array.Array, len(j.opts.Modalities))
	srcBufs := make([]*[]byte, len(j.opts.Modalities))
	defer func() {
		for _, b := range srcBufs {
			putBuf(b)
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
		path := m.Path(j.root, id)
		b := getBuf(0)
		srcBufs[k] = b
		a, info, err := formats.LoadIntoDirs(&j.dirs, path, m.Keys, b)
		if err != nil {
			return fail(m, "", err)
		}
		out.bytesIn += info.Size()
		if len(a.Shape) == 0 {
			return fail(m, path, fmt.Errorf("array is 0-d (%s); clips need a time axis [T, ...]", a))
		}
		if slices.Contains(a.FrameShape(), 0) {
			return fail(m, path, fmt.Errorf("array is %s: its frames hold no values (an axis of length 0 after the time axis)", a))
		}
		if !a.DType.IsFloat() && !j.opts.AllowInt {
			return fail(m, path, fmt.Errorf("array is %s, an integer/bool array; pass --allow-int to convert it", a))
		}
		if a.Rows()%m.Rate != 0 && j.opts.Align != "trim" {
			return fail(m, path, fmt.Errorf("%d rows is not a multiple of rate %d", a.Rows(), m.Rate))
		}
		arrays[k] = a
		out.mods[k].src = manifests.ClipSource{Path: path, Size: info.Size(), MtimeNS: info.ModTime().UnixNano()}
		out.mods[k].sourceDescr = a.SourceDescr
		out.mods[k].frameShape = a.FrameShape()
	}

	// Alignment, in clip frames.
	length := int64(math.MaxInt64)
	var longest int64
	for k, a := range arrays {
		r := int64(j.opts.Modalities[k].Rate)
		rows := int64(a.Rows())
		length = min(length, rows/r)
		longest = max(longest, (rows+r-1)/r)
	}
	if j.opts.Align != "trim" && length != longest {
		desc := ""
		for k, a := range arrays {
			m := j.opts.Modalities[k]
			desc += fmt.Sprintf(" %s=%d", m.Name, a.Rows())
			if m.Rate != 1 {
				desc += fmt.Sprintf("(@%d)", m.Rate)
			}
		}
		out.release()
		out.err = fmt.Errorf("%w: clip %q: modalities disagree on length (rows:%s); use --align trim to cut to the shortest", ErrInput, id, desc)
		return out
	}
	out.length, out.trimmed = length, longest-length

	for k, a := range arrays {
		m := j.opts.Modalities[k]
		mo := &out.mods[k]
		rows := length * int64(m.Rate)
		frameElems := 1
		for _, d := range a.FrameShape() {
			frameElems *= d
		}
		src := a.Data[:rows*int64(frameElems)*int64(a.DType.Size)]
		mo.rows = rows
		var st f16.Stats
		if m.KeepDType {
			mo.dtype = a.DType
			mo.buf = getBuf(len(src))
			copy(*mo.buf, src)
			// Audit only: NaN/Inf counts and the largest magnitude.
			scratch := getBuf(2 * int(rows) * frameElems)
			if err := f16.Convert(*scratch, src, a.DType, &st); err != nil {
				putBuf(scratch)
				return fail(m, mo.src.Path, err)
			}
			putBuf(scratch)
			st.Overflow, st.Underflow = 0, 0
		} else {
			mo.dtype = array.Float16
			mo.buf = getBuf(2 * int(rows) * frameElems)
			if err := f16.Convert(*mo.buf, src, a.DType, &st); err != nil {
				return fail(m, mo.src.Path, err)
			}
		}
		mo.data = *mo.buf
		mo.stats = st
		if st.NaN+st.InfIn > 0 && !j.opts.AllowNonFinite {
			return fail(m, mo.src.Path, fmt.Errorf("%d NaN and %d infinite values, first at row %d (pass --allow-nonfinite to keep them)",
				st.NaN, st.InfIn, firstRow(src, a.DType, frameElems, isNonFinite)))
		}
		if st.Overflow > 0 && !j.opts.AllowOverflow {
			return fail(m, mo.src.Path, fmt.Errorf("%d finite values overflow float16 to ±Inf (|x| >= 65520; largest %g), first at row %d (pass --allow-overflow, or --keep-dtype %s)",
				st.Overflow, st.MaxAbs, firstRow(src, a.DType, frameElems, overflows), m.Name))
		}
		mo.xxh = xxhash.Sum64(mo.data)
		mo.src.XXH64 = mo.xxh
		out.cost += int64(len(mo.data))
	}
	out.journal = out.record(id)
	return out
}

// record encodes the journal record of a converted clip (here, in the
// worker, rather than in the writer that appends clips in order).
func (c *clipOut) record(id string) []byte {
	rec := journalRecord{Index: c.index, Clip: id, Length: c.length, Trimmed: c.trimmed, Mods: make([]journalMod, len(c.mods))}
	for k := range c.mods {
		mo := &c.mods[k]
		rec.Mods[k] = journalMod{
			XXH64: fmt.Sprintf("%016x", mo.xxh), Path: mo.src.Path, Size: mo.src.Size, MtimeNS: mo.src.MtimeNS,
			Rows: mo.rows, DType: mo.dtype.Descr(), SourceDescr: mo.sourceDescr, FrameShape: mo.frameShape,
			Stats: encodeStats(manifests.Stats(mo.stats)),
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
			return -1
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
