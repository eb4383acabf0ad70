// What an epochs folder holds: each epoch's size, shuffle quality and
// sources' shares, overall and per tenth.

package inspect

import (
	"encoding/binary"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"

	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// -- epochs ---------------------------------------------------------------

// EpochsReport is what inspect shows of an epochs folder.
type EpochsReport struct {
	Kind    string `json:"kind"` // "epochs"
	Dir     string `json:"dir"`
	Dataset string `json:"dataset,omitempty"`
	// Sources of a mixed folder (epochs format version 3).
	Sources []manifests.SourceRef `json:"sources,omitempty"`
	Seed    uint64                `json:"seed"`
	Window  int                   `json:"window"`
	Batch   int                   `json:"batch"`
	Epochs  []EpochReport         `json:"epochs"`
	Sample  *SampleReport         `json:"sample,omitempty"`
	Names   []string              `json:"modalities"`
	Shapes  map[string]any        `json:"sample_shapes"`
	// ShortClips: the clips of the dataset (every source) shorter than
	// the window, which Short ("skip" or "pad") left out or padded; -1
	// when the dataset is not there to count them.
	ShortClips int    `json:"short_clips"`
	Short      string `json:"short"`
}

// EpochReport is one epoch's figures, and its shuffle quality per tenth.
type EpochReport struct {
	Epoch   int             `json:"epoch"`
	Samples int64           `json:"samples"`
	Shards  int             `json:"shards"`
	Bytes   int64           `json:"bytes"`
	Quality shuffle.Quality `json:"quality"`
	// Measured is how many samples the quality figures were measured on
	// (all of them, unless the epoch's order is larger than --mem).
	Measured int64             `json:"measured_samples"`
	Tenths   []shuffle.Quality `json:"quality_by_tenth"`
	// Mixed epochs: the samples and weight of each source (the shares per
	// batch are in Quality.Sources, and per tenth in Tenths).
	Counts  map[string]int64  `json:"source_counts,omitempty"`
	Weights map[string]string `json:"source_weights,omitempty"`
	// ShareByBatch (a mixed epoch): each source's share of the measured
	// whole batches, in order, each point over GroupBatches consecutive
	// batches (at most 100 points).
	ShareByBatch map[string][]float64 `json:"source_share_by_batch,omitempty"`
	GroupBatches int                  `json:"share_group_batches,omitempty"`
	// What a uniform shuffle of the measured samples gives (exactly, drawn
	// without replacement: see uniform): distinct clips per batch, and the
	// share of same-clip neighbours.
	UniformDistinct   float64 `json:"distinct_clips_uniform"`
	UniformNeighbours float64 `json:"same_clip_neighbours_uniform"`
	// Heavy: the clips holding an outsized share of the measured samples
	// (at least 1 % of them and 10 times a clip's mean share, #64.6).
	Heavy []HeavySamples `json:"heavy_clips"`
	// Labels: per label modality, each label's samples among the measured
	// ones, most first (every label of the vocabulary, those with none
	// too): the balance of the classes a trainer sees.
	Labels map[string][]LabelSamples `json:"samples_per_label,omitempty"`
}

// LabelSamples is a label's samples among an epoch's measured ones.
type LabelSamples struct {
	Label   string  `json:"label"`
	Samples int64   `json:"samples"`
	Share   float64 `json:"share"`
}

// HeavySamples is a clip that holds an outsized share of an epoch's
// samples: its row in its dataset (Source: a mixed folder's source).
type HeavySamples struct {
	Row       int64   `json:"row"`
	Source    string  `json:"source,omitempty"`
	Samples   int64   `json:"samples"`
	Share     float64 `json:"share"`      // of the measured samples
	TimesMean float64 `json:"times_mean"` // its samples over a clip's mean
}

func Epochs(dir, sample string, batch int, mem int64, open Opener) (*EpochsReport, error) {
	man, err := manifests.VouchEpochs(dir) // verify's structure check
	if err != nil {
		return nil, err
	}
	r := &EpochsReport{Kind: "epochs", Dir: dir, Dataset: man.Dataset.Dir, Sources: man.Sources, Seed: man.Seed, Window: man.Window, Batch: batch,
		Shapes: map[string]any{}}
	r.Short, r.ShortClips = man.Short, shortClips(man)
	cols := man.SampleCols()
	names := man.SourceNames()
	for _, m := range man.Modalities {
		r.Names = append(r.Names, m.Name)
		r.Shapes[m.Name] = m.SampleShape()
	}
	for _, e := range man.Epochs {
		er := EpochReport{Epoch: e.Epoch, Samples: e.Samples, Shards: len(e.Shards)}
		var counts []int64
		if cols == 4 {
			er.Counts, er.Weights = e.Counts, map[string]string{}
			for _, n := range names {
				er.Weights[n] = string(e.Weights[n])
				counts = append(counts, e.Counts[n])
			}
		}
		shards := slices.Clone(e.Shards)
		sort.Slice(shards, func(a, b int) bool { return shards[a].Shard < shards[b].Shard })
		var held int64
		for _, s := range shards {
			for _, rel := range s.Files {
				p, err := manifests.Join(dir, rel)
				if err != nil {
					return nil, err
				}
				f, fi, err := regfile.Open(p)
				if err != nil {
					return nil, err
				}
				f.Close()
				er.Bytes += fi.Size()
			}
			held += int64(s.Samples)
		}
		if held != e.Samples {
			return nil, fmt.Errorf("%s: epoch %d: the shards hold %d samples, epochs.json says %d", dir, e.Epoch, held, e.Samples)
		}
		// Within --mem (24 bytes a sample, 32 mixed): the whole order, or, for a
		// larger epoch, a stretch of each tenth from its start (the
		// figures say how many samples they measured). A tenth is a
		// tenth of the whole batches (so its figures are over the batches
		// the epoch's are: the remainder is in the last).
		budget := max(int64(10*batch), mem/int64(8*cols))
		per := e.Samples
		if e.Samples > budget {
			per = budget / 10 / int64(batch) * int64(batch)
		}
		unit, units := int64(batch), e.Samples/int64(batch)
		var order []manifests.Sample
		var spans [][2]int64 // (the ranges of samples measured)
		if units < 10 {
			spans = append(spans, [2]int64{0, e.Samples})
			// Fewer than 10 whole batches: no figures by tenth (a tenth of
			// the samples measured as a batch of its size, under an axis
			// of batches of --batch, misled: #64.5); the epoch's own.
			got, err := readRange(dir, man, shards, 0, e.Samples, len(names))
			if err != nil {
				return nil, err
			}
			order = got
		}
		for t := int64(0); t < 10 && units >= 10; t++ {
			lo, end := units*t/10*unit, units*(t+1)/10*unit
			if t == 9 {
				end = e.Samples
			}
			hi := min(end, lo+per)
			spans = append(spans, [2]int64{lo, hi})
			got, err := readRange(dir, man, shards, lo, hi, len(names))
			if err != nil {
				return nil, err
			}
			q := shuffle.Measure(got, min(batch, max(1, len(got))))
			if cols == 4 {
				shuffle.MeasureSources(&q, got, min(batch, max(1, len(got))), names, scaled(counts, e.Samples, int64(len(got))), sourceOf)
			}
			er.Tenths = append(er.Tenths, q)
			order = append(order, got...)
		}
		er.Quality = shuffle.Measure(order, batch)
		if cols == 4 {
			shuffle.MeasureSources(&er.Quality, order, batch, names, scaled(counts, e.Samples, int64(len(order))), sourceOf)
		}
		er.Measured = int64(len(order))
		er.UniformDistinct, er.UniformNeighbours = uniform(order, batch)
		er.Heavy = heavySamples(order, names, cols == 4)
		if er.Labels, err = labelSamples(dir, man, shards, spans, open); err != nil {
			return nil, err
		}
		if cols == 4 {
			er.ShareByBatch, er.GroupBatches = shareByBatch(order, batch, names)
		}
		r.Epochs = append(r.Epochs, er)
	}
	if sample != "" {
		if r.Sample, err = sampleReport(dir, man, sample, open); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// heavySamples lists, most first, the clips holding at least 1 % of the
// samples of order and 10 times a clip's mean (at most 10).
func heavySamples(order []manifests.Sample, names []string, mixed bool) []HeavySamples {
	out := []HeavySamples{}
	if len(order) == 0 {
		return out
	}
	per := map[int64]int64{}
	for _, smp := range order {
		per[smp.Clip]++
	}
	mean := float64(len(order)) / float64(len(per))
	for _, c := range slices.Sorted(maps.Keys(per)) {
		n := per[c]
		if share := float64(n) / float64(len(order)); share >= 0.01 && float64(n) >= 10*mean {
			h := HeavySamples{Row: c, Samples: n, Share: share, TimesMean: float64(n) / mean}
			if mixed {
				h.Row = c & (1<<sourceShift - 1)
				if k := sourceOf(c); k < len(names) {
					h.Source = names[k]
				}
			}
			out = append(out, h)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Samples > out[b].Samples })
	return out[:min(len(out), 10)]
}

// uniform is what a uniform shuffle of these samples gives, exactly (a
// shuffle draws without replacement): the expected distinct clips in a
// batch of batch, sum over clips of 1 - C(N-c, B) / C(N, B) (c: the
// clip's samples, N all of them), and the expected share of same-clip
// neighbours, sum of c(c-1) / (N(N-1)). (Drawn with replacement, 1 -
// (1-c/N)^B, a uniform shuffle of 1,783 samples in batches of 256 gave
// 129.6 where it gives 135.9: a uniform shuffle looked 5 % worse than
// itself, #64.5.)
func uniform(order []manifests.Sample, batch int) (distinct, neighbours float64) {
	if len(order) == 0 {
		return 0, 0
	}
	per := map[int64]int{}
	for _, smp := range order {
		per[smp.Clip]++
	}
	n := len(order)
	b := min(batch, n)
	for _, clip := range slices.Sorted(maps.Keys(per)) { // (in order: the same figures from a folder and its bucket)
		c := per[clip]
		// C(N-c, B) / C(N, B) = prod over j < c of (N-B-j) / (N-j): the
		// chance that a batch holds none of the clip's samples.
		none := 1.0
		for j := 0; j < c && none > 1e-300; j++ {
			if n-b-j <= 0 {
				none = 0
				break
			}
			none *= float64(n-b-j) / float64(n-j)
		}
		distinct += 1 - none
		if n > 1 {
			neighbours += float64(c) * float64(c-1) / (float64(n) * float64(n-1))
		}
	}
	return distinct, neighbours
}

// shareByBatch is each source's share of the whole batches of order, in
// points over groups of consecutive batches (at most 100 points), and the
// batches a point is over.
func shareByBatch(order []manifests.Sample, batch int, names []string) (map[string][]float64, int) {
	nb := len(order) / batch
	if nb == 0 {
		return nil, 0
	}
	group := (nb + 99) / 100
	out := map[string][]float64{}
	for g := 0; g*group < nb; g++ {
		counts := make([]int, len(names))
		lo, hi := g*group*batch, min(nb, (g+1)*group)*batch
		for _, smp := range order[lo:hi] {
			if k := sourceOf(smp.Clip); k < len(names) {
				counts[k]++
			}
		}
		for k, n := range names {
			out[n] = append(out[n], float64(counts[k])/float64(hi-lo))
		}
	}
	return out, group
}

// sourceShift puts a mixed sample's source above its clip number in
// Sample.Clip (clips of different sources are different clips to the
// quality figures); sourceOf takes it back out.
const sourceShift = 40

func sourceOf(c int64) int { return int(c >> sourceShift) }

// scaled is the counts of an epoch of n samples, scaled to m of them (the
// shares a measured stretch is held to).
func scaled(counts []int64, n, m int64) []int64 {
	out := make([]int64, len(counts))
	for i, c := range counts {
		if n > 0 {
			out[i] = c * m / n
		}
	}
	return out
}

// shortClips counts the clips of m's dataset (every source's) shorter
// than its window, from the version of each it was cut from; -1 if one
// is not there (moved, dropped, or a bucket's).
func shortClips(m *manifests.Epochs) int {
	refs := []manifests.DatasetRef{m.Dataset}
	if len(m.Sources) > 0 {
		refs = refs[:0]
		for _, s := range m.Sources {
			refs = append(refs, manifests.DatasetRef{Dir: s.Dir, SHA256: s.SHA256})
		}
	}
	n := 0
	for _, ref := range refs {
		if ref.Dir == "" {
			return -1
		}
		d, err := manifests.FindVersion(ref.Dir, ref.SHA256)
		if err != nil || d == nil {
			return -1
		}
		_, lengths, err := manifests.ReadIndex(filepath.Join(ref.Dir, filepath.FromSlash(d.Files.Index)))
		if err != nil {
			return -1
		}
		for _, l := range lengths {
			if l < int64(m.Window) {
				n++
			}
		}
	}
	return n
}

// labelSamples counts, for each label modality of man, its labels'
// samples in the spans of samples measured (read from the shards' label
// files: 4 bytes a sample), most first, every label of the vocabulary
// listed. nil without label modalities.
func labelSamples(dir string, man *manifests.Epochs, shards []manifests.ShardEntry, spans [][2]int64, open Opener) (map[string][]LabelSamples, error) {
	var out map[string][]LabelSamples
	for _, m := range man.Modalities {
		if m.Labels == nil || m.DType != "<i4" || !m.PerClip {
			continue
		}
		per := make([]int64, len(m.Labels))
		var total int64
		for _, sp := range spans {
			for _, s := range shards {
				a, b := max(sp[0], s.First), min(sp[1], s.First+int64(s.Samples))
				if a >= b {
					continue
				}
				f, h, err := man.ShardFile(dir, s, m.Name)
				if err != nil {
					return nil, err
				}
				p := f.Name()
				f.Close()
				r, err := open(p)
				if err != nil {
					return nil, err
				}
				buf := make([]byte, 4*(b-a))
				n, err := r.ReadAt(buf, h.DataOffset+4*(a-s.First))
				r.Close()
				if n < len(buf) {
					return nil, fmt.Errorf("%s: reading samples %d..%d: %w", p, a-s.First, b-s.First, err)
				}
				for i := range b - a {
					c := int32(binary.LittleEndian.Uint32(buf[4*i:]))
					if c < 0 || int(c) >= len(per) {
						return nil, fmt.Errorf("%s: sample %d: code %d, outside the %d labels of %q in epochs.json (verify %s)", p, a-s.First+i, c, len(per), m.Name, dir)
					}
					per[c]++
				}
				total += b - a
			}
		}
		list := make([]LabelSamples, len(per))
		for c, n := range per {
			list[c] = LabelSamples{Label: m.Labels[c], Samples: n}
			if total > 0 {
				list[c].Share = float64(n) / float64(total)
			}
		}
		sort.SliceStable(list, func(a, b int) bool { return list[a].Samples > list[b].Samples })
		if out == nil {
			out = map[string][]LabelSamples{}
		}
		out[m.Name] = list
	}
	return out, nil
}
