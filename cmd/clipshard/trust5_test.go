package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestEpochsKnowTheirDataset (#60.5): epochs whose dataset was converted
// again in place (two clips' whisper features re-extracted, the same
// convert line run again) are refused by verify and inspect (exit 1) and push,
// and by every Python reader (testdata/check_changed.py), each
// naming the epochs and the dataset; mixed epochs whose one source
// changed too. A convert run again with nothing changed, or a dataset
// moved away (not there: not checked), leaves them readable. (Before:
// "ok: epochs intact", and the Loader read them.)
func TestEpochsKnowTheirDataset(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, clitest.DemoDir(), src)
	dir := t.TempDir()
	ds, other, ep, mixed := filepath.Join(dir, "ds"), filepath.Join(dir, "other"), filepath.Join(dir, "ep"), filepath.Join(dir, "mixed")
	convert := func(out string) clitest.Result {
		return clip(t, "convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--root", src, "--out", out,
			"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy")
	}
	for _, out := range []string{ds, other} {
		if r := convert(out); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
	}
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "1", "--shard-samples", "8"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := clip(t, "shuffle", "--quiet", "--source", "a="+ds, "--source", "b="+other, "--out", mixed, "--window", "5", "--epochs", "1", "--shard-samples", "8"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	py := filepath.Join("..", "..", "testdata", "check_changed.py")
	// Converted again, nothing changed: still theirs.
	if r := convert(ds); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, e := range []string{ep, mixed} {
		if r := clip(t, "verify", e); r.Code != 0 {
			t.Fatalf("verify after a convert that changed nothing: %s", r.Stdout)
		}
	}
	numpytest.Run(t, py, ep, ds, "ok")
	// Two clips' features changed, the same convert run again.
	for _, c := range []string{"clip003", "clip007"} {
		p := filepath.Join(src, "whisper", c+".npy")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 128 + 64; i < len(b); i += 2 {
			b[i] ^= 0x01 // (the low bit of each float16's mantissa)
		}
		os.WriteFile(p, b, 0o644)
	}
	if r := convert(ds); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, e := range []string{ep, mixed} {
		r := clip(t, "verify", e)
		if r.Code != 1 || !strings.Contains(r.Stdout, ds) || !strings.Contains(r.Stdout, "converted again") {
			t.Fatalf("verify %s: %d %s", e, r.Code, r.Stdout)
		}
		r = clip(t, "inspect", e)
		oneLine(t, r, 1, "clipshard inspect: ")
		if !strings.Contains(r.Stderr, e) || !strings.Contains(r.Stderr, ds) || !strings.Contains(r.Stderr, "converted again") {
			t.Fatalf("inspect %s: %s", e, r.Stderr)
		}
		r = clip(t, "push", e, "s3://bkt/ep")
		if r.Code == 0 || !strings.Contains(r.Stderr, "converted again") {
			t.Fatalf("push %s: %d %s", e, r.Code, r.Stderr)
		}
	}
	numpytest.Run(t, py, ep, ds)
	numpytest.Run(t, py, mixed, ds)
	// The dataset moved away: the epochs hold their samples, read on.
	if err := os.Rename(ds, ds+"-moved"); err != nil {
		t.Fatal(err)
	}
	if r := clip(t, "verify", ep); r.Code != 0 {
		t.Fatalf("verify with the dataset gone: %s", r.Stdout)
	}
	numpytest.Run(t, py, ep, ds, "ok")
}
