package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"
)

// demo: clitest.Demo with this package's command.
func demo(t *testing.T) (ds, ep string) { t.Helper(); return clitest.Demo(t, bin) }

func inspectJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	r := clip(t, append([]string{"inspect", "--json"}, args...)...)
	if r.Code != 0 {
		t.Fatalf("inspect %v: %d %s", args, r.Code, r.Stderr)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
		t.Fatalf("inspect %v: not JSON: %v %s", args, err, r.Stdout)
	}
	return v
}

// TestInspectDataset (#28.1): the figures of the demo dataset against its
// manifests and index, in text and JSON.
func TestInspectDataset(t *testing.T) {
	ds, _ := demo(t)
	d, err := manifests.LoadDataset(ds)
	if err != nil {
		t.Fatal(err)
	}
	_, lengths, err := manifests.ReadIndex(filepath.Join(ds, "index.npy"))
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := lengths[0], lengths[0]
	for _, l := range lengths {
		lo, hi = min(lo, l), max(hi, l)
	}
	r := clip(t, "inspect", ds)
	want := fmt.Sprintf("12 clips, %d frames", d.Frames)
	if r.Code != 0 || !strings.Contains(r.Stdout, want) || !strings.Contains(r.Stdout, fmt.Sprintf("min %d,", lo)) || !strings.Contains(r.Stdout, fmt.Sprintf("max %d,", hi)) {
		t.Fatalf("text: want %q and lengths %d..%d: %d %s %s", want, lo, hi, r.Code, r.Stdout, r.Stderr)
	}
	v := inspectJSON(t, "--rows", "100", ds)
	if v["clips"].(float64) != 12 || v["frames"].(float64) != float64(d.Frames) {
		t.Fatalf("json: %v", v)
	}
	l := v["clip_lengths"].(map[string]any)
	if l["Min"].(float64) != float64(lo) || l["Max"].(float64) != float64(hi) {
		t.Fatalf("lengths %v, index says %d..%d", l, lo, hi)
	}
	var hist float64
	for _, c := range v["length_histogram"].([]any) {
		hist += c.(float64)
	}
	if hist != 12 {
		t.Fatalf("the length histogram counts %v clips", hist)
	}
	for i, m := range v["modalities"].([]any) {
		m := m.(map[string]any)
		dm := d.Modalities[i]
		if m["name"] != dm.Name || m["rows"].(float64) != float64(dm.Rows) || m["sampled_rows"].(float64) != float64(min(100, dm.Rows)) {
			t.Fatalf("modality %v, manifest %+v", m, dm)
		}
		h := m["values"].(map[string]any)
		var n float64
		for _, c := range h["Counts"].([]any) {
			n += c.(float64)
		}
		per := 1
		for _, x := range dm.FrameShape {
			per *= x
		}
		if n+h["NaN"].(float64)+h["Inf"].(float64) != float64(min(100, dm.Rows)*int64(per)) {
			t.Fatalf("%s: histogram holds %v values, want %d", dm.Name, n, min(100, dm.Rows)*int64(per))
		}
	}
}

// TestInspectClip (#28.1): a clip's per-feature figures and its NaNs, at
// positions put there.
func TestInspectClip(t *testing.T) {
	src := t.TempDir()
	for i, rows := range []int{10, 20, 30} {
		clitest.WriteF32(t, filepath.Join(src, "x", fmt.Sprintf("c%d.npy", i)), rows, 3, func(r, c int) float32 {
			if i == 1 && ((r == 3 && c == 2) || (r == 17 && c == 0)) {
				return float32(math.NaN())
			}
			return float32(r*4 + c) // exact in float16
		})
	}
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte("c0\nc1\nc2\n"), 0o644)
	ds := filepath.Join(t.TempDir(), "ds")
	if r := clip(t, "convert", "--quiet", "--allow-nonfinite", "--clips", filepath.Join(src, "clips.txt"), "--out", ds, "-m", "x=x/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	v := inspectJSON(t, "--clip", "c1", ds)
	c := v["clip"].(map[string]any)
	f := c["modalities"].([]any)[0].(map[string]any)
	if c["frames"].(float64) != 20 || f["nan"].(float64) != 2 || fmt.Sprint(f["nan_at"]) != "[[3 2] [17 0]]" {
		t.Fatalf("clip c1: %v", c)
	}
	// Feature 1: 4r+1 over r = 0..19: mean 39, min 1, max 77.
	mean, lo, hi := f["mean"].([]any)[1].(float64), f["min"].([]any)[1].(float64), f["max"].([]any)[1].(float64)
	if mean != 39 || lo != 1 || hi != 77 {
		t.Fatalf("feature 1: mean %v min %v max %v, want 39 1 77", mean, lo, hi)
	}
	m := v["modalities"].([]any)[0].(map[string]any)
	if m["conversion"].(map[string]any)["nan"].(float64) != 2 || m["values"].(map[string]any)["NaN"].(float64) != 2 {
		t.Fatalf("dataset NaN counts: %v", m)
	}
	r := clip(t, "inspect", "--clip", "nope", ds)
	oneLine(t, r, 2, `clipshard inspect: --clip "nope": no such clip`)
}

// TestInspectWideRows (#28.4): rows so wide that --rows of them would
// hold more than 4M values are sampled on fewer, and the figures say so.
func TestInspectWideRows(t *testing.T) {
	src := t.TempDir()
	clitest.WriteF32(t, filepath.Join(src, "x", "c0.npy"), 100, 70000, func(r, c int) float32 { return float32(c % 7) })
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte("c0\n"), 0o644)
	ds := filepath.Join(t.TempDir(), "ds")
	if r := clip(t, "convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--out", ds, "-m", "x=x/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	m := inspectJSON(t, ds)["modalities"].([]any)[0].(map[string]any)
	if got := m["sampled_rows"].(float64); got != float64((4<<20)/70000) {
		t.Fatalf("sampled %v rows of 70000 values, want %d", got, (4<<20)/70000)
	}
}

// TestInspectEpochs (#28.2): the shuffle quality per tenth shows a
// degraded tail (the last tenth's samples made one clip's), and
// --sample gives a sample's row of the samples file.
func TestInspectEpochs(t *testing.T) {
	_, ep := demo(t)
	man, err := manifests.LoadEpochs(ep)
	if err != nil {
		t.Fatal(err)
	}
	e := man.Epochs[0]
	// The tail: every sample of the last tenth from clip 5.
	// Where inspect's last tenth starts: a tenth is a tenth of the whole
	// batches (of --batch 16), the remainder in the last.
	tail := e.Samples / 16 * 9 / 10 * 16
	for _, s := range e.Shards {
		p := filepath.Join(ep, s.Files["samples"])
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := npy.ParseHeader(b, int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < s.Samples; i++ {
			if s.First+int64(i) >= tail {
				binary.LittleEndian.PutUint64(b[h.DataOffset+int64(i)*24:], 5)
			}
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		clitest.Resum(t, ep, s.Files["samples"]) // a consistent folder (inspect checks the sums)
	}
	v := inspectJSON(t, "--batch", "16", ep)
	tenths := v["epochs"].([]any)[0].(map[string]any)["quality_by_tenth"].([]any)
	first, last := tenths[0].(map[string]any), tenths[9].(map[string]any)
	if first["distinct_clips_mean"].(float64) < 5 || last["distinct_clips_mean"].(float64) != 1 || last["same_clip_neighbours"].(float64) != 1 {
		t.Fatalf("quality by tenth: first %v, last %v", first, last)
	}
	r := clip(t, "inspect", "--batch", "16", ep)
	if r.Code != 0 || !strings.Contains(r.Stdout, "by tenth: distinct clips") {
		t.Fatalf("text: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	// Within --mem: a bounded stretch of each tenth, said so.
	v = inspectJSON(t, "--batch", "4", "--mem", "2KiB", ep)
	e0 := v["epochs"].([]any)[0].(map[string]any)
	if got := e0["measured_samples"].(float64); got != 80 || e0["samples"].(float64) <= 80 {
		t.Fatalf("--mem 2KiB: measured %v of %v samples, want 80 (2048/24 = 85, 8 a tenth)", got, e0["samples"])
	}
	if r := clip(t, "inspect", "--batch", "4", "--mem", "2KiB", ep); !strings.Contains(r.Stdout, "(measured on 80 of the") {
		t.Fatalf("text does not say the quality was sampled: %s", r.Stdout)
	}
	// --sample 1:I: the row of the samples file, and a window of each modality.
	s := man.Epochs[1].Shards[0]
	b, _ := os.ReadFile(filepath.Join(ep, s.Files["samples"]))
	h, _ := npy.ParseHeader(b, int64(len(b)))
	i := 3
	row := b[h.DataOffset+int64(i)*24:]
	v = inspectJSON(t, "--sample", fmt.Sprintf("1:%d", s.First+int64(i)), ep)
	sm := v["sample"].(map[string]any)
	if sm["clip_row"].(float64) != float64(binary.LittleEndian.Uint64(row)) || sm["start"].(float64) != float64(binary.LittleEndian.Uint64(row[8:])) ||
		sm["clip"] == "" || len(sm["modalities"].([]any)) != len(man.Modalities) {
		t.Fatalf("sample: %v", sm)
	}
	oneLine(t, clip(t, "inspect", "--sample", "9:0", ep), 2, `clipshard inspect: --sample "9:0"`)
	oneLine(t, clip(t, "inspect", "--sample", "x", ep), 2, `clipshard inspect: --sample "x"`)
}

// TestInspectBadInput: neither kind of folder, a damaged manifest, a FIFO,
// a wrong flag: one line each, exit 1 or 2, at once. A path that is not a
// clipshard folder (none there, a file, a folder of something else) is
// exit 2 for inspect as for verify.
func TestInspectBadInput(t *testing.T) {
	ds, _ := demo(t)
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, []byte("x"), 0o644)
	for _, p := range []string{t.TempDir(), filepath.Join(t.TempDir(), "none"), file} {
		oneLine(t, clip(t, "inspect", p), 2, "clipshard inspect: ")
		oneLine(t, clip(t, "verify", p), 2, "clipshard verify: ")
	}
	bad := filepath.Join(t.TempDir(), "ds")
	clitest.CopyTree(t, ds, bad)
	os.WriteFile(filepath.Join(bad, "dataset.json"), []byte("{not json"), 0o644)
	oneLine(t, clip(t, "inspect", bad), 1, "clipshard inspect: ")
	fifo := filepath.Join(t.TempDir(), "ds")
	clitest.CopyTree(t, ds, fifo)
	os.Remove(filepath.Join(fifo, "index.npy"))
	if err := syscall.Mkfifo(filepath.Join(fifo, "index.npy"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := clip(t, "inspect", fifo)
	oneLine(t, r, 1, "clipshard inspect: ")
	if !strings.Contains(r.Stderr, "index.npy") {
		t.Fatalf("the FIFO is not named: %s", r.Stderr)
	}
	ids := filepath.Join(t.TempDir(), "ds")
	clitest.CopyTree(t, ds, ids)
	os.Remove(filepath.Join(ids, "clips.txt"))
	if err := syscall.Mkfifo(filepath.Join(ids, "clips.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = clip(t, "inspect", ids)
	oneLine(t, r, 1, "clipshard inspect: ")
	if !strings.Contains(r.Stderr, "clips.txt") || r.Elapsed > 10*time.Second {
		t.Fatalf("a FIFO clips.txt: %s (%v)", r.Stderr, r.Elapsed)
	}
	oneLine(t, clip(t, "inspect", "--sample", "0:1", ds), 2, "clipshard inspect: --sample is for an epochs folder")
	oneLine(t, clip(t, "inspect", "--json", "--html", "x.html", ds), 2, "clipshard inspect: ")
	oneLine(t, clip(t, "inspect", "--html", "/nonexistent/x.html", ds), 1, "clipshard inspect: --html")
}

// TestInspectHTML (#28.3): the page is self-contained (inline SVG, no
// script, nothing fetched), has a plot per figure with axes and a caption,
// and renders in a real browser: headless Chromium's screenshot shows
// every plot's bars or curve drawn.
func TestInspectHTML(t *testing.T) {
	ds, ep := demo(t)
	dir := t.TempDir()
	pages := map[string]int{filepath.Join(dir, "ds.html"): 4, filepath.Join(dir, "ep.html"): 6} // plots: lengths + 3 modalities; 2 epochs x 2, and 2 across epochs
	for page, plots := range pages {
		target := ds
		if strings.HasSuffix(page, "ep.html") {
			target = ep
		}
		args := []string{"inspect", "--html", page, target}
		if target == ep {
			args = append(args, "--batch", "2") // (599 samples an epoch: 299 batches, figures by tenth)
		}
		if r := clip(t, args...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if n := strings.Count(s, "<svg"); n != plots || strings.Count(s, "<figcaption>") != plots {
			t.Fatalf("%s: %d plots, want %d", page, n, plots)
		}
		for _, bad := range []string{"<script", "http://", "https://", "<link", "<img"} {
			if strings.Contains(strings.ReplaceAll(s, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
				t.Fatalf("%s: not self-contained: holds %q", page, bad)
			}
		}
	}
	// #64.5: fewer than 10 batches of --batch (599 samples, 256): no figures
	// by tenth, said so, rather than tenths of 60 samples under an axis of
	// batches of 256.
	few := filepath.Join(dir, "few.html")
	if r := clip(t, "inspect", "--html", few, ep); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if b, _ := os.ReadFile(few); strings.Count(string(b), "<svg") != 2 || strings.Contains(string(b), "along the epoch") {
		t.Fatalf("%s: plots along epochs of fewer than 10 batches", few)
	}
	if r := clip(t, "inspect", ep); !strings.Contains(r.Stdout, "by tenth: none (fewer than 10 batches of 256)") {
		t.Fatalf("text of epochs of fewer than 10 batches: %s", r.Stdout)
	}
	if r := clip(t, "inspect", "--batch", "1000", ep); !strings.Contains(r.Stdout, "batches of 1000: no whole batch,") { // (599 samples an epoch)
		t.Fatalf("text of epochs of fewer than 10 batches: %s", r.Stdout)
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no chromium in CI (.ci/run installs Debian's chromium)")
		}
		t.Skip("no chromium: apt install chromium to render the page in a real browser")
	}
	for page, plots := range pages {
		shot := page + ".png"
		cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
			"--user-data-dir="+t.TempDir(), "--window-size=1200,2600", "--screenshot="+shot, "file://"+page)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("chromium: %v\n%s", err, out)
		}
		f, err := os.Open(shot)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		// Pixels of the bars' or the curves' colour: every plot drew some.
		want := [3]uint32{0x4a, 0x7a, 0xb0}
		if strings.HasSuffix(page, "ep.html") {
			want = [3]uint32{0xc0, 0x4a, 0x30}
		}
		colored := 0
		bounds := img.Bounds()
		for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
			for x := bounds.Min.X; x < bounds.Max.X; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if r>>8 == want[0] && g>>8 == want[1] && b>>8 == want[2] {
					colored++
				}
			}
		}
		if colored < 200*plots {
			t.Fatalf("%s: %d pixels of the plots' colour in the screenshot: the plots did not draw", page, colored)
		}
	}
}

// TestInspectMixed (#28's source shares, with #25): a folder mixed from
// two sources shows each source's samples, weight and share per batch
// (the figures against the samples files' source column), and --sample
// names the sample's source and its clip id there.
func TestInspectMixed(t *testing.T) {
	ds, _ := demo(t)
	// A second source: the demo dataset once more, under another name.
	ep := filepath.Join(t.TempDir(), "mixed")
	if r := clip(t, "shuffle", "--quiet", "--source", "x="+ds, "--source", "y="+ds, "--weights", "x=1,y=3", "--epoch-samples", "1000",
		"--out", ep, "--window", "1", "--epochs", "1", "--shard-samples", "64"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	man, err := manifests.LoadEpochs(ep)
	if err != nil {
		t.Fatal(err)
	}
	var fromFiles [2]float64
	for _, s := range man.Epochs[0].Shards {
		b, _ := os.ReadFile(filepath.Join(ep, s.Files["samples"]))
		h, _ := npy.ParseHeader(b, int64(len(b)))
		for i := 0; i < s.Samples; i++ {
			fromFiles[binary.LittleEndian.Uint64(b[h.DataOffset+int64(i)*32+24:])]++
		}
	}
	v := inspectJSON(t, "--batch", "100", ep)
	e0 := v["epochs"].([]any)[0].(map[string]any)
	counts := e0["source_counts"].(map[string]any)
	if counts["x"].(float64) != 250 || counts["y"].(float64) != 750 || fromFiles != [2]float64{250, 750} {
		t.Fatalf("counts %v, samples files %v", counts, fromFiles)
	}
	for i, s := range e0["quality"].(map[string]any)["sources"].([]any) {
		s := s.(map[string]any)
		if s["share"].(float64) != fromFiles[i]/1000 || math.Abs(s["mean_share"].(float64)-s["share"].(float64)) > 0.01 || s["worst_deviation"].(float64) > 2 {
			t.Fatalf("source %d: %v", i, s)
		}
	}
	r := clip(t, "inspect", ep, "--sample", "0:5")
	if r.Code != 0 || !strings.Contains(r.Stdout, "source y: 750 samples (weight 3), 75.0% of the epoch") || !strings.Contains(r.Stdout, "of sources x="+ds) ||
		!strings.Contains(r.Stdout, "sample 0:5: source ") {
		t.Fatalf("text: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	sm := inspectJSON(t, "--sample", "0:5", ep)["sample"].(map[string]any)
	if src := sm["source"]; (src != "x" && src != "y") || !strings.HasPrefix(sm["clip"].(string), "clip") {
		t.Fatalf("sample: %v", sm)
	}
}

// TestInspectHTMLKilled: a kill -9 of inspect --html while it writes the
// page (at each fault point of the write) leaves the folder as it was:
// the user's files and the previous page, and no temporary file (the page
// is written unnamed, O_TMPFILE, and linked only once whole).
func TestInspectHTMLKilled(t *testing.T) {
	ds, _ := demo(t)
	folder := t.TempDir()
	os.WriteFile(filepath.Join(folder, "notes.txt"), []byte("the user's"), 0o644)
	page := filepath.Join(folder, "report.html")
	if r := clip(t, "inspect", "--html", page, filepath.Join(ds, "..", "ep")); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	prev, _ := os.ReadFile(page)
	for point := 1; point <= 2; point++ { // atomicfile.half, atomicfile.written
		r := clitest.Run(t, bin, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", point)}, "inspect", "--html", page, ds)
		if r.Code != -1 {
			t.Fatalf("point %d: not killed: %d %s", point, r.Code, r.Stderr)
		}
		entries, _ := os.ReadDir(folder)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if b, _ := os.ReadFile(page); len(names) != 2 || !bytes.Equal(b, prev) {
			t.Fatalf("killed at point %d: the folder holds %v, the page %.40q", point, names, b)
		}
	}
	if r := clip(t, "inspect", "--html", page, ds); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if b, _ := os.ReadFile(page); !strings.HasPrefix(string(b), "<!DOCTYPE html>") {
		t.Fatalf("page: %.60q", b)
	}
	if st, _ := os.Stat(page); st.Mode().Perm() != 0o644 {
		t.Fatalf("page mode %v", st.Mode())
	}
}

// TestInspectPlots (#36.5): the page answers its questions. One clip of
// 6,000 frames among 100-frame ones: the others are binned over their own
// range (not all in one bar) and the long clip is named, apart; each value
// histogram's caption gives the whole blob's NaN/Inf counts from
// dataset.json. A mixed folder with a curriculum: each source's share
// along the epoch on a fixed 0-1 axis, and the weights by epoch. Every
// tick is a round number (no 29.8 or 1.53e+03).
func TestInspectPlots(t *testing.T) {
	src := t.TempDir()
	var ids strings.Builder
	for i := range 20 {
		id := fmt.Sprintf("c%02d", i)
		ids.WriteString(id + "\n")
		n := 100 + i
		if i == 7 {
			n = 6000
		}
		clitest.WriteF32(t, filepath.Join(src, "x", id+".npy"), n, 4, func(r, c int) float32 { return float32(r%97) / 10 })
	}
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte(ids.String()), 0o644)
	ds := filepath.Join(t.TempDir(), "ds")
	if r := clip(t, "convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--out", ds, "-m", "x=x/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	v := inspectJSON(t, ds)
	if v["length_scale"] != "clipped" {
		t.Fatalf("length_scale %v, want clipped", v["length_scale"])
	}
	// #64.6: the one clip that holds most of the frames is flagged, in the
	// JSON and the text (and so the page's summary), with the way out.
	if h := v["heavy_clips"].([]any); len(h) != 1 || h[0].(map[string]any)["clip"] != "c07" || h[0].(map[string]any)["share"].(float64) < 0.7 {
		t.Fatalf("heavy_clips %v, want c07 alone", v["heavy_clips"])
	}
	if r := clip(t, "inspect", ds); !strings.Contains(r.Stdout, "imbalance: c07 holds 74.") || !strings.Contains(r.Stdout, "--per-clip") {
		t.Fatalf("text: %s", r.Stdout)
	}
	if demoDS, _ := demo(t); len(inspectJSON(t, demoDS)["heavy_clips"].([]any)) != 0 {
		t.Fatal("the demo's clips (32 to 79 frames) flagged as heavy")
	}
	// And in its epochs (tile windows: c07, row 7, gives most samples),
	// while random windows, 2 a clip, flag none.
	for _, sampling := range []string{"tile", "random"} {
		ep := filepath.Join(t.TempDir(), "ep")
		args := []string{"shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "10", "--epochs", "1", "--sampling", sampling}
		if sampling == "random" {
			args = append(args, "--per-clip", "2")
		}
		if r := clip(t, args...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		h := inspectJSON(t, ep)["epochs"].([]any)[0].(map[string]any)["heavy_clips"].([]any)
		if sampling == "random" {
			if len(h) != 0 {
				t.Fatalf("random windows, 2 a clip: heavy_clips %v", h)
			}
			continue
		}
		if len(h) != 1 || h[0].(map[string]any)["row"] != float64(7) || h[0].(map[string]any)["share"].(float64) < 0.7 {
			t.Fatalf("tile windows: heavy_clips %v, want row 7 alone", h)
		}
		if r := clip(t, "inspect", ep); !strings.Contains(r.Stdout, "imbalance: clip row 7 holds 7") {
			t.Fatalf("epochs text: %s", r.Stdout)
		}
	}
	counts := v["length_histogram"].([]any)
	biggest := 0.0
	for _, c := range counts {
		biggest = max(biggest, c.(float64))
	}
	if biggest > 15 {
		t.Fatalf("one bar holds %v of 20 clips: %v", biggest, counts)
	}
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--source", "a="+ds, "--source", "b="+ds, "--weights", "0:1@a=1,b=1", "--weights", "1:@a=1,b=3",
		"--epoch-samples", "2000", "--out", ep, "--window", "4", "--epochs", "3"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	dir := t.TempDir()
	label := regexp.MustCompile(`text-anchor="(?:middle|end)">([^<]*)</text>`)
	for _, c := range []struct {
		target string
		want   []string
	}{
		{ds, []string{"1 clip longer, up to 6000 frames, left out of the axis: c07 (6000)", "In the whole blob (dataset.json): NaN 0, Inf 0"}},
		{ep, []string{`id="sources-0"`, `id="curriculum"`, "dashed: its share of the epoch", "dashed: a uniform shuffle", "&nbsp;a", "&nbsp;b"}},
	} {
		page := filepath.Join(dir, filepath.Base(c.target)+".html")
		if r := clip(t, "inspect", "--html", page, c.target); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		b, _ := os.ReadFile(page)
		// (#64.5: the summary's long lines wrap within the page)
		for _, w := range append(c.want, "white-space:pre-wrap") {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s: the page lacks %q", c.target, w)
			}
		}
		// #64.5: the curriculum is a staircase (each weight held over its
		// epoch: points in pairs of one height) on an axis of whole epochs.
		if c.target == ep {
			fig := regexp.MustCompile(`(?s)<figure id="curriculum">.*?</svg>`).FindString(string(b))
			pts := regexp.MustCompile(`class="curve" points="([^"]*)"`).FindStringSubmatch(fig)
			if pts == nil {
				t.Fatalf("no curriculum curve: %s", fig)
			}
			xy := strings.Fields(pts[1])
			for k := 0; k+1 < len(xy); k += 2 {
				if strings.Split(xy[k], ",")[1] != strings.Split(xy[k+1], ",")[1] {
					t.Fatalf("curriculum: a slope between %s and %s, not a step", xy[k], xy[k+1])
				}
			}
			for _, m := range label.FindAllStringSubmatch(fig, -1) {
				if strings.Contains(m[0], "middle") && strings.Contains(m[1], ".") {
					t.Fatalf("curriculum: an epoch tick %q", m[1])
				}
			}
		}
		// Each axis's ticks are a round step apart (1, 2, 2.5 or 5 times a
		// power of ten) and written with no exponent.
		for _, fig := range regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAllString(string(b), -1) {
			for _, anchor := range []string{"middle", "end"} {
				var ticks []float64
				for _, m := range label.FindAllStringSubmatch(fig, -1) {
					if v, err := strconv.ParseFloat(m[1], 64); err == nil && strings.Contains(m[0], anchor) {
						if strings.Contains(m[1], "e") {
							t.Errorf("%s: tick %q", c.target, m[1])
						}
						ticks = append(ticks, v)
					}
				}
				if len(ticks) < 2 {
					continue
				}
				step := math.Abs(ticks[1] - ticks[0])
				mant := step / math.Pow(10, math.Floor(math.Log10(step)))
				round := false
				for _, r := range []float64{1, 2, 2.5, 5} {
					round = round || math.Abs(mant-r) < 1e-6
				}
				for i := 1; i < len(ticks); i++ {
					round = round && math.Abs(math.Abs(ticks[i]-ticks[i-1])-step) < 1e-6*step
				}
				if !round {
					t.Errorf("%s: ticks %v are not a round step apart", c.target, ticks)
				}
			}
		}
	}
	share := regexp.MustCompile(`(?s)<figure id="sources-0">.*?</figure>`).FindString(string(mustRead(t, filepath.Join(dir, "ep.html"))))
	for _, tick := range []string{">0.0<", ">0.2<", ">1.0<"} {
		if !strings.Contains(share, tick) {
			t.Errorf("the shares' axis is not 0 to 1 in steps of 0.2: no %s", tick)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInspectShortClips (#64.2): inspect of epochs counts the dataset's
// clips shorter than the window and says what became of them.
func TestInspectShortClips(t *testing.T) {
	ds, _ := demo(t)
	for _, short := range []string{"skip", "pad"} {
		ep := filepath.Join(t.TempDir(), "ep")
		if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "50", "--epochs", "1", "--shard-samples", "8", "--short", short); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		got := inspectJSON(t, ep)
		if got["short_clips"] != float64(7) || got["short"] != short {
			t.Fatalf("--short %s: short_clips %v, short %v", short, got["short_clips"], got["short"])
		}
		want := map[string]string{"skip": "7 clips shorter than the window: left out", "pad": "7 clips shorter than the window: padded"}[short]
		if r := clip(t, "inspect", ep); r.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Fatalf("inspect, --short %s: %d %s", short, r.Code, r.Stdout)
		}
	}
}

// TestInspectStats (#64.6): dataset-wide per-feature mean, std, min and
// max (inspect --stats, clipshard.Dataset.feature_stats) equal numpy's
// over every row, for the demo dataset, one grown by convert --segments
// and its full twin (testdata/check_feature_stats.py); --stats of an
// epochs folder is a usage error.
func TestInspectStats(t *testing.T) {
	ds, ep := demo(t)
	src := clitest.DemoDir()
	dir := t.TempDir()
	l8 := filepath.Join(dir, "l8.txt")
	os.WriteFile(l8, []byte("clip000\nclip001\nclip002\nclip003\nclip004\nclip005\nclip006\nclip007\n"), 0o644)
	grown, twin := filepath.Join(dir, "grown"), filepath.Join(dir, "twin")
	mods := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy"}
	for _, args := range [][]string{
		append([]string{"convert", "--quiet", "--clips", l8, "--root", src, "--out", grown}, mods...),
		append([]string{"convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--root", src, "--out", grown, "--segments"}, mods...),
		append([]string{"convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--root", src, "--out", twin}, mods...),
	} {
		if r := clip(t, args...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
	}
	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_feature_stats.py"), bin, ds, grown, twin))
	if !strings.Contains(got, "ok: feature stats") {
		t.Fatalf("check_feature_stats: %s", got)
	}
	t.Log(strings.TrimSpace(got))
	if r := clip(t, "inspect", "--stats", ep); r.Code != 2 {
		t.Fatalf("inspect --stats of epochs: %d %s", r.Code, r.Stderr)
	}
	if r := clip(t, "inspect", "--stats", ds); r.Code != 0 || !strings.Contains(r.Stdout, "per-feature statistics over every row") {
		t.Fatalf("inspect --stats: %d %s", r.Code, r.Stdout)
	}
}
