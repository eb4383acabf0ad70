// The reports as one self-contained HTML page, written only where it may
// be (a new path, or a page inspect wrote).

package inspectcmd

import (
	"bytes"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/internal/inspect"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
)

// -- HTML -----------------------------------------------------------------

// writeHTML writes one self-contained page: inline SVG plots, no scripts.
func writeHTML(path string, rep any, force bool) error {
	var b strings.Builder
	title := "clipshard inspect"
	var plots []string
	switch r := rep.(type) {
	case *inspect.DatasetReport:
		title = "clipshard dataset " + r.Dir
		edges, counts, long := r.LengthEdge, r.Histogram, ""
		scale := "equal bins"
		if r.LengthScale == "clipped" {
			k := len(counts) - 1
			edges, counts = edges[:k+1], counts[:k]
			var names []string
			for _, c := range r.Longest {
				if float64(c.Frames) > edges[k] && len(names) < 3 {
					names = append(names, fmt.Sprintf("%s (%d)", c.Clip, c.Frames))
				}
			}
			long = fmt.Sprintf(" %s longer, up to %d frames, left out of the axis: %s.", ui.Count(r.Histogram[k], "clip"), r.Lengths.Max, strings.Join(names, ", "))
			scale = fmt.Sprintf("equal bins up to %d frames", int64(edges[k]))
		}
		var longest []string
		for _, c := range r.Longest[:min(3, len(r.Longest))] {
			longest = append(longest, fmt.Sprintf("%s (%d)", c.Clip, c.Frames))
		}
		plots = append(plots, bars("clip-lengths", "Clip lengths", "clip length (frames)", "clips", edges, counts, linear(edges[0], edges[len(edges)-1]),
			fmt.Sprintf("%d clips, %d to %d frames, median %d (%s).%s Longest: %s.", r.Clips, r.Lengths.Min, r.Lengths.Max, r.Lengths.Median,
				scale, long, strings.Join(longest, ", "))))
		for _, m := range r.Modalities {
			edges := make([]float64, len(m.Values.Counts)+1)
			for i := range edges {
				edges[i] = m.Values.Lo + (m.Values.Hi-m.Values.Lo)*float64(i)/float64(len(m.Values.Counts))
			}
			plots = append(plots, bars("values-"+m.Name, "Values of "+m.Name, "value ("+m.DType+")", "values", edges, m.Values.Counts,
				linear(m.Values.Lo, m.Values.Hi),
				fmt.Sprintf("%d values of %d rows read evenly across the blob (of %d). In the whole blob (dataset.json): NaN %d, Inf %d, overflow %d, max |x| %.4g; in the rows read: NaN %d, Inf %d.",
					m.Values.Values, m.Sampled, m.Rows, m.Stats.NaN, m.Stats.InfIn, m.Stats.Overflow, m.Stats.MaxAbs, m.Values.NaN, m.Values.Inf)))
		}
	case *inspect.EpochsReport:
		title = "clipshard epochs " + r.Dir
		var names []string
		for _, s := range r.Sources {
			names = append(names, s.Name)
		}
		// Each epoch's figures along it (the first two and the last two
		// of more than four); across epochs, each epoch's overall figures.
		for i, e := range r.Epochs {
			if len(r.Epochs) > 4 && i >= 2 && i < len(r.Epochs)-2 {
				continue
			}
			plots = append(plots, epochPlots(r, e, names)...)
		}
		if len(r.Epochs) > 1 {
			var xs, ds, ns, ud, un []float64
			for _, e := range r.Epochs {
				xs = append(xs, float64(e.Epoch))
				ds, ns = append(ds, e.Quality.DistinctClipsMean), append(ns, e.Quality.SameClipNeighbours)
				ud, un = append(ud, e.UniformDistinct), append(un, e.UniformNeighbours)
			}
			first, last := xs[0], max(xs[0]+1, xs[len(xs)-1])
			plots = append(plots, lines("epochs-distinct", "Distinct clips per batch, by epoch", "epoch", fmt.Sprintf("distinct clips per batch of %d", r.Batch),
				epochAxis(first, last), linear(0, maxOf(ds, ud)*1.15), []series{{xs: xs, ys: ds}}, []series{{xs: xs, ys: ud}},
				"Each epoch's mean over its whole batches; dashed: what a uniform shuffle of its samples gives."))
			plots = append(plots, lines("epochs-neighbours", "Same-clip neighbours, by epoch", "epoch", "share of neighbours from one clip",
				epochAxis(first, last), linear(0, max(0.01, maxOf(ns, un)*1.5)), []series{{xs: xs, ys: ns}}, []series{{xs: xs, ys: un}},
				"Each epoch's share of consecutive samples from the same clip; dashed: a uniform shuffle's."))
		}
		if len(names) > 0 && len(r.Epochs) > 1 {
			var ss []series
			for _, name := range names {
				s := series{name: name}
				for _, e := range r.Epochs { // (a step: the weight holds over the whole epoch, [e, e+1))
					w := weightShare(e, name, names)
					s.xs = append(s.xs, float64(e.Epoch), float64(e.Epoch+1))
					s.ys = append(s.ys, w, w)
				}
				ss = append(ss, s)
			}
			first, last := float64(r.Epochs[0].Epoch), float64(r.Epochs[len(r.Epochs)-1].Epoch+1)
			plots = append(plots, lines("curriculum", "The curriculum: each source's weight by epoch", "epoch", "share of the epoch's weights",
				epochAxis(first, last), linearFixed(0, 1, 0.2), ss, nil,
				"Each source's weight over the epoch's weights added up, held over each epoch (--weights, per epoch range)."))
		}
	}
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">%s<title>%s</title>\n", pageMark, html.EscapeString(title))
	b.WriteString("<style>body{font:14px sans-serif;margin:2em;color:#222}figure{display:inline-block;margin:1em}figcaption{max-width:520px}pre{background:#f6f6f6;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere;max-width:100%}</style></head><body>\n")
	fmt.Fprintf(&b, "<h1>%s</h1>\n<pre>", html.EscapeString(title))
	var text strings.Builder
	printText(&text, rep)
	b.WriteString(html.EscapeString(text.String()))
	b.WriteString("</pre>\n")
	for _, p := range plots {
		b.WriteString(p)
	}
	b.WriteString("</body></html>\n")
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return fmt.Errorf("--html %s: no folder %s to write it in", path, filepath.Dir(path))
	}
	if err := outsideOutputs(path); err != nil {
		return err
	}
	return atomicfile.WriteUserFile(path, []byte(b.String()), mayReplace(force))
}

// epochPlots are an epoch's figures along it, per tenth of its whole
// batches (and, mixed, each source's share per group of batches), each
// with what a uniform shuffle of its samples gives as a dashed line.
func epochPlots(r *inspect.EpochsReport, e inspect.EpochReport, names []string) []string {
	var xs, ys, ns []float64
	for t, q := range e.Tenths {
		xs = append(xs, float64(t*10+5))
		ys = append(ys, q.DistinctClipsMean)
		ns = append(ns, q.SameClipNeighbours)
	}
	pct := linearFixed(0, 100, 20)
	flat := func(v float64) []series { return []series{{xs: []float64{0, 100}, ys: []float64{v, v}}} }
	var out []string
	if len(e.Tenths) > 0 { // (fewer than 10 whole batches: no figures along the epoch)
		out = alongEpoch(r, e, xs, ys, ns, pct, flat)
	}
	return append(out, shares(r, e, names, pct)...)
}

// alongEpoch are an epoch's quality figures per tenth of its whole batches.
func alongEpoch(r *inspect.EpochsReport, e inspect.EpochReport, xs, ys, ns []float64, pct axis, flat func(float64) []series) []string {
	return []string{lines(fmt.Sprintf("quality-%d", e.Epoch), fmt.Sprintf("Epoch %d: distinct clips per batch along the epoch", e.Epoch),
		"position in the epoch (%)", fmt.Sprintf("distinct clips per batch of %d", r.Batch), pct, linear(0, maxOf(ys, []float64{e.UniformDistinct})*1.15),
		[]series{{xs: xs, ys: ys}}, flat(e.UniformDistinct),
		fmt.Sprintf("%d samples; per tenth of the epoch's whole batches (overall %.1f); dashed: a uniform shuffle of these samples (%.1f). A degraded tail drops at the right.",
			e.Samples, e.Quality.DistinctClipsMean, e.UniformDistinct)),
		lines(fmt.Sprintf("neighbours-%d", e.Epoch), fmt.Sprintf("Epoch %d: same-clip neighbours along the epoch", e.Epoch),
			"position in the epoch (%)", "share of neighbours from one clip", pct, linear(0, max(0.01, maxOf(ns, []float64{3 * e.UniformNeighbours})*1.3)),
			[]series{{xs: xs, ys: ns}}, flat(e.UniformNeighbours),
			fmt.Sprintf("The share of consecutive samples from the same clip, per tenth (overall %.4f); dashed: a uniform shuffle's (%.4f). Near 1: clip order.",
				e.Quality.SameClipNeighbours, e.UniformNeighbours))}
}

// shares is a mixed epoch's plot of each source's share along it.
func shares(r *inspect.EpochsReport, e inspect.EpochReport, names []string, pct axis) []string {
	var out []string
	if len(e.ShareByBatch) > 0 && len(names) > 0 {
		var ss, targets []series
		n := len(e.ShareByBatch[names[0]])
		for _, name := range names {
			var px []float64
			for i := range n {
				px = append(px, 100*(float64(i)+0.5)/float64(n))
			}
			ss = append(ss, series{name: name, xs: px, ys: e.ShareByBatch[name]})
			if e.Samples > 0 {
				w := float64(e.Counts[name]) / float64(e.Samples)
				targets = append(targets, series{xs: []float64{0, 100}, ys: []float64{w, w}})
			}
		}
		per := fmt.Sprintf("one batch of %d", r.Batch)
		if e.GroupBatches > 1 {
			per = fmt.Sprintf("%d consecutive batches of %d", e.GroupBatches, r.Batch)
		}
		out = append(out, lines(fmt.Sprintf("sources-%d", e.Epoch), fmt.Sprintf("Epoch %d: each source's share along the epoch", e.Epoch),
			"position in the epoch (%)", "share of the batch", pct, linearFixed(0, 1, 0.2), ss, targets,
			fmt.Sprintf("Each point is a source's share of %s; dashed: its share of the epoch (its weight).", per)))
	}
	return out
}

func maxOf(a, b []float64) float64 {
	m := 0.0
	for _, v := range append(slices.Clone(a), b...) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m = max(m, v)
		}
	}
	return m
}

// weightShare is name's weight over the epoch's weights added up (its
// natural share when the weights do not parse).
func weightShare(e inspect.EpochReport, name string, names []string) float64 {
	var total, mine float64
	for _, n := range names {
		w, err := strconv.ParseFloat(e.Weights[n], 64)
		if err != nil || math.IsNaN(w) || math.IsInf(w, 0) {
			if e.Samples == 0 {
				return math.NaN()
			}
			return float64(e.Counts[name]) / float64(e.Samples)
		}
		total += w
		if n == name {
			mine = w
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return mine / total
}

// checkHTML refuses, before anything is computed, a --html path that
// writeHTML would refuse.
func checkHTML(path string, force bool) error {
	if err := outsideOutputs(path); err != nil {
		return err
	}
	return atomicfile.CheckUserFile(path, mayReplace(force))
}

// mayReplace accepts an existing regular file that is a page inspect
// wrote, or any regular file with --force.
func mayReplace(force bool) func(f *os.File, fi fs.FileInfo) error {
	return func(f *os.File, fi fs.FileInfo) error {
		if force {
			return nil
		}
		head := make([]byte, 512)
		n, _ := io.ReadFull(f, head)
		if isPage(head[:n]) {
			return nil
		}
		return errors.New("exists and is not a page clipshard inspect wrote: give a new path, or --force to replace this file")
	}
}

// pageMark is in the head of every page inspect writes, and is how
// --html knows a file it may replace.
const pageMark = `<meta name="generator" content="clipshard inspect">`

// isPage reports whether head (a file's first bytes) is a page inspect
// wrote: this version's mark, or the head of the pages before it.
func isPage(head []byte) bool {
	old := "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>clipshard "
	return bytes.Contains(head, []byte(pageMark)) || bytes.HasPrefix(head, []byte(old))
}

// outsideOutputs refuses a path inside a dataset or an epochs folder
// (its folder, or its folder's parent, holds dataset.json or
// epochs.json): a page there would be a file verify does not know, or
// would replace a manifest.
func outsideOutputs(path string) error {
	dir := filepath.Dir(path)
	for _, d := range []string{dir, filepath.Dir(dir)} {
		for _, m := range []string{manifests.DatasetFile, manifests.EpochsFile} {
			if _, err := os.Lstat(filepath.Join(d, m)); err == nil {
				return fmt.Errorf("%w: --html %s: inside %s, which holds %s (a clipshard output folder): write the page elsewhere", atomicfile.ErrRefused, path, d, m)
			}
		}
	}
	return nil
}
