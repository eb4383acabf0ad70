// Plots in SVG: axes with round ticks, histograms, curves.

package inspectcmd

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

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

// epochAxis is an axis of epochs over [lo, hi]: ticks at whole epochs
// (about 6; an epoch 0.5 does not exist: #64.5).
func epochAxis(lo, hi float64) axis {
	if hi <= lo {
		hi = lo + 1
	}
	step := math.Max(1, math.Ceil(niceStep(hi-lo, 6)))
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
