package main_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"
)

// TestPerClip: a per-clip modality (NAME@clip=) is stored one row per
// clip, listed in dataset.json, checked by numpy and by verify; the
// mistakes it exists for (a vector declared per frame, a scalar per
// frame) say what to write instead of suggesting --align trim.
func TestPerClip(t *testing.T) {
	buildTools(t) // verify
	src := copyDemo(t)
	clips := filepath.Join(src, "clips.txt")
	out := filepath.Join(t.TempDir(), "ds")
	withFPS := demoArgs(src, out, "-m", "fps@clip=motion/{clip}.pkl:fps", "--keep-dtype", "fps")
	r := runConvert(t, nil, withFPS...)
	if r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	d, err := manifests.LoadDataset(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, dtype string
		shape       []int
	}{{"shape", "<f2", []int{100}}, {"fps", "<i8", []int{}}} {
		m := d.Modality(c.name)
		if m == nil || !m.PerClip || m.Rate != 0 || m.Rows != 12 || m.DType != c.dtype || len(m.FrameShape) != len(c.shape) ||
			(len(c.shape) > 0 && m.FrameShape[0] != c.shape[0]) {
			t.Fatalf("dataset.json: %s: %+v", c.name, m)
		}
	}
	if m := d.Modality("motion"); m.PerClip || m.Rate != 1 || d.Frames != 599 {
		t.Fatalf("the per-clip modalities changed the clips' lengths: %+v, %d frames", m, d.Frames)
	}
	// fps is 30 in every clip: the kept int64 row of each.
	b, err := os.ReadFile(filepath.Join(out, "fps.npy"))
	if err != nil || len(b) != 4096+12*8 {
		t.Fatalf("fps.npy: %d bytes, %v", len(b), err)
	}
	for i := range 12 {
		if v := binary.LittleEndian.Uint64(b[4096+8*i:]); v != 30 {
			t.Fatalf("fps of clip %d: %d", i, v)
		}
	}
	numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_dataset.py"), out, clips, src)
	v := clitest.Run(t, filepath.Join(filepath.Dir(bin), "verify"), nil, "--deep", "--sources", out)
	if v.Code != 0 {
		t.Fatalf("verify: %d %s %s", v.Code, v.Stdout, v.Stderr)
	}

	// A damaged row of a per-clip blob is found, and named by clip.
	bad := filepath.Join(t.TempDir(), "bad")
	clitest.CopyTree(t, out, bad)
	blob := filepath.Join(bad, "shape.npy")
	sb, _ := os.ReadFile(blob)
	sb[4096+3*200+10] ^= 0x40 // clip003's row: 100 float16
	os.WriteFile(blob, sb, 0o644)
	v = clitest.Run(t, filepath.Join(filepath.Dir(bin), "verify"), nil, "--deep", bad)
	if v.Code == 0 || !strings.Contains(v.Stdout+v.Stderr, "clip003") || !strings.Contains(v.Stdout+v.Stderr, "xxh64 mismatch: rows 3..4") {
		t.Fatalf("verify of a damaged per-clip row: %d %s %s", v.Code, v.Stdout, v.Stderr)
	}

	mistakes := []struct {
		name string
		mods []string
		code int
		want string
	}{
		// The trap: shape [100] declared per frame.
		{"vector per frame", []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape=motion/{clip}.pkl:shape"}, 1,
			`if shape (float32[100]) holds one vector per clip rather than a value per frame, declare it shape@clip=...`},
		{"scalar per frame", []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "fps=motion/{clip}.pkl:fps"}, 1,
			`array is 0-d (int64[]), one value, but clips need a time axis [T, ...]; for one value per clip, declare the modality fps@clip=...`},
		{"int per clip", []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "fps@clip=motion/{clip}.pkl:fps"}, 1,
			`array is int64[], an integer/bool array; pass --allow-int to convert it to float16, or --keep-dtype fps to keep it`},
		{"only per clip", []string{"-m", "shape@clip=motion/{clip}.pkl:shape"}, 2,
			`every modality is per clip (@clip); at least one must have frames`},
		{"bad rate", []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clips=motion/{clip}.pkl:shape"}, 2,
			`rate "clips" is not an integer >= 1 (or "clip": one value per clip)`},
	}
	for _, c := range mistakes {
		t.Run(c.name, func(t *testing.T) {
			o := filepath.Join(t.TempDir(), "ds")
			r := runConvert(t, nil, append([]string{"--clips", clips, "--out", o, "--quiet"}, c.mods...)...)
			if r.Code != c.code || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
				t.Fatalf("exit %d, want %d and a line with %q:\n%s", r.Code, c.code, c.want, r.Stderr)
			}
			if strings.Contains(r.Stderr, "use --align trim") {
				t.Fatalf("suggests trimming: %s", r.Stderr)
			}
		})
	}

	// A per-clip value whose shape differs between clips is bad input,
	// naming both clips.
	numpytest.Run(t, "-c", `import pickle, sys, numpy as np
p = sys.argv[1]
d = pickle.load(open(p, "rb"))
d["shape"] = np.zeros(99, dtype=np.float32)
pickle.dump(d, open(p, "wb"), protocol=4)`, filepath.Join(src, "motion", "clip005.pkl"))
	r = runConvert(t, nil, demoArgs(src, filepath.Join(t.TempDir(), "ds"))...)
	if r.Code != 1 || !strings.Contains(r.Stderr, `clip "clip005": modality "shape": frame shape [99] differs from [100] of clip "clip000"`) {
		t.Fatalf("differing per-clip shapes: exit %d: %s", r.Code, r.Stderr)
	}
}

// TestPerClipTooLarge: a per-clip .npy value is read whole; one larger
// than the machine's memory (here a sparse file of 128 GiB whose header
// declares it all: a valid .npy) is refused in one line naming the file,
// the clip and its size, before anything is allocated (the Go runtime
// ended the process with "fatal error: runtime: out of memory" and a
// stack dump), and nothing is left under --out; verify --sources says the
// same of such a source instead of dying.
func TestPerClipTooLarge(t *testing.T) {
	buildTools(t) // verify
	src := copyDemo(t)
	clips := filepath.Join(src, "clips.txt")
	os.Mkdir(filepath.Join(src, "emb"), 0o755)
	b, _ := os.ReadFile(clips)
	var ids []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			ids = append(ids, l)
		}
	}
	write := func(id string, n int) {
		h, err := npy.EncodeHeader("<f4", false, []int{n}, 128)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(src, "emb", id+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.Write(h)
		if err := f.Truncate(int64(len(h)) + 4*int64(n)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		write(id, 16)
	}
	out := filepath.Join(t.TempDir(), "ds")
	args := demoArgs(src, out, "-m", "emb@clip=emb/{clip}.npy")
	if r := runConvert(t, nil, args...); r.Code != 0 {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	write(ids[3], 32<<30) // 128 GiB, sparse
	bad := filepath.Join(src, "emb", ids[3]+".npy")
	out2 := filepath.Join(t.TempDir(), "ds")
	r := runConvert(t, nil, demoArgs(src, out2, "-m", "emb@clip=emb/{clip}.npy")...)
	for _, want := range []string{bad, `clip "` + ids[3] + `"`, `modality "emb"`, "137438953600 bytes (128.0GiB) to read whole", "is it a time series"} {
		if r.Code != 1 || !strings.Contains(r.Stderr, want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Fatalf("exit %d, want 1 and one line with %q:\n%s", r.Code, want, r.Stderr)
		}
	}
	if _, err := os.Stat(out2); !os.IsNotExist(err) {
		t.Fatalf("--out after a refused run: %v", err)
	}
	v := clitest.Run(t, filepath.Join(filepath.Dir(bin), "verify"), nil, "--sources", out)
	if all := v.Stdout + v.Stderr; v.Code != 1 || !strings.Contains(all, bad) || !strings.Contains(all, "128.0GiB) to read whole") || strings.Contains(all, "goroutine") {
		t.Fatalf("verify --sources with a 128 GiB per-clip source: %d %s %s", v.Code, v.Stdout, v.Stderr)
	}
}
