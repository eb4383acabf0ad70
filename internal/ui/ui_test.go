package ui

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressPlain: without a terminal, a line at most every interval,
// with the detail text asked for only when a line is printed, and a last
// line at Finish; quiet prints nothing and never asks.
func TestProgressPlain(t *testing.T) {
	var out bytes.Buffer
	p := New("convert", "clips", 1000, false)
	p.w, p.every = &out, 20*time.Millisecond
	asked := 0
	detail := func() string { asked++; return "1 MB in" }
	start := time.Now()
	for i := range 1000 {
		p.Update(int64(i+1), detail)
		if i%100 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	elapsed := time.Since(start)
	p.Finish()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// At most one line per interval, plus the last one from Finish.
	if most := int(elapsed/p.every) + 1; len(lines) < 2 || len(lines) > most {
		t.Fatalf("%d lines for 1000 updates over %v at one per %v (want 2..%d):\n%s", len(lines), elapsed, p.every, most, out.String())
	}
	if asked != len(lines) {
		t.Fatalf("detail asked %d times for %d lines", asked, len(lines))
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "convert: 1000/1000 clips (100.0%), 1 MB in") {
		t.Fatalf("last line %q", last)
	}

	out.Reset()
	q := New("convert", "clips", 10, true)
	q.w, q.every = &out, 0
	q.Update(5, func() string { t.Fatal("quiet progress asked for its detail"); return "" })
	q.Finish()
	if out.Len() != 0 {
		t.Fatalf("quiet progress printed %q", out.String())
	}
}
