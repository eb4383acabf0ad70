// The audit of a clip's rows as the blob holds them: what a dataset's
// recorded figures (per clip in clips.parquet, totals in dataset.json) can
// be checked against without the sources.

package manifests

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
)

// RowAudit accumulates the audit of a modality's rows, a piece at a time:
// NaN and ±Inf counts and the largest finite magnitude, as stored.
type RowAudit struct {
	dt   array.DType
	s    f16.Stats
	tail []byte // a piece's last bytes short of an element
}

// NewRowAudit audits rows of the blob dtype descr ('<f2', or a kept
// '<f4', '<f8' or integer dtype).
func NewRowAudit(descr string) (*RowAudit, error) {
	dt, _, err := array.ParseDescr(descr)
	if err != nil {
		return nil, err
	}
	return &RowAudit{dt: dt}, nil
}

// Write adds the little-endian elements in b.
func (a *RowAudit) Write(b []byte) (int, error) {
	n := len(b)
	if len(a.tail) > 0 {
		k := min(a.dt.Size-len(a.tail), len(b))
		a.tail = append(a.tail, b[:k]...)
		b = b[k:]
		if len(a.tail) < a.dt.Size {
			return n, nil
		}
		a.add(a.tail)
		a.tail = a.tail[:0]
	}
	whole := len(b) - len(b)%a.dt.Size
	a.add(b[:whole])
	a.tail = append(a.tail, b[whole:]...)
	return n, nil
}

func (a *RowAudit) add(b []byte) {
	switch a.dt {
	case array.Float16:
		f16.Audit16(b, &a.s)
	case array.Float32:
		for i := 0; i+4 <= len(b); i += 4 {
			a.value(float64(math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))))
		}
	case array.Float64:
		for i := 0; i+8 <= len(b); i += 8 {
			a.value(math.Float64frombits(binary.LittleEndian.Uint64(b[i:])))
		}
	}
	// integers and bools hold no NaN or Inf; their magnitude is not audited
}

func (a *RowAudit) value(f float64) {
	switch {
	case math.IsNaN(f):
		a.s.NaN++
	case math.IsInf(f, 0):
		a.s.InfIn++
	default:
		a.s.MaxAbs = max(a.s.MaxAbs, math.Abs(f))
	}
}

// Stats returns the audit so far: NaN, InfIn (every ±Inf stored, whether
// it was an Inf of the source or an overflow) and MaxAbs (as stored).
func (a *RowAudit) Stats() f16.Stats { return a.s }

// Disagrees returns what in the recorded stats rec (of rows stored as
// descr) the audit got of those rows contradicts, or "": the NaN count,
// the Infs (sources' Infs and overflows), and the largest magnitude, which
// rounds to the largest stored one (exactly, for kept dtypes) unless an
// overflow took it. Underflows leave no trace in the rows.
func (rec Stats) Disagrees(got f16.Stats, descr string) string {
	dt, _, err := array.ParseDescr(descr)
	if err != nil {
		return fmt.Sprintf("dtype %q", descr)
	}
	switch {
	case got.NaN != rec.NaN:
		return fmt.Sprintf("nan %d, the rows hold %d", rec.NaN, got.NaN)
	case got.InfIn != rec.InfIn+rec.Overflow:
		return fmt.Sprintf("inf_in %d + overflow %d, the rows hold %d infinities", rec.InfIn, rec.Overflow, got.InfIn)
	case !dt.IsFloat():
		return ""
	case dt != array.Float16 && rec.Overflow != 0:
		return fmt.Sprintf("overflow %d in rows kept as %s", rec.Overflow, descr)
	case dt != array.Float16 && rec.MaxAbs != got.MaxAbs:
		return fmt.Sprintf("max_abs %v, the rows' largest magnitude is %v", rec.MaxAbs, got.MaxAbs)
	case dt == array.Float16 && rec.Overflow == 0 && !(rec.MaxAbs >= 0):
		return fmt.Sprintf("max_abs %v", rec.MaxAbs)
	case dt == array.Float16 && rec.Overflow == 0 && float64(array.Float16ToFloat32(f16.Float64ToBits(rec.MaxAbs))) != got.MaxAbs:
		return fmt.Sprintf("max_abs %v (float16 %v), the rows' largest magnitude is %v", rec.MaxAbs, array.Float16ToFloat32(f16.Float64ToBits(rec.MaxAbs)), got.MaxAbs)
	}
	return ""
}
