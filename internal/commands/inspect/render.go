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
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
)

// -- text -----------------------------------------------------------------

func printText(w io.Writer, rep any) {
	switch r := rep.(type) {
	case *DatasetReport:
		fmt.Fprintf(w, "dataset %s: %d clips, %d frames (%.2f h at %g fps), sources %s\n", r.Dir, r.Clips, r.Frames, r.Hours, r.FPS, ui.Bytes(r.SourceSize))
		l := r.Lengths
		fmt.Fprintf(w, "clip lengths (frames): min %d, quartiles %d / %d / %d, max %d, mean %.1f\n", l.Min, l.Q1, l.Median, l.Q3, l.Max, l.Mean)
		fmt.Fprintf(w, "  longest:  %s\n  shortest: %s\n", clipList(r.Longest), clipList(r.Shortest))
		fmt.Fprintf(w, "skipped %d, trimmed %d frames\n", len(r.Skipped), r.Trimmed)
		for _, s := range r.Skipped {
			fmt.Fprintf(w, "  skipped %s\n", ui.OneLine(s))
		}
		for _, m := range r.Modalities {
			rate := fmt.Sprintf("rate %d", m.Rate)
			if m.PerClip {
				rate = "per clip"
			}
			fmt.Fprintf(w, "  %-12s %s %v %s, %d rows, %s; nan %d inf %d overflow %d underflow %d max|x| %g\n", m.Name, m.DType,
				m.FrameShape, rate, m.Rows, ui.Bytes(m.Bytes), m.Stats.NaN, m.Stats.InfIn, m.Stats.Overflow, m.Stats.Underflow, m.Stats.MaxAbs)
			fmt.Fprintf(w, "               values of %d sampled rows: %s\n", m.Sampled, histText(m.Values))
		}
		if c := r.Clip; c != nil {
			fmt.Fprintf(w, "clip %s (row %d): start %d, %d frames\n", c.Clip, c.Row, c.Start, c.Frames)
			for _, f := range c.Modalities {
				printFeatures(w, f)
			}
		}
	case *EpochsReport:
		of := r.Dataset
		if len(r.Sources) > 0 {
			var s []string
			for _, src := range r.Sources {
				s = append(s, src.Name+"="+src.Dir)
			}
			of = "sources " + strings.Join(s, ", ")
		}
		fmt.Fprintf(w, "epochs %s: of %s, seed %d, window %d, %d epochs\n", r.Dir, of, r.Seed, r.Window, len(r.Epochs))
		for _, e := range r.Epochs {
			q := e.Quality
			fmt.Fprintf(w, "  epoch %d: %d samples in %d shards, %s; batches of %d: %.1f distinct clips (min %d), same-clip neighbours %.3f, spearman %.3f\n",
				e.Epoch, e.Samples, e.Shards, ui.Bytes(e.Bytes), r.Batch, q.DistinctClipsMean, q.DistinctClipsMin, q.SameClipNeighbours, q.Spearman)
			for _, s := range q.Sources {
				fmt.Fprintf(w, "    source %s: %d samples (weight %s), %.1f%% of the epoch; per batch %.1f%% on average, at worst %.1f samples off its share\n",
					s.Name, e.Counts[s.Name], e.Weights[s.Name], 100*s.Share, 100*s.MeanShare, s.WorstDeviation)
			}
			var d, n []string
			for _, t := range e.Tenths {
				d = append(d, fmt.Sprintf("%.0f", t.DistinctClipsMean))
				n = append(n, fmt.Sprintf("%.2f", t.SameClipNeighbours))
			}
			fmt.Fprintf(w, "    by tenth: distinct clips %s; same-clip neighbours %s\n", strings.Join(d, " "), strings.Join(n, " "))
			if e.Measured < e.Samples {
				fmt.Fprintf(w, "    (measured on %d of the %d samples: the start of each tenth; --mem holds more)\n", e.Measured, e.Samples)
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

func clipList(cs []ClipLength) string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s %d", c.Clip, c.Frames))
	}
	return strings.Join(out, ", ")
}

func histText(h Histogram) string {
	return fmt.Sprintf("%d values in [%g, %g], nan %d, inf %d", h.Values, h.Lo, h.Hi, h.NaN, h.Inf)
}

func printFeatures(w io.Writer, f FeatureReport) {
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

// -- HTML -----------------------------------------------------------------

// writeHTML writes one self-contained page: inline SVG plots, no scripts.
func writeHTML(path string, rep any, force bool) error {
	var b strings.Builder
	title := "clipshard inspect"
	var plots []string
	switch r := rep.(type) {
	case *DatasetReport:
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
	case *EpochsReport:
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
				linear(first, last), linear(0, maxOf(ds, ud)*1.15), []series{{xs: xs, ys: ds}}, []series{{xs: xs, ys: ud}},
				"Each epoch's mean over its whole batches; dashed: what a uniform shuffle of its samples gives."))
			plots = append(plots, lines("epochs-neighbours", "Same-clip neighbours, by epoch", "epoch", "share of neighbours from one clip",
				linear(first, last), linear(0, max(0.01, maxOf(ns, un)*1.5)), []series{{xs: xs, ys: ns}}, []series{{xs: xs, ys: un}},
				"Each epoch's share of consecutive samples from the same clip; dashed: a uniform shuffle's."))
		}
		if len(names) > 0 && len(r.Epochs) > 1 {
			var ss []series
			for _, name := range names {
				s := series{name: name}
				for _, e := range r.Epochs {
					s.xs = append(s.xs, float64(e.Epoch))
					s.ys = append(s.ys, weightShare(e, name, names))
				}
				ss = append(ss, s)
			}
			first, last := float64(r.Epochs[0].Epoch), float64(r.Epochs[len(r.Epochs)-1].Epoch)
			plots = append(plots, lines("curriculum", "The curriculum: each source's weight by epoch", "epoch", "share of the epoch's weights",
				linear(first, max(first+1, last)), linearFixed(0, 1, 0.2), ss, nil,
				"Each source's weight over the epoch's weights added up, epoch by epoch (--weights, per epoch range)."))
		}
	}
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">%s<title>%s</title>\n", pageMark, html.EscapeString(title))
	b.WriteString("<style>body{font:14px sans-serif;margin:2em;color:#222}figure{display:inline-block;margin:1em}figcaption{max-width:520px}pre{background:#f6f6f6;padding:1em}</style></head><body>\n")
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

const (
	plotW, plotH       = 560, 310
	left, right        = 64, 16
	top, bottom        = 28, 48
	innerW, innerH     = plotW - left - right, plotH - top - bottom
	barFill, lineColor = "#4a7ab0", "#c04a30"
)

// palette: a series' colour (the first is lineColor).
var palette = []string{lineColor, "#4a7ab0", "#3a9a5a", "#a060b0", "#d09030", "#508f9f"}

// axis is a scale from values to [0, 1] of the plot's width or height,
// with its ticks: round steps (1, 2 or 5 times a power of ten), or the
// powers' 1, 2, 5 on a log axis.
type axis struct {
	lo, hi float64
	log    bool
	ticks  []float64
	step   float64
}

func (a axis) at(v float64) float64 {
	if a.log {
		if v <= 0 {
			return 0
		}
		return (math.Log(v) - math.Log(a.lo)) / (math.Log(a.hi) - math.Log(a.lo))
	}
	if a.hi == a.lo {
		return 0
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// niceStep is the round step (1, 2, 2.5 or 5 times a power of ten) that
// cuts span into about n parts.
func niceStep(span float64, n int) float64 {
	if span <= 0 || math.IsNaN(span) || math.IsInf(span, 0) {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// linear is an axis over [lo, hi] widened to round ticks (about 6).
func linear(lo, hi float64) axis {
	if hi <= lo {
		hi = lo + 1
	}
	step := niceStep(hi-lo, 6)
	return linearFixed(math.Floor(lo/step)*step, math.Ceil(hi/step)*step, step)
}

// linearFixed is the axis [lo, hi] with ticks every step.
func linearFixed(lo, hi, step float64) axis {
	a := axis{lo: lo, hi: hi, step: step}
	for v := lo; v <= hi+step/1e6; v += step {
		a.ticks = append(a.ticks, math.Round(v/step)*step)
	}
	return a
}

// logarithmic is a log axis over [lo, hi] (lo > 0), ticked at 1, 2, 5
// times the powers of ten in it.
func logarithmic(lo, hi float64) axis {
	a := axis{lo: lo, hi: hi, log: true}
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := m * p; v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				a.ticks = append(a.ticks, v)
			}
		}
	}
	return a
}

// label writes a tick value with the decimals its step has and no more
// (a step of 500: 1500; of 0.25: 0.75; of 0.0025: 0.0075).
func (a axis) label(v float64) string {
	if a.log || a.step >= 1 || a.step == 0 {
		if math.Abs(v) >= 1e6 {
			return strconv.FormatFloat(v, 'g', 3, 64)
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	d := 0 // the decimals the step has (0.25: 2)
	for s := a.step; d < 10 && math.Abs(s-math.Round(s)) > 1e-9*math.Max(1, s); s *= 10 {
		d++
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}

func axes(b *strings.Builder, title, xlabel, ylabel string, x, y axis) {
	fmt.Fprintf(b, `<text x="%d" y="18" font-size="14" font-weight="bold">%s</text>`, left, html.EscapeString(title))
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>`, left, top+innerH, left+innerW, top+innerH)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>`, left, top, left, top+innerH)
	for _, v := range x.ticks {
		px := float64(left) + float64(innerW)*x.at(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000"/><text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>`,
			px, top+innerH, px, top+innerH+4, px, top+innerH+16, x.label(v))
	}
	for _, v := range y.ticks {
		py := float64(top+innerH) - float64(innerH)*y.at(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#000"/><line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" font-size="11" text-anchor="end">%s</text>`,
			left-4, py, left, py, left+1, py, left+innerW, py, left-6, py+4, y.label(v))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" text-anchor="middle">%s</text>`, left+innerW/2, plotH-8, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text x="14" y="%d" font-size="12" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>`, top+innerH/2, top+innerH/2, html.EscapeString(ylabel))
}

func figure(id, svg, caption string) string { return figureLegend(id, svg, caption, "") }

// figureLegend is a figure whose caption starts with legend (HTML).
func figureLegend(id, svg, caption, legend string) string {
	if legend != "" {
		legend += "<br>"
	}
	return fmt.Sprintf("<figure id=%q>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">%s</svg>\n<figcaption>%s%s</figcaption></figure>\n",
		id, plotW, plotH, plotW, plotH, svg, legend, html.EscapeString(caption))
}

// bars is a histogram: counts over the bins between edges (len(counts)+1),
// on the x axis x.
func bars(id, title, xlabel, ylabel string, edges []float64, counts []int64, x axis, caption string) string {
	var b strings.Builder
	var ymax int64 = 1
	for _, c := range counts {
		ymax = max(ymax, c)
	}
	y := linear(0, float64(ymax))
	if y.step < 1 {
		y = linearFixed(0, math.Max(1, math.Ceil(float64(ymax))), 1)
	}
	axes(&b, title, xlabel, ylabel, x, y)
	for i, c := range counts {
		if c == 0 {
			continue
		}
		x0 := float64(left) + float64(innerW)*x.at(edges[i])
		x1 := float64(left) + float64(innerW)*x.at(edges[i+1])
		h := float64(innerH) * y.at(float64(c))
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`,
			x0+0.5, float64(top+innerH)-h, max(1, x1-x0-1), h, barFill)
	}
	return figure(id, b.String(), caption)
}

// series is one named curve.
type series struct {
	name   string
	xs, ys []float64
}

// lines draws curves (a point each value; NaN skipped) on axes x and y,
// and dashed reference lines (targets, in the colours of the curves of
// their index), with a legend when they are named.
func lines(id, title, xlabel, ylabel string, x, y axis, ss, targets []series, caption string) string {
	var b strings.Builder
	axes(&b, title, xlabel, ylabel, x, y)
	pos := func(xv, yv float64) (float64, float64) {
		yv = math.Min(math.Max(yv, y.lo), y.hi)
		return float64(left) + float64(innerW)*x.at(xv), float64(top+innerH) - float64(innerH)*y.at(yv)
	}
	for i, s := range targets {
		var pts []string
		for k := range s.xs {
			px, py := pos(s.xs[k], s.ys[k])
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="6 4" opacity="0.8"/>`,
			strings.Join(pts, " "), palette[i%len(palette)])
	}
	for i, s := range ss {
		colour := palette[i%len(palette)]
		var pts []string
		for k := range s.xs {
			if math.IsNaN(s.ys[k]) {
				continue
			}
			px, py := pos(s.xs[k], s.ys[k])
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
		}
		fmt.Fprintf(&b, `<polyline class="curve" points="%s" fill="none" stroke="%s" stroke-width="2"/>`, strings.Join(pts, " "), colour)
		if len(pts) <= 30 {
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], colour)
			}
		}
	}
	// The legend, in the caption: a colour square and the name of each
	// named curve.
	var legend []string
	for i, s := range ss {
		if s.name != "" {
			legend = append(legend, fmt.Sprintf(`<span style="color:%s">&#9632;</span>&nbsp;%s`, palette[i%len(palette)], html.EscapeString(s.name)))
		}
	}
	return figureLegend(id, b.String(), caption, strings.Join(legend, " &nbsp; "))
}

// epochPlots are an epoch's figures along it, per tenth of its whole
// batches (and, mixed, each source's share per group of batches), each
// with what a uniform shuffle of its samples gives as a dashed line.
func epochPlots(r *EpochsReport, e EpochReport, names []string) []string {
	var xs, ys, ns []float64
	for t, q := range e.Tenths {
		xs = append(xs, float64(t*10+5))
		ys = append(ys, q.DistinctClipsMean)
		ns = append(ns, q.SameClipNeighbours)
	}
	pct := linearFixed(0, 100, 20)
	flat := func(v float64) []series { return []series{{xs: []float64{0, 100}, ys: []float64{v, v}}} }
	out := []string{lines(fmt.Sprintf("quality-%d", e.Epoch), fmt.Sprintf("Epoch %d: distinct clips per batch along the epoch", e.Epoch),
		"position in the epoch (%)", fmt.Sprintf("distinct clips per batch of %d", r.Batch), pct, linear(0, maxOf(ys, []float64{e.UniformDistinct})*1.15),
		[]series{{xs: xs, ys: ys}}, flat(e.UniformDistinct),
		fmt.Sprintf("%d samples; per tenth of the epoch's whole batches (overall %.1f); dashed: a uniform shuffle of these samples (%.1f). A degraded tail drops at the right.",
			e.Samples, e.Quality.DistinctClipsMean, e.UniformDistinct)),
		lines(fmt.Sprintf("neighbours-%d", e.Epoch), fmt.Sprintf("Epoch %d: same-clip neighbours along the epoch", e.Epoch),
			"position in the epoch (%)", "share of neighbours from one clip", pct, linear(0, max(0.01, maxOf(ns, []float64{3 * e.UniformNeighbours})*1.3)),
			[]series{{xs: xs, ys: ns}}, flat(e.UniformNeighbours),
			fmt.Sprintf("The share of consecutive samples from the same clip, per tenth (overall %.4f); dashed: a uniform shuffle's (%.4f). Near 1: clip order.",
				e.Quality.SameClipNeighbours, e.UniformNeighbours))}
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
func weightShare(e EpochReport, name string, names []string) float64 {
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
