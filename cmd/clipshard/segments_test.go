package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestEpochsOfKeptVersions (#61): a dataset grown by convert --segments
// keeps the version its epochs were cut from: verify (plain and --deep)
// and every Python reader (testdata/check_changed.py) read those epochs
// through; inspect and the Python Dataset read the grown dataset (equal
// to a full convert's, testdata/check_format2.py), and so do drawn epochs
// (push: transform/push's TestPushSegments). The same convert without --segments writes format 1 again, and the epochs are
// then refused as cut from a dataset converted again (#60.5).
func TestEpochsOfKeptVersions(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, clitest.DemoDir(), src)
	ids := []string{"clip000", "clip001", "clip002", "clip003", "clip004", "clip005", "clip006", "clip007"}
	l8 := filepath.Join(src, "l8.txt")
	if err := os.WriteFile(l8, []byte(strings.Join(ids, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ds, ep := filepath.Join(dir, "ds"), filepath.Join(dir, "ep")
	convert := func(list string, extra ...string) clitest.Result {
		return clip(t, append([]string{"convert", "--quiet", "--clips", list, "--root", src, "--out", ds,
			"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy"}, extra...)...)
	}
	if r := convert(l8); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "1", "--shard-samples", "8"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := convert(filepath.Join(src, "clips.txt"), "--segments"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, v := range [][]string{{"verify", ep}, {"verify", "--deep", ep}, {"verify", "--deep", "--sources", ds}, {"inspect", ds}} {
		if r := clip(t, v...); r.Code != 0 {
			t.Fatalf("%v after the dataset grew: exit %d: %s %s", v, r.Code, r.Stdout, r.Stderr)
		}
	}
	py := filepath.Join("..", "..", "testdata")
	numpytest.Run(t, filepath.Join(py, "check_changed.py"), ep, ds, "ok")
	twin := filepath.Join(dir, "twin")
	if r := clip(t, "convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--root", src, "--out", twin,
		"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	numpytest.Run(t, filepath.Join(py, "check_format2.py"), ds, twin)
	// Written as one segment again: version 1 is gone with the rest.
	if r := convert(filepath.Join(src, "clips.txt")); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := clip(t, "verify", ep); r.Code != 1 || !strings.Contains(r.Stdout, "converted again") {
		t.Fatalf("verify of epochs whose version was dropped: exit %d: %s", r.Code, r.Stdout)
	}
	numpytest.Run(t, filepath.Join(py, "check_changed.py"), ep, ds)
}

// TestDrawnSegments (#61): epochs drawn at read time from a dataset in
// segments and versions (testdata/check_drawn_format2.py): five versions
// (append, a modality added, clips reordered and removed, a source
// changed), each read byte-equal to a full convert of its list in every
// read mode; a loader reads on the version it began on while newer ones
// are committed, a state resumes on its version, a dropped version and a
// dataset converted again in place are refused, and so are a where.npy
// outside its blob, a FIFO blob and a segment linked out of the folder.
func TestDrawnSegments(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, clitest.DemoDir(), src)
	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_drawn_format2.py"), bin, src, t.TempDir()))
	if !strings.HasPrefix(got, "ok: drawn epochs of 5 versions") {
		t.Fatalf("check_drawn_format2: %s", got)
	}
}
