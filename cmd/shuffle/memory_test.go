package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/transform/convert"
)

// bigClipDataset converts a dataset with one clip of frames x 2048
// float16 values (8 MiB per 2048 frames) between two small ones.
func bigClipDataset(t *testing.T, frames int) string {
	t.Helper()
	list := clitest.ClipSet(t, "w", array.Float16, 2048, 300, frames, 200)
	m, err := convert.ParseModality("w=w/{clip}.npy")
	if err != nil {
		t.Fatal(err)
	}
	ds := filepath.Join(t.TempDir(), "ds")
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: list, Out: ds, Modalities: []convert.Modality{m}}); err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestMemoryBounded: peak RSS of the real binary stays under --mem plus
// 64 MiB on the external path with one clip of 256 MB (read in pieces,
// not whole), and a run whose sample list would not fit --mem is refused
// at once, before anything is allocated, with the --mem that would do.
func TestMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 256 MB clip; run without -short")
	}
	ds := bigClipDataset(t, 64<<10) // 64Ki frames x 4 KiB = 256 MiB
	const mem = 64 << 20
	for _, args := range [][]string{
		{"--window", "15"},
		{"--window", "15", "--no-fsync"},
		{"--window", "1", "--sampling", "random", "--per-clip", "3000"},
	} {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, nil, append([]string{"--dataset", ds, "--out", out, "--epochs", "1", "--mem", "64MiB", "--shard-samples", "256"}, args...)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "external") {
			t.Fatalf("%v: exit %d %s %s", args, r.Code, r.Stdout, r.Stderr)
		}
		t.Logf("%v: peak RSS %d MiB in %v", args, r.MaxRSS>>20, r.Elapsed)
		if r.MaxRSS > mem+64<<20 {
			t.Errorf("%v: peak RSS %d MiB > --mem 64 MiB + 64 MiB", args, r.MaxRSS>>20)
		}
	}
}

// TestSampleListRefused: sample counts are computed arithmetically first:
// a list that would not fit --mem, or shards that would not fit the disk,
// are refused in well under a second, with the sizes.
func TestSampleListRefused(t *testing.T) {
	ds := demoDataset(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--window", "1", "--sampling", "random", "--per-clip", "2000000", "--mem", "64MiB"}, "epoch 0 has 24000000 samples: planning it takes 751.0MiB"},
		{[]string{"--window", "1", "--sampling", "random", "--per-clip", "1000000000", "--mem", "64MiB"}, "epoch 0 has 12000000000 samples"},
		{[]string{"--window", "40", "--sampling", "random", "--per-clip", "2000000", "--mem", "4GiB"}, "for the shards and manifests, the filesystem has"},
	} {
		out := filepath.Join(t.TempDir(), "ep")
		r := shuffleRun(t, nil, append([]string{"--dataset", ds, "--out", out, "--epochs", "1"}, c.args...)...)
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%v: exit %d %q; want 2 and %q", c.args, r.Code, r.Stderr, c.want)
		}
		if r.Elapsed > 2*time.Second || r.MaxRSS > 128<<20 {
			t.Errorf("%v: refused after %v with %d MiB peak RSS", c.args, r.Elapsed, r.MaxRSS>>20)
		}
		t.Logf("%v: %v, %d MiB: %s", c.args, r.Elapsed, r.MaxRSS>>20, strings.TrimSpace(r.Stderr))
	}
	// 20 M frames of one value, W=1: 20 M tile samples.
	src := t.TempDir()
	clitest.BigNPY(t, filepath.Join(src, "x.npy"), array.Float16, 20_000_000, 1)
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte("x\n"), 0o644)
	m, _ := convert.ParseModality("v={clip}.npy")
	big := filepath.Join(t.TempDir(), "ds")
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: filepath.Join(src, "clips.txt"), Out: big, Modalities: []convert.Modality{m}}); err != nil {
		t.Fatal(err)
	}
	r := shuffleRun(t, nil, "--dataset", big, "--out", filepath.Join(t.TempDir(), "ep"), "--epochs", "1", "--window", "1", "--mem", "64MiB")
	if r.Code != 2 || !strings.Contains(r.Stderr, "epoch 0 has 20000000 samples") || !strings.Contains(r.Stderr, "give --mem") ||
		r.Elapsed > 2*time.Second || r.MaxRSS > 128<<20 {
		t.Errorf("20 M samples: exit %d after %v, %d MiB: %q", r.Code, r.Elapsed, r.MaxRSS>>20, r.Stderr)
	}
}
