// Mixing several datasets (sources) into one epoch by weight: the exact
// counts each source contributes, its own seeded draws, and the merge of
// the sources' samples into one order (docs/FORMAT.md, "Several
// sources"). Shuffle uses it to cut an epoch, verify to re-derive it.

package manifests

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"math/big"
	"math/bits"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// SourceSeed is the seed of source s's own stream: seed for the first
// source (so one source draws what a plain --dataset run draws), then
// steps of 2^64/phi.
func SourceSeed(seed uint64, s int) uint64 { return seed + uint64(s)*0x9E3779B97F4A7C15 }

// passStream is the PCG stream of pass p of an epoch's draws (pass 0 is
// the plain epoch's), and jitterStream the stream of the merge's jitter.
func passStream(epoch, p int) uint64 { return uint64(epoch) | uint64(p)<<32 }
func jitterStream(epoch int) uint64  { return uint64(epoch) | 1<<62 }

// MixWeights is the weight schedule of a mixed run: per range of epochs,
// a weight per source (exact decimals, as given). An epoch outside every
// range has no weights. Natural (no ranges) weighs each source by its own
// sample count of the epoch.
type MixWeights struct {
	EpochSamples int64         `json:"epoch_samples"` // 0: the sum of the sources' own counts
	Ranges       []WeightRange `json:"weights"`       // empty: natural
}

// WeightRange is the weights of epochs [From, To) (To 0: no end).
type WeightRange struct {
	From    int                    `json:"from"`
	To      int                    `json:"to,omitempty"` // 0 (left out): every epoch from From on
	Weights map[string]json.Number `json:"weights"`
}

// At returns the weights of epoch e in source order, nil for natural, or
// false when no range holds e.
func (w *MixWeights) At(e int, names []string) ([]json.Number, bool) {
	if len(w.Ranges) == 0 {
		return nil, true
	}
	for _, r := range w.Ranges {
		if e >= r.From && (r.To == 0 || e < r.To) {
			out := make([]json.Number, len(names))
			for i, n := range names {
				out[i] = r.Weights[n]
			}
			return out, true
		}
	}
	return nil, false
}

// Key words the schedule for an options key: one token, no spaces. Each
// weight is written by its exact value (1, 1.0 and 10e-1 are one weight),
// so that runs giving the same schedule in other words agree.
func (w *MixWeights) Key() string {
	if len(w.Ranges) == 0 {
		return fmt.Sprintf("natural/%d", w.EpochSamples)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d", w.EpochSamples)
	for _, r := range w.Ranges {
		fmt.Fprintf(&b, "/%d:%d@", r.From, r.To)
		keys := make([]string, 0, len(r.Weights))
		for k := range r.Weights {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%s", k, WeightValue(r.Weights[k]))
		}
	}
	return b.String()
}

// ParseWeights parses one --weights value, [A:B@]name=w,name=w (B may be
// left out: every epoch from A on), against the source names: every
// source needs a weight (0 leaves it out of those epochs), none other may
// be named, and the weights are decimals >= 0, not all 0.
func ParseWeights(spec string, names []string) (WeightRange, error) {
	r := WeightRange{Weights: map[string]json.Number{}}
	body := spec
	if rng, rest, ok := strings.Cut(spec, "@"); ok {
		body = rest
		a, b, ok := strings.Cut(rng, ":")
		var err1, err2 error
		r.From, err1 = strconv.Atoi(a)
		if b != "" {
			r.To, err2 = strconv.Atoi(b)
		}
		if !ok || err1 != nil || err2 != nil || r.From < 0 || (b != "" && r.To <= r.From) {
			return r, fmt.Errorf("--weights %q: the epochs before @ should be A:B (A < B) or A: (from A on)", clipText(spec))
		}
	}
	known := map[string]bool{}
	for _, n := range names {
		known[n] = true
	}
	var sum big.Rat
	for _, kv := range strings.Split(body, ",") {
		n, v, ok := strings.Cut(kv, "=")
		n, v = strings.TrimSpace(n), strings.TrimSpace(v) // spaces around names and weights are allowed
		if !ok || n == "" {
			return r, fmt.Errorf("--weights %q: %q should be NAME=WEIGHT", clipText(spec), clipText(kv))
		}
		if !known[n] {
			return r, fmt.Errorf("--weights %q: no --source is named %q (sources: %s)", clipText(spec), clipText(n), strings.Join(names, ", "))
		}
		if _, dup := r.Weights[n]; dup {
			return r, fmt.Errorf("--weights %q: %s has two weights", clipText(spec), n)
		}
		q, err := parseWeight(v)
		if err != nil {
			return r, fmt.Errorf("--weights %q: %s=%s: %w", clipText(spec), n, clipText(v), err)
		}
		sum.Add(&sum, q)
		r.Weights[n] = json.Number(v)
	}
	for _, n := range names {
		if _, ok := r.Weights[n]; !ok {
			return r, fmt.Errorf("--weights %q: no weight for source %s (give %s=0 to leave it out)", clipText(spec), n, n)
		}
	}
	if sum.Sign() == 0 {
		return r, fmt.Errorf("--weights %q: every weight is 0", clipText(spec))
	}
	return r, nil
}

// weightSyntax is a JSON number without a sign: a weight is recorded in
// epochs.json as written.
var weightSyntax = regexp.MustCompile(`^(0|[1-9][0-9]*)(\.[0-9]+)?([eE]([+-]?)([0-9]+))?$`)

// MaxWeightDigits and MaxWeightExponent bound a weight: at most 64
// digits, and an exponent within ±64. Far above any real use (a weight
// is a share, 0.125 or 3e-1), they keep its exact arithmetic cheap: a
// weight of 10^6 digits, or 1e1000000, cost seconds per epoch in shuffle
// and again in verify.
const (
	MaxWeightDigits   = 64
	MaxWeightExponent = 64
)

// parseWeight reads a weight: a decimal >= 0 (1, 0.25, 3e-1), exactly,
// within MaxWeightDigits and MaxWeightExponent.
func parseWeight(v string) (*big.Rat, error) {
	m := weightSyntax.FindStringSubmatch(v)
	if m == nil {
		return nil, fmt.Errorf("want a decimal number >= 0 (such as 1, 0.25 or 3e-1)")
	}
	if digits := len(m[1]) + max(0, len(m[2])-1); digits > MaxWeightDigits {
		return nil, fmt.Errorf("%d digits: a weight has at most %d", digits, MaxWeightDigits)
	}
	if exp := strings.TrimLeft(m[5], "0"); len(exp) > 2 || (exp != "" && mustAtoi(exp) > MaxWeightExponent) {
		return nil, fmt.Errorf("exponent %s%s: a weight's is within ±%d", m[4], m[5], MaxWeightExponent)
	}
	q, ok := new(big.Rat).SetString(v)
	if !ok || q.Sign() < 0 {
		return nil, fmt.Errorf("want a decimal number >= 0")
	}
	return q, nil
}

// clipText shortens s for an error message (a hostile value may be
// megabytes long).
func clipText(s string) string {
	if len(s) <= 80 {
		return s
	}
	return s[:60] + fmt.Sprintf("...(%d bytes)", len(s))
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// CheckWeight refuses a weight epochs.json may not hold: not a plain
// decimal >= 0 within the bounds of parseWeight.
func CheckWeight(w json.Number) error {
	_, err := parseWeight(string(w))
	return err
}

// WeightValue is w's exact value in lowest terms ("1", "1/4"), or w as
// it is if it is not a weight: two weights are the same when their
// values are.
func WeightValue(w json.Number) string {
	q, err := parseWeight(string(w))
	if err != nil {
		return string(w)
	}
	return q.RatString()
}

// SameWeights reports whether a and b hold the same weights by value.
func SameWeights(a, b []json.Number) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if WeightValue(a[i]) != WeightValue(b[i]) {
			return false
		}
	}
	return true
}

// CheckRanges refuses overlapping ranges.
func (w *MixWeights) CheckRanges() error {
	for i, a := range w.Ranges {
		for _, b := range w.Ranges[:i] {
			aEnd, bEnd := a.To, b.To
			if aEnd == 0 {
				aEnd = 1 << 30
			}
			if bEnd == 0 {
				bEnd = 1 << 30
			}
			if a.From < bEnd && b.From < aEnd {
				return fmt.Errorf("--weights: the epochs %s and %s overlap", rangeWords(a), rangeWords(b))
			}
		}
	}
	return nil
}

func rangeWords(r WeightRange) string {
	if r.To == 0 {
		return fmt.Sprintf("%d:", r.From)
	}
	return fmt.Sprintf("%d:%d", r.From, r.To)
}

// MixCounts returns the samples each source contributes to an epoch of n
// samples, by weight (nil: the natural counts are the weights), by
// largest remainder: source s gets floor(n*w_s/W), and the samples left
// go one each to the largest remainders (ties: the earlier source). The
// counts are exact and add up to n. A weight that does not parse counts
// as 0 (ParseWeights refuses it before).
func MixCounts(natural []int64, weights []json.Number, n int64) []int64 {
	ws := make([]*big.Rat, len(natural))
	total := new(big.Rat)
	for s := range natural {
		if weights == nil {
			ws[s] = new(big.Rat).SetInt64(natural[s])
		} else if q, err := parseWeight(string(weights[s])); err == nil {
			ws[s] = q
		} else {
			ws[s] = new(big.Rat)
		}
		total.Add(total, ws[s])
	}
	out := make([]int64, len(natural))
	if total.Sign() == 0 || n <= 0 {
		return out
	}
	rem := make([]*big.Rat, len(natural))
	var given int64
	for s := range natural {
		q := new(big.Rat).Mul(ws[s], new(big.Rat).SetInt64(n))
		q.Quo(q, total)
		fl := new(big.Int).Quo(q.Num(), q.Denom())
		out[s] = fl.Int64()
		given += out[s]
		rem[s] = q.Sub(q, new(big.Rat).SetInt(fl))
	}
	order := make([]int, len(natural))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return rem[order[a]].Cmp(rem[order[b]]) > 0 })
	for i := 0; given < n; i++ {
		out[order[i%len(order)]]++
		given++
	}
	return out
}

// MixSource is one source's clip lengths, in its own clip order.
type MixSource struct {
	Lengths []int64
}

// SourceSamples returns the first want samples source s draws for an
// epoch (clips numbered within the source): pass 0 is Samples(lengths,
// s, SourceSeed(seed, src), epoch); each further pass draws again (tile
// offsets, random windows and the shuffle) from stream
// epoch | pass<<32, and the passes are put one after the other. Fewer
// than one pass is thus a seeded subsample without replacement (the
// start of a shuffled list). It returns nil if the source has no
// samples.
func SourceSamples(lengths []int64, sm Sampling, seed uint64, src, epoch int, want int64) []Sample {
	if want <= 0 {
		return nil
	}
	ss := SourceSeed(seed, src)
	out := make([]Sample, 0, want)
	for p := 0; int64(len(out)) < want; p++ {
		pass := samplesFrom(newPCGRand(ss, passStream(epoch, p)), lengths, sm)
		if len(pass) == 0 {
			return nil
		}
		out = append(out, pass[:min(int64(len(pass)), want-int64(len(out)))]...)
	}
	return out
}

// MergeSources puts the sources' samples (lists[s], clips numbered within
// each source) into one order, with clip numbers made global (source s's
// clips come after those of the sources before it: clip0[s]). It is a
// stratified merge, so that every stretch of the epoch holds each source
// in its share: the j-th sample of a source of n samples gets the key
// (j + u)/n, u a jitter in [0, 1) (20 bits, from the source's stream
// PCG(SourceSeed(seed, s), epoch | 1<<62)), and the samples are taken in
// key order (ties: the earlier source). Within a source the order stays
// its own (already shuffled); one source comes out as it went in.
func MergeSources(lists [][]Sample, clip0 []int64, seed uint64, epoch int) []Sample {
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	out := make([]Sample, 0, total)
	h := &mergeHeap{}
	jit := make([]interface{ Uint64() uint64 }, len(lists))
	for s, l := range lists {
		if len(l) == 0 {
			continue
		}
		jit[s] = newPCGRand(SourceSeed(seed, s), jitterStream(epoch))
		h.items = append(h.items, mergeItem{src: s, num: jitterNum(0, jit[s].Uint64()), den: uint64(len(l))})
	}
	heap.Init(h)
	next := make([]int, len(lists))
	for h.Len() > 0 {
		it := &h.items[0]
		s := it.src
		smp := lists[s][next[s]]
		smp.Clip += clip0[s]
		out = append(out, smp)
		next[s]++
		if next[s] == len(lists[s]) {
			heap.Pop(h)
			continue
		}
		it.num = jitterNum(uint64(next[s]), jit[s].Uint64())
		heap.Fix(h, 0)
	}
	return out
}

// jitterNum is the key numerator (j + u) * 2^20 of a source's j-th
// sample, u the top 20 bits of a draw.
func jitterNum(j, draw uint64) uint64 { return j<<20 | draw>>44 }

type mergeItem struct {
	src      int
	num, den uint64 // key num / (den * 2^20)
}

type mergeHeap struct{ items []mergeItem }

func (h *mergeHeap) Len() int { return len(h.items) }
func (h *mergeHeap) Less(a, b int) bool {
	x, y := h.items[a], h.items[b]
	// x.num/x.den < y.num/y.den, exactly: x.num*y.den < y.num*x.den.
	xh, xl := bits.Mul64(x.num, y.den)
	yh, yl := bits.Mul64(y.num, x.den)
	if xh != yh {
		return xh < yh
	}
	if xl != yl {
		return xl < yl
	}
	return x.src < y.src
}
func (h *mergeHeap) Swap(a, b int) { h.items[a], h.items[b] = h.items[b], h.items[a] }
func (h *mergeHeap) Push(x any)    { h.items = append(h.items, x.(mergeItem)) }
func (h *mergeHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

// MixNatural returns each source's own sample count of an epoch (what
// one pass draws).
func MixNatural(sources []MixSource, sm Sampling, seed uint64, epoch int) []int64 {
	out := make([]int64, len(sources))
	for s, src := range sources {
		out[s] = countFrom(newPCGRand(SourceSeed(seed, s), passStream(epoch, 0)), src.Lengths, sm)
	}
	return out
}

// MixedEpoch is an epoch of a mixed run: its samples (global clip
// numbers), and per source its count, its own (natural) count, and the
// weight epochs.json records (the schedule's; natural: its own count).
// Empty is the source that has a share but no samples (-1 if none); the
// samples are nil then.
type MixedEpoch struct {
	Samples []Sample
	Counts  []int64
	Natural []int64
	Weights []json.Number
	Empty   int
}

// MixEpoch derives epoch epoch of a mixed run with the schedule's
// weights (nil: natural) and epochSamples (0: the natural counts added
// up).
func MixEpoch(sources []MixSource, sm Sampling, seed uint64, epoch int, weights []json.Number, epochSamples int64) MixedEpoch {
	m := MixedEpoch{Natural: MixNatural(sources, sm, seed, epoch), Weights: weights, Empty: -1}
	n := epochSamples
	if n == 0 {
		for _, c := range m.Natural {
			n += c
		}
	}
	if weights == nil {
		for _, c := range m.Natural {
			m.Weights = append(m.Weights, json.Number(fmt.Sprint(c)))
		}
	}
	m.Counts = MixCounts(m.Natural, weights, n)
	lists := make([][]Sample, len(sources))
	clip0 := make([]int64, len(sources))
	var c0 int64
	for s, src := range sources {
		clip0[s] = c0
		c0 += int64(len(src.Lengths))
		if m.Counts[s] > 0 && m.Natural[s] == 0 {
			m.Empty = s
			return m
		}
		lists[s] = SourceSamples(src.Lengths, sm, seed, s, epoch, m.Counts[s])
	}
	m.Samples = MergeSources(lists, clip0, seed, epoch)
	return m
}
