package inspect

import (
	"math"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

// TestUniformExact (#64.5): the uniform shuffle's reference is exact, as
// a shuffle draws (without replacement): against every batch of 2 of 6
// samples of 3 clips (3, 2 and 1 samples) enumerated, and every
// neighbouring pair; with replacement it would say 1.611, not 1.733.
func TestUniformExact(t *testing.T) {
	clips := []int64{0, 0, 0, 1, 1, 2}
	var order []manifests.Sample
	for _, c := range clips {
		order = append(order, manifests.Sample{Clip: c})
	}
	var distinct, pairs, same, batches float64
	for i := range clips {
		for j := i + 1; j < len(clips); j++ {
			batches++
			if clips[i] == clips[j] {
				distinct++
			} else {
				distinct += 2
			}
		}
		for j := range clips {
			if j != i {
				pairs++
				if clips[i] == clips[j] {
					same++
				}
			}
		}
	}
	d, n := uniform(order, 2)
	if math.Abs(d-distinct/batches) > 1e-12 || math.Abs(n-same/pairs) > 1e-12 {
		t.Fatalf("uniform: %v distinct, %v neighbours; enumerated %v, %v", d, n, distinct/batches, same/pairs)
	}
	if d, _ := uniform(order, 10); d != 3 {
		t.Fatalf("a batch larger than the samples holds every clip: %v", d)
	}
}
