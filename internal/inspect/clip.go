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
	a, err := newFeatures(name, descr, frame)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := a.read(f, path, offset, first, n); err != nil {
		return nil, err
	}
	return a.report(), nil
}

// features accumulates per-feature figures over rows read piece by
// piece: each piece's count, mean and sum of squared deviations (two
// passes over the piece in memory), merged into the running ones (Chan
// et al.'s pairwise update: stable over billions of rows, where a sum
// of squares less the squared mean is not).
type features struct {
	r        *FeatureReport
	dec      func(b []byte, j int) float64
	per      int
	rowBytes int64
	n, mean  []float64
	m2       []float64
	lo, hi   []float64
	seen     []bool
	at       int64 // rows seen so far (the NaN positions' rows)
}

func newFeatures(name, descr string, frame []int) (*features, error) {
	dec, size, err := decoder(descr)
	if err != nil {
		return nil, err
	}
	per := 1
	for _, x := range frame {
		per *= x
	}
	a := &features{dec: dec, per: per, rowBytes: int64(per * size),
		r: &FeatureReport{Name: name, NaNAt: [][2]int64{}},
		n: make([]float64, per), mean: make([]float64, per), m2: make([]float64, per),
		lo: make([]float64, per), hi: make([]float64, per), seen: make([]bool, per)}
	for j := range a.lo {
		a.lo[j], a.hi[j] = math.Inf(1), math.Inf(-1)
	}
	return a, nil
}

// read adds rows [first, first+n) of the blob at path (f, its data at
// offset), 8 MiB at a time.
func (a *features) read(f ReaderAt, path string, offset, first, n int64) error {
	step := max(1, (8<<20)/max(1, a.rowBytes))
	for at := int64(0); at < n && a.rowBytes > 0; at += step {
		k := min(step, n-at)
		buf := make([]byte, k*a.rowBytes)
		if _, err := f.ReadAt(buf, offset+(first+at)*a.rowBytes); err != nil {
			return fmt.Errorf("%s: rows %d..%d: %w", path, first+at, first+at+k, err)
		}
		a.add(buf, k)
	}
	return nil
}

// add takes k rows (buf).
func (a *features) add(buf []byte, k int64) {
	per := a.per
	cnt, sum := make([]float64, per), make([]float64, per)
	for row := int64(0); row < k; row++ {
		for j := 0; j < per; j++ {
			v := a.dec(buf, int(row)*per+j)
			switch {
			case math.IsNaN(v):
				a.r.NaN++
				if len(a.r.NaNAt) < 20 {
					a.r.NaNAt = append(a.r.NaNAt, [2]int64{a.at + row, int64(j)})
				}
				continue
			case math.IsInf(v, 0):
				a.r.Infinite++
				a.seen[j] = true
				a.lo[j], a.hi[j] = min(a.lo[j], v), max(a.hi[j], v)
				continue
			}
			a.seen[j] = true
			cnt[j]++
			sum[j] += v
			a.lo[j], a.hi[j] = min(a.lo[j], v), max(a.hi[j], v)
		}
	}
	m2 := make([]float64, per)
	for row := int64(0); row < k; row++ {
		for j := 0; j < per; j++ {
			if v := a.dec(buf, int(row)*per+j); cnt[j] > 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
				d := v - sum[j]/cnt[j]
				m2[j] += d * d
			}
		}
	}
	for j := 0; j < per; j++ {
		if cnt[j] == 0 {
			continue
		}
		mb := sum[j] / cnt[j]
		n := a.n[j] + cnt[j]
		d := mb - a.mean[j]
		a.mean[j] += d * cnt[j] / n
		a.m2[j] += m2[j] + d*d*a.n[j]*cnt[j]/n
		a.n[j] = n
	}
	a.at += k
	a.r.Rows += k
}

// report is the figures so far (NaN where a feature had no values).
func (a *features) report() *FeatureReport {
	r := a.r
	r.Mean, r.Std, r.Min, r.Max = make([]ui.Float, a.per), make([]ui.Float, a.per), make([]ui.Float, a.per), make([]ui.Float, a.per)
	for j := range a.mean {
		r.Mean[j], r.Std[j], r.Min[j], r.Max[j] = ui.Float(math.NaN()), ui.Float(math.NaN()), ui.Float(math.NaN()), ui.Float(math.NaN())
		if a.seen[j] {
			r.Min[j], r.Max[j] = ui.Float(a.lo[j]), ui.Float(a.hi[j])
		}
		if a.n[j] > 0 {
			r.Mean[j], r.Std[j] = ui.Float(a.mean[j]), ui.Float(math.Sqrt(a.m2[j]/a.n[j]))
		}
	}
	return r
}
