// Package ui draws progress for the clipshard commands on stderr: a bar
// (github.com/schollz/progressbar/v3) when stderr is a terminal, a plain
// line every few seconds otherwise (batch logs), nothing when quiet.
// Libraries report progress as values; only the commands use this package.
package ui

import (
	"github.com/clipshard/clipshard/internal/textsafe"

	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Progress draws one task's progress.
type Progress struct {
	w       io.Writer
	name    string
	unit    string
	bar     *progressbar.ProgressBar
	every   time.Duration
	last    time.Time
	start   time.Time
	total   int64
	done    int64
	detail  func() string
	quiet   bool
	printed bool
}

// PlainInterval is how often plain progress lines are printed.
const PlainInterval = 5 * time.Second

// New returns a Progress for a task of total units named unit ("clips"),
// drawing on stderr. quiet draws nothing.
func New(name, unit string, total int64, quiet bool) *Progress {
	p := &Progress{w: os.Stderr, name: name, unit: unit, total: total, quiet: quiet, every: PlainInterval, start: time.Now()}
	p.last = p.start
	if quiet {
		return p
	}
	if term.IsTerminal(int(os.Stderr.Fd())) {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription(name),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString(unit),
			progressbar.OptionShowIts(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionShowDescriptionAtLineEnd(),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30),
		)
	}
	return p
}

// Update sets the units done. detail (may be nil) gives the text shown
// after them ("1.2 GB in, 850 MB out"); it is called only when a line or
// the bar is drawn, so that callers can report every item cheaply.
func (p *Progress) Update(done int64, detail func() string) {
	if p.quiet {
		return
	}
	p.done, p.detail = done, detail
	now := time.Now()
	if p.bar != nil {
		if now.Sub(p.last) >= barDescribe {
			p.last = now
			p.bar.Describe(p.name + " " + p.detailText())
		}
		p.bar.Set64(done)
		return
	}
	if now.Sub(p.last) >= p.every {
		p.last = now
		p.line()
	}
}

// barDescribe is how often the bar's text is refreshed (the bar itself
// throttles its drawing to the same interval).
const barDescribe = 100 * time.Millisecond

func (p *Progress) detailText() string {
	if p.detail == nil {
		return ""
	}
	return p.detail()
}

func (p *Progress) line() {
	pct := ""
	eta := ""
	if p.total > 0 {
		pct = fmt.Sprintf(" (%.1f%%)", 100*float64(p.done)/float64(p.total))
		if el := time.Since(p.start); p.done > 0 && p.done < p.total {
			rem := time.Duration(float64(el) * float64(p.total-p.done) / float64(p.done))
			eta = ", ETA " + rem.Round(time.Second).String()
		}
	}
	detail := p.detailText()
	if detail != "" {
		detail = ", " + detail
	}
	fmt.Fprintf(p.w, "%s: %d/%d %s%s%s%s\n", p.name, p.done, p.total, p.unit, pct, detail, eta)
	p.printed = true
}

// Finish clears the bar (or prints a last plain line if lines were printed).
func (p *Progress) Finish() {
	if p.quiet {
		return
	}
	if p.bar != nil {
		p.bar.Finish()
		return
	}
	if p.printed {
		p.line()
	}
}

// Bytes formats a byte count for people in binary units, the ones --mem
// and the other size flags take: "1.5 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// OneLine makes an error message a single line, with what a terminal
// would act on escaped (control and bidi characters: a clip id or path
// may hold them; see textsafe).
func OneLine(s string) string {
	return textsafe.Escape(strings.TrimSpace(strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)), false)
}

// SafeWriter escapes what a terminal would act on in each write (control
// and bidi characters; newlines and tabs kept): the text printers write
// through it, since the names they print come from files. A write is
// assumed to hold whole characters (fmt writes whole strings).
type SafeWriter struct{ W io.Writer }

func (s SafeWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(s.W, textsafe.Escape(string(p), true)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Fail prints err on w as one line prefixed with the command name (once).
func Fail(w io.Writer, cmd string, err error) {
	msg := OneLine(err.Error())
	// An error of the command's package starts with its short name
	// ("convert: ..."): under "clipshard convert" it is named once.
	short := cmd[strings.LastIndexByte(cmd, ' ')+1:]
	if rest, ok := strings.CutPrefix(msg, short+": "); ok {
		msg = rest
	}
	msg = cmd + ": " + msg
	fmt.Fprintln(w, msg)
}
