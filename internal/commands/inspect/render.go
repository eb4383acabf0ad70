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
		var xs []float64
		for i := range r.Histogram {
			xs = append(xs, (r.LengthEdge[i]+r.LengthEdge[i+1])/2)
		}
		plots = append(plots, bars("clip-lengths", "Clip lengths", "clip length (frames)", "clips", xs, r.Histogram,
			fmt.Sprintf("%d clips, %d to %d frames (median %d).", r.Clips, r.Lengths.Min, r.Lengths.Max, r.Lengths.Median)))
		for _, m := range r.Modalities {
			var xs []float64
			for i := range m.Values.Counts {
				xs = append(xs, m.Values.Lo+(m.Values.Hi-m.Values.Lo)*(float64(i)+0.5)/float64(len(m.Values.Counts)))
			}
			plots = append(plots, bars("values-"+m.Name, "Values of "+m.Name, "value ("+m.DType+")", "values", xs, m.Values.Counts,
				fmt.Sprintf("%d values of %d rows read evenly across the blob (of %d); NaN %d, Inf %d.", m.Values.Values, m.Sampled, m.Rows, m.Values.NaN, m.Values.Inf)))
		}
	case *EpochsReport:
		title = "clipshard epochs " + r.Dir
		for _, e := range r.Epochs {
			var xs, ys, ns []float64
			for t, q := range e.Tenths {
				xs = append(xs, float64(t*10+5))
				ys = append(ys, q.DistinctClipsMean)
				ns = append(ns, q.SameClipNeighbours)
			}
			plots = append(plots, line(fmt.Sprintf("quality-%d", e.Epoch), fmt.Sprintf("Epoch %d: distinct clips per batch along the epoch", e.Epoch),
				"position in the epoch (%)", fmt.Sprintf("distinct clips per batch of %d", r.Batch), xs, ys,
				fmt.Sprintf("%d samples; a uniform shuffle keeps the curve flat; a degraded tail drops at the right.", e.Samples)))
			plots = append(plots, line(fmt.Sprintf("neighbours-%d", e.Epoch), fmt.Sprintf("Epoch %d: same-clip neighbours along the epoch", e.Epoch),
				"position in the epoch (%)", "share of neighbours from one clip", xs, ns,
				"The share of consecutive samples from the same clip, per tenth of the epoch."))
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
	plotW, plotH       = 520, 300
	left, right        = 64, 16
	top, bottom        = 28, 48
	innerW, innerH     = plotW - left - right, plotH - top - bottom
	barFill, lineColor = "#4a7ab0", "#c04a30"
)

func axes(b *strings.Builder, title, xlabel, ylabel string, x0, x1, y0, y1 float64) {
	fmt.Fprintf(b, `<text x="%d" y="18" font-size="14" font-weight="bold">%s</text>`, left, html.EscapeString(title))
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>`, left, top+innerH, left+innerW, top+innerH)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>`, left, top, left, top+innerH)
	for i := 0; i <= 4; i++ {
		xv := x0 + (x1-x0)*float64(i)/4
		px := left + innerW*i/4
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/><text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>`,
			px, top+innerH, px, top+innerH+4, px, top+innerH+16, tick(xv))
		yv := y0 + (y1-y0)*float64(i)/4
		py := top + innerH - innerH*i/4
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/><text x="%d" y="%d" font-size="11" text-anchor="end">%s</text>`,
			left-4, py, left, py, left-6, py+4, tick(yv))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" text-anchor="middle">%s</text>`, left+innerW/2, plotH-8, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text x="14" y="%d" font-size="12" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>`, top+innerH/2, top+innerH/2, html.EscapeString(ylabel))
}

func tick(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e7 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func figure(id, svg, caption string) string {
	return fmt.Sprintf("<figure id=%q>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">%s</svg>\n<figcaption>%s</figcaption></figure>\n",
		id, plotW, plotH, plotW, plotH, svg, html.EscapeString(caption))
}

// bars is a histogram: counts at bin centres xs.
func bars(id, title, xlabel, ylabel string, xs []float64, counts []int64, caption string) string {
	var b strings.Builder
	var ymax int64 = 1
	for _, c := range counts {
		ymax = max(ymax, c)
	}
	x0, x1 := 0.0, 1.0
	if len(xs) > 0 {
		half := 0.5
		if len(xs) > 1 {
			half = (xs[1] - xs[0]) / 2
		}
		if half == 0 {
			half = 0.5
		}
		x0, x1 = xs[0]-half, xs[len(xs)-1]+half // the bins' edges
	}
	axes(&b, title, xlabel, ylabel, x0, x1, 0, float64(ymax))
	n := max(1, len(counts))
	bw := float64(innerW) / float64(n)
	for i, c := range counts {
		h := float64(innerH) * float64(c) / float64(ymax)
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`,
			float64(left)+bw*float64(i)+0.5, float64(top+innerH)-h, max(0.5, bw-1), h, barFill)
	}
	return figure(id, b.String(), caption)
}

// line is a curve of ys over xs (a point per value).
func line(id, title, xlabel, ylabel string, xs, ys []float64, caption string) string {
	var b strings.Builder
	ymax := 0.0
	for _, y := range ys {
		if !math.IsNaN(y) {
			ymax = max(ymax, y)
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	axes(&b, title, xlabel, ylabel, 0, 100, 0, ymax)
	var pts []string
	for i := range xs {
		y := ys[i]
		if math.IsNaN(y) {
			y = 0
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(left)+float64(innerW)*xs[i]/100, float64(top+innerH)-float64(innerH)*y/ymax))
	}
	fmt.Fprintf(&b, `<polyline class="curve" points="%s" fill="none" stroke="%s" stroke-width="2"/>`, strings.Join(pts, " "), lineColor)
	for _, p := range pts {
		xy := strings.Split(p, ",")
		fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], lineColor)
	}
	return figure(id, b.String(), caption)
}
