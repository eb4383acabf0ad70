package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
)

// demoCopy copies testdata/demo into a temporary folder; if broken is set,
// that file of testdata/convert replaces clip003's source at dst.
func demoCopy(t *testing.T, broken, dst string) string {
	t.Helper()
	dir := t.TempDir()
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo"), dir)
	if broken != "" {
		b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "convert", broken))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func demoOptions(t *testing.T, src, out string) Options {
	var mods []Modality
	for _, s := range []string{"motion=motion/{clip}.pkl:exp+pose", "whisper@2=whisper/{clip}.npy", "emotion=emotion/{clip}.npy"} {
		m, err := ParseModality(s)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, m)
	}
	return Options{ClipList: filepath.Join(src, "clips.txt"), Modalities: mods, Out: out, Workers: 2,
		Now: func() time.Time { return time.Unix(1700000000, 0) }}
}

// checkSums checks every blob's recorded sha256 against the file.
func checkSums(t *testing.T, d *manifests.Dataset, dir string) {
	t.Helper()
	for _, m := range d.Modalities {
		b, err := os.ReadFile(filepath.Join(dir, m.File))
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		if got := hex.EncodeToString(s[:]); got != m.SHA256 {
			t.Errorf("%s: recorded sha256 %s, file has %s", m.File, m.SHA256, got)
		}
	}
	r, err := manifests.VerifyDataset(dir, manifests.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Errorf("verify: %+v", r.Problems)
	}
}

// TestEarlyHash converts the demo with the blobs' sha256 computed while
// they are written (the row counts predicted from the .npy headers), and
// in the cases where the prediction fails (a trimmed clip, a skipped
// clip, a missing source, a resumed run): the sums are right either way,
// and the output equals a conversion without prediction.
func TestEarlyHash(t *testing.T) {
	defer func(v int64) { predictMinClipBytes = v }(predictMinClipBytes)
	cases := []struct {
		name, broken, dst string
		align             string
		skip              bool
		early             int
	}{
		{"strict", "", "", "", false, 3},
		{"trimmed clip", "short_emotion.npy", "emotion/clip003.npy", "trim", false, 0},
		{"skipped clip", "truncated_motion.pkl", "motion/clip003.pkl", "", true, 0},
		{"missing .npy header", "", "", "", true, 0}, // whisper/clip005.npy removed below
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := demoCopy(t, c.broken, c.dst)
			if c.name == "missing .npy header" {
				os.Remove(filepath.Join(src, "whisper", "clip005.npy"))
			}
			outs := map[int64]string{}
			for _, minBytes := range []int64{0, 1 << 40} { // predict / never
				predictMinClipBytes = minBytes
				o := demoOptions(t, src, filepath.Join(t.TempDir(), "ds"))
				o.Align, o.SkipBadClips = c.align, c.skip
				res, err := Run(context.Background(), o)
				if err != nil {
					t.Fatal(err)
				}
				want := c.early
				if minBytes > 0 {
					want = 0
				}
				if res.EarlyHashed != want {
					t.Errorf("min %d: %d blobs hashed while written, want %d", minBytes, res.EarlyHashed, want)
				}
				checkSums(t, res.Dataset, o.Out)
				outs[minBytes] = o.Out
			}
			clitest.SameTree(t, clitest.Tree(t, outs[0]), clitest.Tree(t, outs[1<<40]), "with and without prediction")
		})
	}

	t.Run("resumed", func(t *testing.T) {
		predictMinClipBytes = 0
		src := demoCopy(t, "", "")
		o := demoOptions(t, src, filepath.Join(t.TempDir(), "ds"))
		o.Checkpoint = 0 // journal every clip
		ctx, cancel := context.WithCancel(context.Background())
		o.Progress = func(p Progress) {
			if p.Clips == 5 {
				cancel()
			}
		}
		if _, err := Run(ctx, o); !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted run: %v", err)
		}
		o.Progress = nil
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if res.Resumed < 5 || res.EarlyHashed != 3 {
			t.Fatalf("resumed %d clips, %d blobs hashed while written; want >= 5 and 3", res.Resumed, res.EarlyHashed)
		}
		checkSums(t, res.Dataset, o.Out)
		whole := demoOptions(t, src, filepath.Join(t.TempDir(), "ds"))
		if _, err := Run(context.Background(), whole); err != nil {
			t.Fatal(err)
		}
		clitest.SameTree(t, clitest.Tree(t, o.Out), clitest.Tree(t, whole.Out), "resumed vs whole")
	})
}

// TestManySmallClips converts 1000 small clips with 1, 2 and 3 workers and
// with a budget too small for even one clip (only the clip the writer
// needs next is admitted): the outputs are identical.
func TestManySmallClips(t *testing.T) {
	src := t.TempDir()
	os.Mkdir(filepath.Join(src, "f"), 0o755)
	var list []byte
	for c := range 1000 {
		id := fmt.Sprintf("c%04d", c)
		list = append(list, id+"\n"...)
		rows := 3 + c%5
		a := &array.Array{DType: array.Float32, Shape: []int{rows, 4}, Data: make([]byte, rows*16)}
		for i := range a.Data {
			a.Data[i] = byte(c + i)
		}
		a.Data[3], a.Data[7] = 0x3f, 0x3f // keep values finite
		var buf bytes.Buffer
		if err := npy.WriteArray(&buf, a); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "f", id+".npy"), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "clips.txt"), list, 0o644); err != nil {
		t.Fatal(err)
	}
	m, _ := ParseModality("f=f/{clip}.npy")
	var first map[string][]byte
	for _, c := range []struct {
		workers int
		budget  int64
	}{{1, 0}, {2, 0}, {3, 0}, {2, 1}, {3, 1}} {
		o := Options{ClipList: filepath.Join(src, "clips.txt"), Modalities: []Modality{m}, Out: filepath.Join(t.TempDir(), "ds"),
			Workers: c.workers, Budget: c.budget, AllowNonFinite: true, AllowOverflow: true,
			Now: func() time.Time { return time.Unix(1700000000, 0) }}
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if res.Converted != 1000 {
			t.Fatalf("%+v: %d clips converted", c, res.Converted)
		}
		checkSums(t, res.Dataset, o.Out)
		tree := clitest.Tree(t, o.Out)
		if first == nil {
			first = tree
		} else {
			clitest.SameTree(t, first, tree, fmt.Sprintf("%+v", c))
		}
	}
}

// TestAwaitPrediction: the run waits for the prediction only so long, or
// until it is cancelled; a prediction that comes later is still taken by
// startHashers, and one that came in time is not waited for again.
func TestAwaitPrediction(t *testing.T) {
	w := &writer{pred: make(chan []int64, 1)}
	w.awaitPrediction(context.Background(), time.Millisecond) // nothing comes
	if w.predKnown {
		t.Fatal("a prediction that never came is known")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.awaitPrediction(ctx, time.Hour) // returns: cancelled
	w.pred <- []int64{7}
	w.startHashers()
	if !w.predicted || !w.predKnown || w.predRows[0] != 7 {
		t.Fatalf("a late prediction not taken: predicted %v, known %v, rows %v", w.predicted, w.predKnown, w.predRows)
	}

	w = &writer{pred: make(chan []int64, 1)}
	w.pred <- []int64{3, 6}
	w.awaitPrediction(context.Background(), time.Hour)
	if !w.predKnown || len(w.predRows) != 2 {
		t.Fatalf("a prediction in time not taken: known %v, rows %v", w.predKnown, w.predRows)
	}
	w.awaitPrediction(context.Background(), time.Hour) // known: does not wait
	w.startHashers()
	if !w.predicted {
		t.Fatal("hashers not started from the awaited prediction")
	}
}
