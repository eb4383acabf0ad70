// What a dataset holds: its figures, clip lengths, modalities.

package inspect

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/manifests"
)

// -- dataset --------------------------------------------------------------

// DatasetReport is what inspect shows of a dataset.
type DatasetReport struct {
	Kind       string           `json:"kind"` // "dataset"
	Dir        string           `json:"dir"`
	Clips      int64            `json:"clips"`
	Frames     int64            `json:"frames"`
	FPS        float64          `json:"fps"`
	Hours      float64          `json:"hours"`
	Modalities []ModalityReport `json:"modalities"`
	Lengths    Distribution     `json:"clip_lengths"` // in clip frames
	Longest    []ClipLength     `json:"longest"`
	Shortest   []ClipLength     `json:"shortest"`
	Skipped    []string         `json:"skipped"`
	Trimmed    int64            `json:"trimmed_frames"`
	SourceSize int64            `json:"source_bytes"`
	Histogram  []int64          `json:"length_histogram"` // clip counts over LengthEdges
	LengthEdge []float64        `json:"length_edges"`
	// LengthScale is "clipped" when some clips are more than 4 times the
	// 90th percentile (a huge clip among short ones): the last bin then
	// holds them (from the others' longest to the longest), the others
	// are binned over their own range.
	LengthScale string `json:"length_scale"`
	// Heavy are the clips that hold an outsized share of the frames (at
	// least 1 % of them, and 10 times a clip's mean share): tile windows
	// give every epoch that share of its samples from them (#64.6).
	Heavy []HeavyClip `json:"heavy_clips"`
	Clip  *ClipReport `json:"clip,omitempty"`
	// Features (--stats): per modality, per feature mean, std, min and max
	// of every row of every clip (one bounded pass), for normalisation.
	Features []FeatureReport `json:"feature_stats,omitempty"`
}

// HeavyClip is a clip that holds an outsized share of a dataset's frames.
type HeavyClip struct {
	Clip      string  `json:"clip"`
	Row       int     `json:"row"`
	Frames    int64   `json:"frames"`
	Share     float64 `json:"share"`      // of all frames
	TimesMean float64 `json:"times_mean"` // its frames over a clip's mean
}

// heavy lists, longest first, the clips holding at least 1 % of the
// frames and 10 times a clip's mean (at most 10).
func heavy(lengths []int64, id func(int) string) []HeavyClip {
	out := []HeavyClip{}
	var total int64
	for _, l := range lengths {
		total += l
	}
	if total == 0 {
		return out
	}
	mean := float64(total) / float64(len(lengths))
	for i, l := range lengths {
		if share := float64(l) / float64(total); share >= 0.01 && float64(l) >= 10*mean {
			out = append(out, HeavyClip{Clip: id(i), Row: i, Frames: l, Share: share, TimesMean: float64(l) / mean})
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Frames > out[b].Frames })
	return out[:min(len(out), 10)]
}

// ModalityReport is one blob's figures.
type ModalityReport struct {
	Name       string `json:"name"`
	DType      string `json:"dtype"`
	FrameShape []int  `json:"frame_shape"`
	Rate       int    `json:"rate"`
	PerClip    bool   `json:"per_clip,omitempty"`
	// A label modality's column (or, from a pickle, its template and
	// keys), vocabulary and clips per label.
	LabelColumn string          `json:"label_column,omitempty"`
	Template    string          `json:"template,omitempty"`
	Keys        string          `json:"keys,omitempty"`
	Labels      []string        `json:"labels,omitempty"`
	LabelClips  []int64         `json:"label_clips,omitempty"`
	Rows        int64           `json:"rows"`
	Bytes       int64           `json:"bytes"`
	Stats       manifests.Stats `json:"conversion"`
	Sampled     int64           `json:"sampled_rows"` // rows read for the histogram
	Values      Histogram       `json:"values"`
}

// Distribution is a five-number summary.
type Distribution struct {
	Min, Q1, Median, Q3, Max int64
	Mean                     float64
}

// ClipLength is a clip and its length in clip frames.
type ClipLength struct {
	Clip   string `json:"clip"`
	Row    int    `json:"row"`
	Frames int64  `json:"frames"`
}

// Histogram counts values in equal bins over [Lo, Hi]; NaN and Inf apart.
type Histogram struct {
	Lo, Hi float64
	Counts []int64
	NaN    int64
	Inf    int64
	Values int64
}

func Dataset(dir, clip string, fps float64, maxRows int, stats bool, open Opener) (*DatasetReport, error) {
	// The structure check of verify: manifests, index, ids and blob
	// headers agree (a damaged manifest is refused, naming the file and
	// what is wrong, before any figure is made of it).
	d, clipRows, err := manifests.Vouch(dir)
	if err != nil {
		return nil, err
	}
	starts, lengths := make([]int64, len(clipRows)), make([]int64, len(clipRows))
	for i, c := range clipRows {
		starts[i], lengths[i] = c.Start, c.Length
	}
	var ids []string // clips.txt's, which Vouch found equal to clips.parquet's
	if d.Files.IDs != "" {
		ids = make([]string, len(clipRows))
		for i, c := range clipRows {
			ids[i] = c.Clip
		}
	}
	id := func(i int) string {
		if ids == nil {
			return "#" + strconv.Itoa(i)
		}
		return ids[i]
	}
	r := &DatasetReport{Kind: "dataset", Dir: dir, Clips: d.Clips, Frames: d.Frames, FPS: fps,
		Hours: float64(d.Frames) / fps / 3600, Trimmed: d.Trimmed, Skipped: []string{}}
	for _, s := range d.Skipped {
		r.Skipped = append(r.Skipped, s.Clip+": "+s.Reason)
	}
	r.Lengths, r.Longest, r.Shortest = lengthFigures(lengths, id)
	r.LengthEdge, r.Histogram, r.LengthScale = lengthHistogram(lengths)
	r.Heavy = heavy(lengths, id)
	// The sources' sizes, of every clip and modality.
	for _, c := range clipRows {
		for _, s := range c.Sources {
			r.SourceSize += max(0, s.Size)
		}
	}
	wh, err := manifests.LoadWhere(dir, d, starts, lengths)
	if err != nil {
		return nil, err
	}
	for k, m := range d.Modalities {
		mr := ModalityReport{Name: m.Name, DType: m.DType, FrameShape: m.FrameShape, Rate: m.Rate, PerClip: m.PerClip,
			Rows: m.Rows, Stats: d.Stats[m.Name]}
		for _, b := range m.BlobList() {
			mr.Bytes += b.Size
		}
		_, size, err := decoder(m.DType)
		if err != nil {
			return nil, err
		}
		rb := int64(size)
		for _, x := range m.FrameShape {
			rb *= int64(x)
		}
		at := func(first, n int64) (string, int64, int64, error) {
			// The clip that holds row first (in clip order), and its rows
			// from there on (format 1: the blob's rows, one after the other).
			c := int(first)
			if !m.PerClip {
				c = sort.Search(len(starts), func(c int) bool { return (starts[c]+lengths[c])*int64(m.Rate) > first })
			}
			within := first
			if wh != nil && c < len(starts) {
				if !m.PerClip {
					within = first - starts[c]*int64(m.Rate)
				} else {
					within = 0
				}
				b, f0, rows := d.Locate(wh, k, c, starts[c], lengths[c])
				blob := m.BlobList()[b]
				p, err := manifests.Join(dir, blob.File)
				return p, blob.DataOffset + (f0+within)*rb, max(1, min(n, rows-within)), err
			}
			blob := m.BlobList()[0]
			p, err := manifests.Join(dir, blob.File)
			return p, blob.DataOffset + first*rb, n, err
		}
		if m.IsLabel() {
			mr.LabelColumn, mr.Labels = m.LabelColumn, m.Labels
			if m.LabelColumn == "" {
				mr.Template, mr.Keys = m.Template, m.Keys
			}
			if mr.LabelClips, err = labelClips(dir, d, wh, k, starts, lengths, open); err != nil {
				return nil, fmt.Errorf("modality %q: %w", m.Name, err)
			}
		}
		if mr.Sampled, mr.Values, err = sampleValues(dir, m, at, maxRows, open); err != nil {
			return nil, err
		}
		r.Modalities = append(r.Modalities, mr)
	}
	if stats {
		for k, m := range d.Modalities {
			if m.IsLabel() {
				continue // codes: counted per label above, no mean to take
			}
			f, err := datasetFeatures(dir, d, wh, k, starts, lengths, open)
			if err != nil {
				return nil, fmt.Errorf("modality %q: %w", m.Name, err)
			}
			r.Features = append(r.Features, *f)
		}
	}
	if clip != "" {
		i := slices.Index(ids, clip)
		if i < 0 {
			if n, err := strconv.Atoi(strings.TrimPrefix(clip, "#")); err == nil && strings.HasPrefix(clip, "#") && n >= 0 && n < len(lengths) {
				i = n
			} else {
				return nil, UsageError{Msg: fmt.Sprintf("--clip %q: no such clip in %s (give an id of its clips.txt, or #ROW)", clip, dir)}
			}
		}
		if r.Clip, err = clipReport(dir, d, wh, i, id(i), starts[i], lengths[i], open); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func lengthFigures(lengths []int64, id func(int) string) (Distribution, []ClipLength, []ClipLength) {
	if len(lengths) == 0 {
		return Distribution{}, nil, nil
	}
	order := make([]int, len(lengths))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lengths[order[a]] < lengths[order[b]] })
	q := func(f float64) int64 { return lengths[order[int(math.Round(f*float64(len(order)-1)))]] }
	var sum float64
	for _, l := range lengths {
		sum += float64(l)
	}
	dist := Distribution{Min: q(0), Q1: q(0.25), Median: q(0.5), Q3: q(0.75), Max: q(1), Mean: sum / float64(len(lengths))}
	k := min(5, len(order))
	var longest, shortest []ClipLength
	for j := 0; j < k; j++ {
		i := order[len(order)-1-j]
		longest = append(longest, ClipLength{id(i), i, lengths[i]})
		i = order[j]
		shortest = append(shortest, ClipLength{id(i), i, lengths[i]})
	}
	return dist, longest, shortest
}

// lengthHistogram bins the clip lengths into 20 bins of equal width over
// [shortest, longest], or (scale "clipped", when some clips are more than
// 4 times the 90th percentile: a huge clip among short ones) 19 bins over
// the others' range and a last one holding the long clips, up to the
// longest, so that the rest are not all in one bar.
func lengthHistogram(lengths []int64) ([]float64, []int64, string) {
	if len(lengths) == 0 {
		return nil, nil, "linear"
	}
	sorted := slices.Sorted(slices.Values(lengths))
	lo, hi := sorted[0], sorted[len(sorted)-1]
	q := sorted[(len(sorted)-1)*9/10]
	bulk := sorted[sort.Search(len(sorted), func(i int) bool { return sorted[i] > 4*q })-1]
	bins, scale := 20, "linear"
	if bulk < hi && bulk > lo {
		bins, scale = 19, "clipped"
	} else {
		bulk = hi
	}
	edges := make([]float64, bins+1)
	for i := range edges {
		edges[i] = float64(lo) + float64(bulk-lo)*float64(i)/float64(bins)
	}
	edges[bins] = float64(bulk)
	if scale == "clipped" {
		edges = append(edges, float64(hi))
	}
	counts := make([]int64, len(edges)-1)
	for _, l := range lengths {
		b := min(bins-1, sort.Search(bins, func(i int) bool { return float64(l) < edges[i+1] }))
		if l > bulk {
			b = bins // the long clips' bin
		}
		counts[b]++
	}
	return edges, counts, scale
}

// datasetFeatures is modality k's per-feature figures over every row of
// every clip of the version (clip by clip, wherever its rows are: dead
// rows of a dataset in segments are not counted), read 8 MiB at a time.
// labelClips counts the clips of each label of label modality k (each
// blob read whole, once: one GET from a bucket).
func labelClips(dir string, d *manifests.Dataset, wh *manifests.Where, k int, starts, lengths []int64, open Opener) ([]int64, error) {
	codes, err := d.LabelCodes(wh, k, starts, lengths, func(file string) (io.ReaderAt, io.Closer, error) {
		p, err := manifests.Join(dir, file)
		if err != nil {
			return nil, nil, err
		}
		f, err := open(p)
		return f, f, err
	})
	if err != nil {
		return nil, err
	}
	counts := make([]int64, len(d.Modalities[k].Labels))
	for _, c := range codes {
		counts[c]++
	}
	return counts, nil
}

func datasetFeatures(dir string, d *manifests.Dataset, wh *manifests.Where, k int, starts, lengths []int64, open Opener) (*FeatureReport, error) {
	m := d.Modalities[k]
	a, err := newFeatures(m.Name, m.DType, m.FrameShape)
	if err != nil {
		return nil, err
	}
	files := map[string]ReaderAt{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for i := range starts {
		b, first, n := d.Locate(wh, k, i, starts[i], lengths[i])
		bl := m.BlobList()[b]
		p, err := manifests.Join(dir, bl.File)
		if err != nil {
			return nil, err
		}
		f := files[p]
		if f == nil {
			if f, err = open(p); err != nil {
				return nil, err
			}
			files[p] = f
		}
		if err := a.read(f, p, bl.DataOffset, first, n); err != nil {
			return nil, err
		}
	}
	return a.report(), nil
}
