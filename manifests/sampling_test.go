package manifests_test

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

func randomLengths(n int, seed uint64) []int64 {
	r := rand.New(rand.NewPCG(seed, 1))
	l := make([]int64, n)
	for i := range l {
		l[i] = r.Int64N(200)
	}
	return l
}

func TestTileRule(t *testing.T) {
	lengths := randomLengths(500, 1)
	for _, w := range []int{1, 7, 15, 64} {
		for _, short := range []string{"skip", "pad"} {
			s := manifests.Sampling{Window: w, Mode: "tile", Short: short}
			got := manifests.Samples(lengths, s, 42, 3)
			byClip := map[int64][]manifests.Sample{}
			for _, x := range got {
				byClip[x.Clip] = append(byClip[x.Clip], x)
			}
			for c, l := range lengths {
				wins := byClip[int64(c)]
				W := int64(w)
				if l < W {
					if short == "pad" && l > 0 {
						if len(wins) != 1 || wins[0].Start != 0 || wins[0].Valid != l {
							t.Fatalf("W=%d clip %d (L=%d): %v", w, c, l, wins)
						}
					} else if len(wins) != 0 {
						t.Fatalf("W=%d clip %d (L=%d) should be skipped: %v", w, c, l, wins)
					}
					continue
				}
				minStart := int64(math.MaxInt64)
				for _, x := range wins {
					minStart = min(minStart, x.Start)
				}
				o := minStart
				if o >= min(W, l-W+1) {
					t.Fatalf("W=%d clip %d: offset %d not in [0, %d)", w, c, o, min(W, l-W+1))
				}
				if want := (l - o) / W; int64(len(wins)) != want {
					t.Fatalf("W=%d clip %d (L=%d, o=%d): %d windows, want %d", w, c, l, o, len(wins), want)
				}
				for _, x := range wins {
					if (x.Start-o)%W != 0 || x.Start+W > l || x.Valid != W {
						t.Fatalf("W=%d clip %d: bad window %+v", w, c, x)
					}
				}
			}
		}
	}
}

func TestRandomMode(t *testing.T) {
	lengths := randomLengths(300, 2)
	s := manifests.Sampling{Window: 10, Mode: "random", PerClip: 3, Short: "skip"}
	got := manifests.Samples(lengths, s, 1, 0)
	n := 0
	for _, l := range lengths {
		if l >= 10 {
			n += 3
		}
	}
	if len(got) != n {
		t.Fatalf("%d samples, want %d", len(got), n)
	}
	for _, x := range got {
		if x.Start < 0 || x.Start+10 > lengths[x.Clip] {
			t.Fatalf("out of range: %+v (L=%d)", x, lengths[x.Clip])
		}
	}
}

func TestDeterministicBySeedAndEpoch(t *testing.T) {
	lengths := randomLengths(200, 3)
	s := manifests.Sampling{Window: 8, Mode: "tile", Short: "pad"}
	a := manifests.Samples(lengths, s, 9, 1)
	if b := manifests.Samples(lengths, s, 9, 1); !reflect.DeepEqual(a, b) {
		t.Fatal("same seed and epoch differ")
	}
	if c := manifests.Samples(lengths, s, 9, 2); reflect.DeepEqual(a, c) {
		t.Fatal("epochs 1 and 2 are the same")
	}
	if d := manifests.Samples(lengths, s, 10, 1); reflect.DeepEqual(a, d) {
		t.Fatal("seeds 9 and 10 are the same")
	}
}

// TestOrderNotCorrelated: the shuffled order carries no trace of clip
// order (Pearson correlation of position and clip index near 0).
func TestOrderNotCorrelated(t *testing.T) {
	lengths := make([]int64, 2000)
	for i := range lengths {
		lengths[i] = 100
	}
	got := manifests.Samples(lengths, manifests.Sampling{Window: 10, Mode: "tile", Short: "skip"}, 5, 0)
	n := float64(len(got))
	var sx, sy, sxx, syy, sxy float64
	for i, x := range got {
		fx, fy := float64(i), float64(x.Clip)
		sx, sy, sxx, syy, sxy = sx+fx, sy+fy, sxx+fx*fx, syy+fy*fy, sxy+fx*fy
	}
	r := (n*sxy - sx*sy) / math.Sqrt((n*sxx-sx*sx)*(n*syy-sy*sy))
	if math.Abs(r) > 0.03 {
		t.Fatalf("position/clip correlation %.4f over %d samples", r, len(got))
	}
	// Neighbours in the output come from different clips most of the time.
	same := 0
	for i := 1; i < len(got); i++ {
		if got[i].Clip == got[i-1].Clip {
			same++
		}
	}
	if same > len(got)/100 {
		t.Fatalf("%d of %d neighbours share a clip", same, len(got))
	}
}

// TestCountSamples: the count made without the list equals the list's
// length, for every mode, window and short rule.
func TestCountSamples(t *testing.T) {
	lengths := randomLengths(700, 5)
	for _, s := range []manifests.Sampling{
		{Window: 1, Mode: "tile", Short: "skip"}, {Window: 15, Mode: "tile", Short: "pad"},
		{Window: 64, Mode: "tile", Short: "skip"}, {Window: 250, Mode: "tile", Short: "pad"},
		{Window: 15, Mode: "random", PerClip: 3, Short: "skip"}, {Window: 40, Mode: "random", PerClip: 1, Short: "pad"},
	} {
		for epoch := range 3 {
			if got, want := manifests.CountSamples(lengths, s, 9, epoch), int64(len(manifests.Samples(lengths, s, 9, epoch))); got != want {
				t.Errorf("%+v epoch %d: counted %d, the list has %d", s, epoch, got, want)
			}
		}
	}
}
