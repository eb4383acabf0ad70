// One clip's rows: per feature mean, std, min, max and its NaN positions.

package inspect

import (
	"fmt"
	"math"

	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
)

// ClipReport is one clip's rows per modality.
type ClipReport struct {
	Clip       string          `json:"clip"`
	Row        int             `json:"row"`
	Start      int64           `json:"start"`
	Frames     int64           `json:"frames"`
	Modalities []FeatureReport `json:"modalities"`
}

// FeatureReport is per-feature statistics of some rows of a modality.
type FeatureReport struct {
	Name string `json:"name"`
	Rows int64  `json:"rows"`
	// Mean and Std are of the finite values; Min and Max of the values
	// that are not NaN (an all-Inf feature's are ±Inf). A figure of no
	// values is NaN: null in JSON, like ±Inf (nan and inf count them).
	Mean []ui.Float `json:"mean"`
	Std  []ui.Float `json:"std"`
	Min  []ui.Float `json:"min"`
	Max  []ui.Float `json:"max"`
	// NaN counts and the first NaN positions as [row, feature].
	NaN      int64      `json:"nan"`
	NaNAt    [][2]int64 `json:"nan_at"`
	Infinite int64      `json:"inf"`
}

func clipReport(dir string, d *manifests.Dataset, wh *manifests.Where, i int, id string, start, length int64, open Opener) (*ClipReport, error) {
	c := &ClipReport{Clip: id, Row: i, Start: start, Frames: length}
	for k, m := range d.Modalities {
		b, first, n := d.Locate(wh, k, i, start, length)
		bl := m.BlobList()[b]
		blob, err := manifests.Join(dir, bl.File)
		if err != nil {
			return nil, err
		}
		fr, err := featureStats(blob, m.Name, m.DType, m.FrameShape, bl.DataOffset, first, n, open)
		if err != nil {
			return nil, err
		}
		c.Modalities = append(c.Modalities, *fr)
	}
	return c, nil
}

// featureStats streams rows [first, first+n) of a .npy blob or shard in
// pieces of at most 8 MiB, with running per-feature figures.
func featureStats(path, name, descr string, frame []int, offset, first, n int64, open Opener) (*FeatureReport, error) {
	dec, size, err := decoder(descr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	per := 1
	for _, x := range frame {
		per *= x
	}
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &FeatureReport{Name: name, Rows: n, Mean: make([]ui.Float, per), Std: make([]ui.Float, per), Min: make([]ui.Float, per),
		Max: make([]ui.Float, per), NaNAt: [][2]int64{}}
	mean, lo, hi := make([]float64, per), make([]float64, per), make([]float64, per)
	for j := range lo {
		lo[j], hi[j] = math.Inf(1), math.Inf(-1)
	}
	seen := make([]bool, per) // a value that is not NaN
	count := make([]float64, per)
	sq := make([]float64, per)
	rowBytes := int64(per * size)
	step := max(1, (8<<20)/max(1, rowBytes))
	for at := int64(0); at < n && rowBytes > 0; at += step {
		k := min(step, n-at)
		buf := make([]byte, k*rowBytes)
		if _, err := f.ReadAt(buf, offset+(first+at)*rowBytes); err != nil {
			return nil, fmt.Errorf("%s: rows %d..%d: %w", path, first+at, first+at+k, err)
		}
		for row := int64(0); row < k; row++ {
			for j := 0; j < per; j++ {
				v := dec(buf, int(row)*per+j)
				switch {
				case math.IsNaN(v):
					r.NaN++
					if len(r.NaNAt) < 20 {
						r.NaNAt = append(r.NaNAt, [2]int64{at + row, int64(j)})
					}
					continue
				case math.IsInf(v, 0):
					r.Infinite++
					seen[j] = true
					lo[j], hi[j] = min(lo[j], v), max(hi[j], v)
					continue
				}
				seen[j] = true
				count[j]++
				mean[j] += v
				sq[j] += v * v
				lo[j], hi[j] = min(lo[j], v), max(hi[j], v)
			}
		}
	}
	for j := range mean {
		r.Mean[j], r.Std[j], r.Min[j], r.Max[j] = ui.Float(math.NaN()), ui.Float(math.NaN()), ui.Float(math.NaN()), ui.Float(math.NaN())
		if seen[j] {
			r.Min[j], r.Max[j] = ui.Float(lo[j]), ui.Float(hi[j])
		}
		if count[j] == 0 {
			continue
		}
		m := mean[j] / count[j]
		r.Mean[j] = ui.Float(m)
		r.Std[j] = ui.Float(math.Sqrt(max(0, sq[j]/count[j]-m*m)))
	}
	return r, nil
}
