package ui

import (
	"bytes"
	"math"
	"os"
	"regexp"
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

func TestJSONCountSize(t *testing.T) {
	if b, err := JSON(map[string]string{"what": "size 1 -> 2, <f2 & more"}); err != nil || string(b) != "{\n  \"what\": \"size 1 -> 2, <f2 & more\"\n}\n" {
		t.Errorf("JSON: %q %v", b, err)
	}
	// A NaN float64 is an error, never an empty output; Float is null.
	if b, err := JSON(map[string]float64{"x": math.NaN()}); err == nil || b != nil {
		t.Errorf("JSON of NaN: %q %v", b, err)
	}
	if b, err := JSON([]Float{Float(math.NaN()), Float(math.Inf(-1)), 1.5}); err != nil || string(b) != "[\n  null,\n  null,\n  1.5\n]\n" {
		t.Errorf("JSON of Float: %q %v", b, err)
	}
	// Escaping: what a terminal would act on, never newlines in lines mode.
	if got := OneLine("a\x1b]0;x\x07\u202eb\xff\nc"); got != `a\x1b]0;x\x07\u202eb\xff c` {
		t.Errorf("OneLine: %q", got)
	}
	if Count(1, "clip") != "1 clip" || Count(0, "problem") != "0 problems" || Count(12, "sample") != "12 samples" {
		t.Error("Count")
	}
	for s, want := range map[string]int64{"2GiB": 2 << 30, "512MiB": 512 << 20, "1G": 1 << 30, "1.5KiB": 1536, "10MB": 10e6, "0": 0, "4096B": 4096} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"64", "lots", "-1GiB", "1e30GiB", ""} {
		if _, err := ParseSize(s); err == nil {
			t.Errorf("ParseSize(%q) succeeded", s)
		}
	}
}

// TestBytes: binary units throughout, as the size flags take them.
func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		256 << 20: "256.0 MiB", 3 << 30: "3.0 GiB", 5 << 40: "5.0 TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestNearest: a mistyped flag or command finds its name (a letter off, two
// swapped, one missing), and a word far from every name finds none.
func TestNearest(t *testing.T) {
	names := []string{"window", "windows-per-clip", "epochs", "epoch-range", "deep", "seed"}
	for in, want := range map[string]string{"windwo": "window", "widow": "window", "epoch": "epochs", "epcohs": "epochs", "deeep": "deep", "zzz": "", "x": "", "sede": "seed"} {
		if got := Nearest(in, names); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOneVersion (#64.9): the binary's version is the Python package's
// (the wheel's, python/pyproject.toml, and clipshard.__version__).
func TestOneVersion(t *testing.T) {
	for _, f := range []struct{ path, pattern string }{
		{"../../python/pyproject.toml", `(?m)^version = "([^"]+)"$`},
		{"../../python/clipshard/__init__.py", `(?m)^__version__ = "([^"]+)"$`},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(f.pattern).FindSubmatch(b)
		if m == nil || string(m[1]) != Release {
			t.Fatalf("%s says version %q, the binary %q: give them one", f.path, m, Release)
		}
	}
}
