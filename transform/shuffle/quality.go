// Quality: how far an epoch's order is from clip order, measured (the
// same figures as python/clipshard/quality.py).

package shuffle

import (
	"math"
	"slices"

	"github.com/clipshard/clipshard/manifests"
)

// Quality describes how well an order of samples is shuffled.
type Quality struct {
	Samples int `json:"samples"`
	Batch   int `json:"batch"`
	// Distinct clips in each batch of Batch consecutive samples (whole
	// batches only): mean and least.
	DistinctClipsMean float64 `json:"distinct_clips_mean"`
	DistinctClipsMin  int     `json:"distinct_clips_min"`
	// The share of neighbouring samples from the same clip.
	SameClipNeighbours float64 `json:"same_clip_neighbours"`
	// Mean |position - position in clip order| over the sample count
	// (clip order: by clip, then start; about 1/3 for a uniform shuffle).
	MeanDisplacement float64 `json:"mean_displacement"`
	// Spearman's rank correlation of position and clip order (about 0 for
	// a uniform shuffle, 1 in clip order).
	Spearman float64 `json:"spearman"`
	// Sources (a mixed epoch): each source's share per whole batch.
	Sources []SourceShare `json:"sources,omitempty"`
}

// SourceShare is one source's share of the batches of a mixed epoch.
type SourceShare struct {
	Name      string  `json:"name"`
	Share     float64 `json:"share"`      // of the epoch: its count over the epoch's samples
	MeanShare float64 `json:"mean_share"` // over the whole batches
	// WorstDeviation is the largest |samples of it in a batch - Share *
	// Batch| over the whole batches, in samples.
	WorstDeviation float64 `json:"worst_deviation"`
}

// MeasureSources adds each source's share per whole batch to q; srcOf
// gives a sample's source.
func MeasureSources(q *Quality, s []manifests.Sample, batch int, names []string, counts []int64, srcOf func(int64) int) {
	n := len(s)
	for i, name := range names {
		sh := SourceShare{Name: name}
		if n > 0 {
			sh.Share = float64(counts[i]) / float64(n)
		}
		q.Sources = append(q.Sources, sh)
	}
	whole := n / max(1, batch)
	if whole == 0 || batch < 1 {
		return
	}
	per := make([]int, len(names))
	sum := make([]float64, len(names))
	for b := 0; b < whole; b++ {
		clear(per)
		for _, smp := range s[b*batch : (b+1)*batch] {
			per[srcOf(smp.Clip)]++
		}
		for i := range names {
			sum[i] += float64(per[i])
			d := math.Abs(float64(per[i]) - q.Sources[i].Share*float64(batch))
			q.Sources[i].WorstDeviation = max(q.Sources[i].WorstDeviation, d)
		}
	}
	for i := range names {
		q.Sources[i].MeanShare = sum[i] / float64(whole*batch)
	}
}

// Measure measures the order s with batches of batch samples.
func Measure(s []manifests.Sample, batch int) Quality {
	n := len(s)
	q := Quality{Samples: n, Batch: batch}
	if n == 0 || batch < 1 {
		return q
	}
	// Distinct clips per whole batch.
	whole := n / batch
	if whole > 0 {
		q.DistinctClipsMin = math.MaxInt
		clips := make([]int64, batch)
		var sum int
		for b := 0; b < whole; b++ {
			for i := range clips {
				clips[i] = s[b*batch+i].Clip
			}
			slices.Sort(clips)
			d := 1
			for i := 1; i < batch; i++ {
				if clips[i] != clips[i-1] {
					d++
				}
			}
			sum += d
			q.DistinctClipsMin = min(q.DistinctClipsMin, d)
		}
		q.DistinctClipsMean = float64(sum) / float64(whole)
	}
	same := 0
	for i := 1; i < n; i++ {
		if s[i].Clip == s[i-1].Clip {
			same++
		}
	}
	if n > 1 {
		q.SameClipNeighbours = float64(same) / float64(n-1)
	}
	if n > math.MaxInt32 {
		return q // (an epoch this size does not fit a budget anyway)
	}
	// Clip-order positions: by clip, then start, then position (stable).
	ord := make([]int32, n)
	for i := range ord {
		ord[i] = int32(i)
	}
	slices.SortStableFunc(ord, func(a, b int32) int {
		x, y := s[a], s[b]
		switch {
		case x.Clip != y.Clip:
			return cmpInt(x.Clip, y.Clip)
		default:
			return cmpInt(x.Start, y.Start)
		}
	})
	var disp, d2 float64
	for k, i := range ord {
		d := float64(int64(i) - int64(k))
		disp += math.Abs(d)
		d2 += d * d
	}
	q.MeanDisplacement = disp / float64(n) / float64(n)
	if n > 1 {
		fn := float64(n)
		q.Spearman = 1 - 6*d2/(fn*(fn*fn-1))
	}
	return q
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
