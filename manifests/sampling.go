// The sample list an epochs manifest implies: derived from (seed, epoch)
// and the dataset's clip lengths alone (docs/FORMAT.md), by shuffle when
// it writes an epoch and by verify when it checks one.

package manifests

import (
	"fmt"
	"math/rand/v2"
)

// Sampling configures how windows are drawn from each clip.
type Sampling struct {
	Window  int    // W: clip frames per sample
	Mode    string // "tile" or "random"
	PerClip int    // K: samples per clip per epoch (random)
	Short   string // clips shorter than W: "skip" or "pad"
}

// Sample is one window: the clip's index in the dataset, its first clip
// frame (relative to the clip), and how many of its W frames are real
// (the rest, for a padded short clip, are zeros).
type Sample struct {
	Clip  int64
	Start int64
	Valid int64
}

// Check validates the sampling options.
func (s Sampling) Check() error {
	if s.Window < 1 {
		return fmt.Errorf("--window %d: want >= 1", s.Window)
	}
	switch s.Mode {
	case "tile":
		if s.PerClip != 0 {
			return fmt.Errorf("--per-clip %d: only with --sampling random (tile takes every window of a clip once, from a random offset)", s.PerClip)
		}
	case "random":
		if s.PerClip < 1 {
			return fmt.Errorf("--per-clip %d: want >= 1 with --sampling random", s.PerClip)
		}
	default:
		return fmt.Errorf("--sampling %q: want tile or random", s.Mode)
	}
	if s.Short != "skip" && s.Short != "pad" {
		return fmt.Errorf("--short %q: want skip or pad", s.Short)
	}
	return nil
}

// RNG returns the generator of epoch e: math/rand/v2's PCG seeded with
// (seed, e).
func RNG(seed uint64, epoch int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(epoch)))
}

// Samples returns the samples of one epoch in their shuffled order. The
// procedure (documented in docs/FORMAT.md, and what verify re-derives):
//
//  1. r := RNG(seed, epoch).
//  2. For each clip i in dataset order, with length L:
//     - L < W: with short=pad, one sample (i, 0, L); with skip, none. No
//     draw is made.
//     - tile: o := r.IntN(min(W, L-W+1)); samples (i, o+k*W, W) for
//     k = 0, 1, ... while o+k*W+W <= L.
//     - random: K times s := r.IntN(L-W+1); sample (i, s, W).
//  3. r.Shuffle over the whole list (Fisher-Yates, math/rand/v2).
func Samples(lengths []int64, s Sampling, seed uint64, epoch int) []Sample {
	return samplesFrom(RNG(seed, epoch), lengths, s)
}

// newPCGRand is RNG with a stream of its own.
func newPCGRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// samplesFrom is Samples' procedure, drawing from r.
func samplesFrom(r *rand.Rand, lengths []int64, s Sampling) []Sample {
	w := int64(s.Window)
	var out []Sample
	for i, l := range lengths {
		if l < w {
			if s.Short == "pad" && l > 0 {
				out = append(out, Sample{int64(i), 0, l})
			}
			continue
		}
		switch s.Mode {
		case "tile":
			o := r.Int64N(min(w, l-w+1))
			for st := o; st+w <= l; st += w {
				out = append(out, Sample{int64(i), st, w})
			}
		case "random":
			for k := 0; k < s.PerClip; k++ {
				out = append(out, Sample{int64(i), r.Int64N(l - w + 1), w})
			}
		}
	}
	r.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

// CountSamples returns len(Samples(lengths, s, seed, epoch)) without
// making the list: random sampling is counted arithmetically, tile
// sampling makes its one draw per clip and keeps nothing. It costs
// O(clips), whatever the number of samples.
func CountSamples(lengths []int64, s Sampling, seed uint64, epoch int) int64 {
	return countFrom(RNG(seed, epoch), lengths, s)
}

func countFrom(r *rand.Rand, lengths []int64, s Sampling) int64 {
	w := int64(s.Window)
	var n int64
	for _, l := range lengths {
		if l < w {
			if s.Short == "pad" && l > 0 {
				n++
			}
			continue
		}
		switch s.Mode {
		case "tile":
			o := r.Int64N(min(w, l-w+1))
			n += (l - o) / w
		case "random":
			n += int64(s.PerClip)
		}
	}
	return n
}
