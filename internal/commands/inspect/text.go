// The reports as text.

package inspectcmd

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/internal/inspect"
	"github.com/clipshard/clipshard/internal/ui"
)

// -- text -----------------------------------------------------------------

func printText(w io.Writer, rep any) {
	switch r := rep.(type) {
	case *inspect.DatasetReport:
		if c := r.Clip; c != nil {
			// --clip: the clip asked about, under one line naming its
			// dataset (its summary is inspect without --clip).
			fmt.Fprintf(w, "dataset %s: %d clips, %d frames; clip %s (row %d): start %d, %d frames\n", r.Dir, r.Clips, r.Frames, c.Clip, c.Row, c.Start, c.Frames)
			for _, f := range c.Modalities {
				printFeatures(w, f)
			}
			return
		}
		fmt.Fprintf(w, "dataset %s: %d clips, %d frames (%.2f h at %g fps), sources %s\n", r.Dir, r.Clips, r.Frames, r.Hours, r.FPS, ui.Bytes(r.SourceSize))
		l := r.Lengths
		fmt.Fprintf(w, "clip lengths (frames): min %d, quartiles %d / %d / %d, max %d, mean %.1f\n", l.Min, l.Q1, l.Median, l.Q3, l.Max, l.Mean)
		fmt.Fprintf(w, "  longest:  %s\n  shortest: %s\n", clipList(r.Longest), clipList(r.Shortest))
		for _, h := range r.Heavy {
			fmt.Fprintf(w, "  imbalance: %s holds %.1f%% of all frames (%d, %.0fx a clip's mean): tile windows give every epoch that share of its samples from it; shuffle --sampling random --per-clip N (or Loader(sampling=\"random\", per_clip=N)) gives each clip N windows\n",
				h.Clip, 100*h.Share, h.Frames, h.TimesMean)
		}
		fmt.Fprintf(w, "skipped %d, trimmed %d frames\n", len(r.Skipped), r.Trimmed)
		for _, s := range r.Skipped {
			fmt.Fprintf(w, "  skipped %s\n", ui.OneLine(s))
		}
		for _, m := range r.Modalities {
			if m.Labels != nil {
				from := "column " + m.LabelColumn
				if m.LabelColumn == "" {
					from = fmt.Sprintf("key %s of %s", m.Keys, m.Template)
				}
				fmt.Fprintf(w, "  %-12s %s label (%s), %d rows, %s; clips per label: %s\n", m.Name, m.DType, from, m.Rows, ui.Bytes(m.Bytes), labelCounts(m.Labels, m.LabelClips, 12))
				continue
			}
			rate := fmt.Sprintf("rate %d", m.Rate)
			if m.PerClip {
				rate = "per clip"
			}
			fmt.Fprintf(w, "  %-12s %s %v %s, %d rows, %s; nan %d inf %d overflow %d underflow %d max|x| %g\n", m.Name, m.DType,
				m.FrameShape, rate, m.Rows, ui.Bytes(m.Bytes), m.Stats.NaN, m.Stats.InfIn, m.Stats.Overflow, m.Stats.Underflow, m.Stats.MaxAbs)
			fmt.Fprintf(w, "               values of %d sampled rows: %s\n", m.Sampled, histText(m.Values))
		}
		if len(r.Features) > 0 {
			fmt.Fprintf(w, "per-feature statistics over every row (--stats):\n")
			for _, f := range r.Features {
				printFeatures(w, f)
			}
		}
	case *inspect.EpochsReport:
		of := r.Dataset
		if len(r.Sources) > 0 {
			var s []string
			for _, src := range r.Sources {
				s = append(s, src.Name+"="+src.Dir)
			}
			of = "sources " + strings.Join(s, ", ")
		}
		fmt.Fprintf(w, "epochs %s: of %s, seed %d, window %d, %d epochs\n", r.Dir, of, r.Seed, r.Window, len(r.Epochs))
		if r.ShortClips > 0 {
			what := "left out (--short skip)"
			if r.Short == "pad" {
				what = "padded with zeros past their frames (--short pad: the samples' valid column)"
			}
			fmt.Fprintf(w, "  %d clips shorter than the window: %s\n", r.ShortClips, what)
		}
		for _, e := range r.Epochs {
			q := e.Quality
			batches := fmt.Sprintf("%.1f distinct clips (min %d)", q.DistinctClipsMean, q.DistinctClipsMin)
			if e.Measured < int64(r.Batch) {
				batches = "no whole batch" // (not "0.0 distinct clips")
			}
			fmt.Fprintf(w, "  epoch %d: %d samples in %d shards, %s; batches of %d: %s, same-clip neighbours %.3f, spearman %.3f\n",
				e.Epoch, e.Samples, e.Shards, ui.Bytes(e.Bytes), r.Batch, batches, q.SameClipNeighbours, q.Spearman)
			for _, s := range q.Sources {
				fmt.Fprintf(w, "    source %s: %d samples (weight %s), %.1f%% of the epoch; per batch %.1f%% on average, at worst %.1f samples off its share\n",
					s.Name, e.Counts[s.Name], e.Weights[s.Name], 100*s.Share, 100*s.MeanShare, s.WorstDeviation)
			}
			var d, n []string
			for _, t := range e.Tenths {
				d = append(d, fmt.Sprintf("%.0f", t.DistinctClipsMean))
				n = append(n, fmt.Sprintf("%.2f", t.SameClipNeighbours))
			}
			if len(e.Tenths) == 0 {
				fmt.Fprintf(w, "    by tenth: none (fewer than 10 batches of %d)\n", r.Batch)
			} else {
				fmt.Fprintf(w, "    by tenth: distinct clips %s; same-clip neighbours %s\n", strings.Join(d, " "), strings.Join(n, " "))
			}
			if e.Measured < e.Samples {
				fmt.Fprintf(w, "    (measured on %d of the %d samples: the start of each tenth; --mem holds more)\n", e.Measured, e.Samples)
			}
			for _, name := range slices.Sorted(maps.Keys(e.Labels)) {
				fmt.Fprintf(w, "    samples per %s: %s\n", name, labelShares(e.Labels[name]))
			}
			for _, h := range e.Heavy {
				src := ""
				if h.Source != "" {
					src = " of source " + h.Source
				}
				fmt.Fprintf(w, "    imbalance: clip row %d%s holds %.1f%% of the samples measured (%d, %.0fx a clip's mean): shuffle --sampling random --per-clip N (or Loader(sampling=\"random\", per_clip=N)) gives each clip N windows\n",
					h.Row, src, 100*h.Share, h.Samples, h.TimesMean)
			}
		}
		if s := r.Sample; s != nil {
			src := ""
			if s.Source != "" {
				src = "source " + s.Source + ", "
			}
			fmt.Fprintf(w, "sample %d:%d: %sclip row %d %s, start %d, valid %d (%s)\n", s.Epoch, s.Index, src, s.Clip, s.ClipID, s.Start, s.Valid, s.Shard)
			for _, f := range s.Modalities {
				printFeatures(w, f)
			}
		}
	}
}

func clipList(cs []inspect.ClipLength) string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s %d", c.Clip, c.Frames))
	}
	return strings.Join(out, ", ")
}

func histText(h inspect.Histogram) string {
	return fmt.Sprintf("%d values in [%g, %g], nan %d, inf %d", h.Values, h.Lo, h.Hi, h.NaN, h.Inf)
}

func printFeatures(w io.Writer, f inspect.FeatureReport) {
	fmt.Fprintf(w, "  %-12s %d rows x %d features; nan %d inf %d", f.Name, f.Rows, len(f.Mean), f.NaN, f.Infinite)
	if len(f.NaNAt) > 0 {
		var at []string
		for _, p := range f.NaNAt {
			at = append(at, fmt.Sprintf("[%d,%d]", p[0], p[1]))
		}
		fmt.Fprintf(w, " at %s", strings.Join(at, " "))
	}
	fmt.Fprintln(w)
	show := min(len(f.Mean), 8)
	for j := 0; j < show; j++ {
		fmt.Fprintf(w, "    feature %d: mean %.4g std %.4g min %.4g max %.4g\n", j, f.Mean[j], f.Std[j], f.Min[j], f.Max[j])
	}
	if len(f.Mean) > show {
		fmt.Fprintf(w, "    (%d more features: --json has them all)\n", len(f.Mean)-show)
	}
}

// labelCounts words a vocabulary with its clip counts, the first max
// labels: "alice 120, bob 100 ... and 3 more".
func labelCounts(labels []string, clips []int64, max int) string {
	var parts []string
	for i, l := range labels {
		if i == max {
			parts = append(parts, fmt.Sprintf("... and %d more", len(labels)-max))
			break
		}
		l = labelText(l)
		n := int64(0)
		if i < len(clips) {
			n = clips[i]
		}
		parts = append(parts, fmt.Sprintf("%s %d", l, n))
	}
	return fmt.Sprintf("%d labels: %s", len(labels), strings.Join(parts, ", "))
}

// labelShares words an epoch's samples per label, most first: the first
// 12, then how many more and the rarest.
func labelShares(ls []inspect.LabelSamples) string {
	var out []string
	for i, l := range ls {
		if i == 12 && len(ls) > 13 {
			last := ls[len(ls)-1]
			out = append(out, fmt.Sprintf("and %d more, down to %s %.1f%%", len(ls)-12, labelText(last.Label), 100*last.Share))
			break
		}
		out = append(out, fmt.Sprintf("%s %.1f%%", labelText(l.Label), 100*l.Share))
	}
	return strings.Join(out, ", ")
}

// labelText is a label as a list shows it: quoted if it holds a space, a
// comma or a quote.
func labelText(l string) string {
	if strings.ContainsAny(l, " ,\"") {
		return strconv.Quote(l)
	}
	return l
}
