package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
)

// fileState is what a refused write must leave as it was: the kind of
// file, its identity and its bytes.
type fileState struct {
	mode os.FileMode
	ino  uint64
	data []byte
	link string
}

func stateOf(t *testing.T, p string) fileState {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	s := fileState{mode: fi.Mode(), ino: fi.Sys().(*syscall.Stat_t).Ino}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		s.link, _ = os.Readlink(p)
	case fi.Mode().IsRegular():
		s.data, _ = os.ReadFile(p)
	}
	return s
}

// TestInspectHTMLRefuses (round 4, point 1): --html writes only a path
// that does not exist, or replaces a page inspect wrote; a device, a
// FIFO, a socket, a directory, a symlink, a manifest, a file inside a
// dataset or an epochs folder and any other file are refused, exit 2, one
// line, and left exactly as they were; --force replaces only a regular
// file outside clipshard's folders. (Before: the page was renamed over
// whatever FILE was, /dev/null included.)
func TestInspectHTMLRefuses(t *testing.T) {
	ds, ep := demo(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	user := filepath.Join(dir, "notes.html")
	os.WriteFile(user, []byte("<html>the user's own page</html>\n"), 0o644)
	page := filepath.Join(dir, "page.html")
	if r := clip(t, "inspect", "--html", page, ds); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	linkToPage := filepath.Join(dir, "link.html")
	os.Symlink(page, linkToPage)
	linkToNothing := filepath.Join(dir, "dangling.html")
	os.Symlink(filepath.Join(dir, "nothing"), linkToNothing)
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	refused := []string{fifo, sub, user, linkToPage, linkToNothing, sock,
		filepath.Join(ds, "dataset.json"), filepath.Join(ds, "new.html"), filepath.Join(ep, "epochs.json"),
		filepath.Join(ep, "epoch-0000", "shard-00000.samples.npy"), filepath.Join(ep, "epoch-0000", "new.html")}
	if os.Geteuid() == 0 { // a character device of our own, the same as /dev/null
		dev := filepath.Join(dir, "null")
		if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
			t.Fatal(err)
		}
		refused = append(refused, dev)
	} else {
		t.Log("not root: the character-device case needs mknod (run as root)")
	}
	forceRefused := map[string]bool{user: false}
	for _, p := range refused {
		var before fileState
		_, err := os.Lstat(p)
		exists := err == nil
		if exists {
			before = stateOf(t, p)
		}
		for _, args := range [][]string{{"inspect", "--html", p, ds}, {"inspect", "--html", p, "--force", ds}} {
			r := clip(t, args...)
			if ok, isUser := forceRefused[p]; isUser && !ok && len(args) == 5 {
				continue // --force replaces the user's regular file: checked below
			}
			oneLine(t, r, 2, "clipshard inspect: ")
			if !strings.Contains(r.Stderr, p) {
				t.Fatalf("%s: the refusal does not name it: %s", p, r.Stderr)
			}
			if !exists {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s: written", p)
				}
				continue
			}
			if after := stateOf(t, p); after.mode != before.mode || after.ino != before.ino || !bytes.Equal(after.data, before.data) || after.link != before.link {
				t.Fatalf("%v: %s changed: %+v -> %+v", args, p, before.mode, after.mode)
			}
		}
	}
	// The dataset is still intact (its manifest was not replaced).
	if r := clip(t, "verify", ds); r.Code != 0 {
		t.Fatal(r.Stdout, r.Stderr)
	}
	// An earlier page is replaced; so is the user's file with --force.
	for _, p := range []string{page, user} {
		args := []string{"inspect", "--html", p, ep}
		if p == user {
			args = []string{"inspect", "--html", p, "--force", ep}
		}
		if r := clip(t, args...); r.Code != 0 {
			t.Fatalf("%v: %s", args, r.Stderr)
		}
		if b, _ := os.ReadFile(p); !bytes.Contains(b, []byte("clipshard epochs")) {
			t.Fatalf("%s: not replaced by the epochs page", p)
		}
	}
	oneLine(t, clip(t, "inspect", "--force", ds), 2, "clipshard inspect: --force is for --html")
	// Nothing was left beside them.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".clipshard") {
			t.Fatalf("left %s", e.Name())
		}
	}
}

// nonfinite is a dataset (and an epochs folder cut from it) whose clip c1
// has an all-NaN feature 0 and an all-+Inf feature 1, and clip c2 is all
// -Inf.
func nonfinite(t *testing.T) (ds, ep string) {
	t.Helper()
	src := t.TempDir()
	for i, rows := range []int{10, 20, 30} {
		clitest.WriteF32(t, filepath.Join(src, "x", fmt.Sprintf("c%d.npy", i)), rows, 3, func(r, c int) float32 {
			switch {
			case i == 1 && c == 0:
				return float32(math.NaN())
			case i == 1 && c == 1 || i == 2:
				return float32(math.Inf(1 - 2*(i-1)))
			}
			return float32(r*4 + c)
		})
	}
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte("c0\nc1\nc2\n"), 0o644)
	ds = filepath.Join(t.TempDir(), "ds")
	if r := clip(t, "convert", "--quiet", "--allow-nonfinite", "--clips", filepath.Join(src, "clips.txt"), "--out", ds, "-m", "x=x/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	ep = filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "1"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return ds, ep
}

// TestInspectNonFiniteJSON (round 4, points 3 and 12): --json of a clip
// or a sample holding NaN and Inf is valid JSON, non-finite figures null
// beside their counts (it printed an empty line, exit 0); the text shows
// an all-Inf feature's min and max as inf (not NaN); a failed write of
// the output exits non-zero; --fps NaN or Inf is refused.
func TestInspectNonFiniteJSON(t *testing.T) {
	ds, ep := nonfinite(t)
	v := inspectJSON(t, "--clip", "c1", ds)
	f := v["clip"].(map[string]any)["modalities"].([]any)[0].(map[string]any)
	if f["nan"].(float64) != 20 || f["inf"].(float64) != 20 {
		t.Fatalf("c1 counts: %v", f)
	}
	for _, k := range []string{"mean", "std", "min", "max"} {
		if got := f[k].([]any); got[0] != nil || got[1] != nil || got[2] == nil {
			t.Fatalf("c1 %s: %v, want null, null, a number", k, got)
		}
	}
	v = inspectJSON(t, "--clip", "c2", ds)
	f = v["clip"].(map[string]any)["modalities"].([]any)[0].(map[string]any)
	if f["inf"].(float64) != 90 || f["min"].([]any)[0] != nil {
		t.Fatalf("c2: %v", f)
	}
	for i := 0; i < 3; i++ { // whichever clips the samples are of
		inspectJSON(t, "--sample", fmt.Sprintf("0:%d", i), ep)
	}
	r := clip(t, "inspect", "--clip", "c2", ds)
	if r.Code != 0 || !strings.Contains(r.Stdout, "min -Inf max -Inf") {
		t.Fatalf("text of an all -Inf clip: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	// #64.10: --clip shows the clip under one line naming its dataset, not
	// the whole dataset's summary first.
	if first, _, _ := strings.Cut(r.Stdout, "\n"); !strings.HasPrefix(first, "dataset "+ds+": ") || !strings.Contains(first, "; clip c2 (row ") ||
		strings.Contains(r.Stdout, "clip lengths") || strings.Contains(r.Stdout, "values of ") {
		t.Fatalf("inspect --clip: %s", r.Stdout)
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	defer full.Close()
	for _, args := range [][]string{{"inspect", "--json", ds}, {"inspect", ds}, {"inspect", "--json", ep}} {
		cmd := exec.Command(bin, args...)
		cmd.Stdout = full
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "no space left") {
			t.Fatalf("%v > /dev/full: %v %s", args, err, stderr.String())
		}
	}
	for _, fps := range []string{"NaN", "Inf", "-1", "0"} {
		oneLine(t, clip(t, "inspect", "--fps", fps, ds), 2, "clipshard inspect: ")
	}
}

// rawControl reports whether s holds a control character other than
// newline and tab, or a bidi control: what a terminal would act on.
func rawControl(s string) bool {
	for _, r := range s {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x202e || r == 0x2066 || r == 0x200f {
			return true
		}
	}
	return false
}

// TestControlCharactersInIDs (round 4, point 9): convert refuses a clip
// id holding ESC, BEL, DEL, a C1 control, a bidi override or a byte that
// is not UTF-8 (exit 2, naming the line); and the printers escape such
// characters where they come from files (a dataset written before, whose
// clips.txt holds an OSC title sequence): inspect's text, its errors and
// verify's lines hold none raw (before: inspect printed them, and the
// title sequence ran).
func TestControlCharactersInIDs(t *testing.T) {
	src := t.TempDir()
	bad := []string{"b\x1b]0;pwned\x07", "c\x07", "d\u202ecba", "e\x7f", "f\u0085g", "g\xff", "h\u2066"}
	clitest.WriteF32(t, filepath.Join(src, "x", "a.npy"), 8, 2, func(r, c int) float32 { return float32(r) })
	for i, id := range bad {
		list := filepath.Join(src, fmt.Sprintf("clips%d.txt", i))
		os.WriteFile(list, []byte("a\n"+id+"\n"), 0o644)
		out := filepath.Join(t.TempDir(), "ds")
		r := clip(t, "convert", "--quiet", "--clips", list, "--out", out, "-m", "x=x/{clip}.npy")
		oneLine(t, r, 2, "clipshard convert: ")
		if !strings.Contains(r.Stderr, "line 2") || rawControl(r.Stderr) {
			t.Fatalf("id %q: %q", id, r.Stderr)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("id %q: wrote %s", id, out)
		}
	}
	// A dataset of safe ids whose clips.txt is then edited (sums updated).
	list := filepath.Join(src, "clips.txt")
	os.WriteFile(list, []byte("a\nb\n"), 0o644)
	ds := filepath.Join(t.TempDir(), "ds")
	os.MkdirAll(filepath.Join(src, "y"), 0o755)
	clitest.WriteF32(t, filepath.Join(src, "y", "a.npy"), 8, 2, func(r, c int) float32 { return float32(r) })
	clitest.WriteF32(t, filepath.Join(src, "y", "b.npy"), 9, 2, func(r, c int) float32 { return float32(r) })
	if r := clip(t, "convert", "--quiet", "--clips", list, "--out", ds, "-m", "x=y/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	os.WriteFile(filepath.Join(ds, "clips.txt"), []byte("a\x1b]0;pwned\x07\nb\u202e\n"), 0o644)
	clitest.Resum(t, ds, "clips.txt")
	for _, args := range [][]string{{"inspect", ds}, {"inspect", "--clip", "#1", ds}, {"verify", "--deep", ds}, {"inspect", "--html", filepath.Join(t.TempDir(), "p.html"), ds}} {
		r := clip(t, args...)
		if rawControl(r.Stdout) || rawControl(r.Stderr) {
			t.Fatalf("%v printed control characters raw: %q %q", args, r.Stdout, r.Stderr)
		}
		if r.Code == 0 && args[1] != "--html" && !strings.Contains(r.Stdout+r.Stderr, `\x1b`) && !strings.Contains(r.Stdout+r.Stderr, `\u202e`) {
			t.Logf("%v: the ids are not shown: %q", args, r.Stdout)
		}
	}
}

// TestInspectDamagedManifests (round 4, points 6 and 8): inspect checks
// what it reads as verify's structure check does (the same loaders:
// manifests.Vouch, manifests.VouchEpochs) and refuses a damaged dataset or
// epochs folder with one line naming the file and what is wrong, exit 1,
// even with the sums updated to match. Before: frame_shape [1e9,1e9] was
// an internal error, an index row starting at -100 printed the .npy
// header as rows, a 10^15-frame row showed "max 1e15 frames", and
// samples with clip -5, start -3 or valid 10^9 were shown as they are.
func TestInspectDamagedManifests(t *testing.T) {
	ds, ep := demo(t)
	editJSON := func(dir, file, old, new string) string {
		t.Helper()
		d := filepath.Join(t.TempDir(), filepath.Base(dir))
		clitest.CopyTree(t, dir, d)
		p := filepath.Join(d, file)
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), old) {
			t.Fatalf("%s has no %q", file, old)
		}
		os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0o644)
		clitest.Resum(t, d, file)
		return d
	}
	editIndex := func(row, col int, v int64) string {
		d := filepath.Join(t.TempDir(), "ds")
		clitest.CopyTree(t, ds, d)
		p := filepath.Join(d, "index.npy")
		b, _ := os.ReadFile(p)
		h, err := npy.ParseHeader(b, int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(b[h.DataOffset+int64(16*row+8*col):], uint64(v))
		os.WriteFile(p, b, 0o644)
		clitest.Resum(t, d, "index.npy")
		return d
	}
	editSamples := func(col int, v int64) string {
		d := filepath.Join(t.TempDir(), "ep")
		clitest.CopyTree(t, ep, d)
		rel := "epoch-0000/shard-00000.samples.npy"
		p := filepath.Join(d, rel)
		b, _ := os.ReadFile(p)
		h, err := npy.ParseHeader(b, int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(b[h.DataOffset+int64(24*3+8*col):], uint64(v))
		os.WriteFile(p, b, 0o644)
		clitest.Resum(t, d, rel)
		return d
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"frame_shape 1e9x1e9", []string{editJSON(ds, "dataset.json", `"frame_shape": [
        64
      ]`, `"frame_shape": [1000000000, 1000000000]`)}, "whisper.npy: header shape"},
		{"index start -100", []string{"--clip", "#3", editIndex(3, 0, -100)}, "index.npy says -100"},
		{"index length 1e15", []string{editIndex(5, 1, 1e15)}, "index.npy"},
		{"sample clip -5", []string{editSamples(0, -5)}, "sample 3: clip -5"},
		{"sample clip 1e15", []string{"--sample", "0:3", editSamples(0, 1e15)}, "sample 3: clip 1000000000000000; its source has 12 clips"},
		{"sample start -3", []string{editSamples(1, -3)}, "sample 3: start -3"},
		{"sample valid 1e9", []string{editSamples(2, 1e9)}, "sample 3: valid 1000000000 frames"},
		{"epochs frame_shape", []string{editJSON(ep, "epochs.json", `"window_rows": 2`, `"window_rows": 1000000000000`)}, "header"},
	} {
		r := clip(t, append([]string{"inspect"}, c.args...)...)
		oneLine(t, r, 1, "clipshard inspect: ")
		if !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%s: %q, want it to name %q", c.name, r.Stderr, c.want)
		}
		if strings.Contains(r.Stderr, "internal error") {
			t.Errorf("%s: %s", c.name, r.Stderr)
		}
	}
}

// TestInspectManifestBound (round 4, point 12): a 300 MB dataset.json or
// epochs.json is refused at once, naming its size and the bound, as the
// Python readers refuse it (it was parsed, at 1.4 GB of memory).
func TestInspectManifestBound(t *testing.T) {
	ds, ep := demo(t)
	for _, c := range []struct{ dir, file string }{{ds, "dataset.json"}, {ep, "epochs.json"}} {
		d := filepath.Join(t.TempDir(), "x")
		clitest.CopyTree(t, c.dir, d)
		if err := os.Truncate(filepath.Join(d, c.file), 300<<20); err != nil {
			t.Fatal(err)
		}
		r := clip(t, "inspect", d)
		oneLine(t, r, 1, "clipshard inspect: ")
		if !strings.Contains(r.Stderr, c.file) || !strings.Contains(r.Stderr, "268435456") || r.Elapsed > 5*time.Second {
			t.Fatalf("%s of 300 MB: %q in %v", c.file, r.Stderr, r.Elapsed)
		}
	}
}
