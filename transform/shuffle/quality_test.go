package shuffle_test

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// TestMeasure: clip order, reversed order and a uniform shuffle give the
// figures they must.
func TestMeasure(t *testing.T) {
	lengths := randomLengths(300, 2)
	s := manifests.Sampling{Window: 10, Mode: "tile", Short: "skip"}
	shuffled := manifests.Samples(lengths, s, 1, 0)
	inOrder := slices.Clone(shuffled)
	slices.SortFunc(inOrder, func(a, b manifests.Sample) int {
		return cmp.Or(cmp.Compare(a.Clip, b.Clip), cmp.Compare(a.Start, b.Start))
	})
	q := shuffle.Measure(inOrder, 16)
	if q.Spearman != 1 || q.MeanDisplacement != 0 || q.SameClipNeighbours < 0.8 {
		t.Errorf("clip order: %+v", q)
	}
	rev := slices.Clone(inOrder)
	slices.Reverse(rev)
	if q := shuffle.Measure(rev, 16); math.Abs(q.Spearman+1) > 1e-9 {
		t.Errorf("reversed: %+v", q)
	}
	q = shuffle.Measure(shuffled, 16)
	if math.Abs(q.Spearman) > 0.1 || math.Abs(q.MeanDisplacement-1.0/3) > 0.03 || q.DistinctClipsMean < 15 || q.SameClipNeighbours > 0.05 {
		t.Errorf("shuffled: %+v", q)
	}
}

func randomLengths(n int, seed uint64) []int64 {
	r := rand.New(rand.NewPCG(seed, 1))
	l := make([]int64, n)
	for i := range l {
		l[i] = r.Int64N(200)
	}
	return l
}
