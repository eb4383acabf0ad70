package main_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/manifests"
)

// largeSet writes n clips of float32 [rows, 1024] features and float64
// [rows, 8] extras as .npy: clips of 400 KiB of float16 output, so that
// blobs are written in several O_DIRECT chunks and their sha256 is
// computed while writing (row counts predicted from the headers).
func largeSet(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	var list strings.Builder
	for _, sub := range []string{"feat", "extra"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path string, dt array.DType, shape []int, val func() float64) {
		a := &array.Array{DType: dt, Shape: shape, Data: make([]byte, shape[0]*shape[1]*dt.Size)}
		for i := 0; i < len(a.Data); i += dt.Size {
			if dt.Size == 4 {
				binary.LittleEndian.PutUint32(a.Data[i:], math.Float32bits(float32(val())))
			} else {
				binary.LittleEndian.PutUint64(a.Data[i:], math.Float64bits(val()))
			}
		}
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := npy.WriteArray(f, a); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for c := range n {
		id := fmt.Sprintf("c%03d", c)
		fmt.Fprintln(&list, id)
		rows := 180 + rng.IntN(40)
		write(filepath.Join(dir, "feat", id+".npy"), array.Float32, []int{rows, 1024}, func() float64 { return rng.NormFloat64() * 3 })
		write(filepath.Join(dir, "extra", id+".npy"), array.Float64, []int{rows, 8}, func() float64 { return rng.Float64() * 100 })
	}
	if err := os.WriteFile(filepath.Join(dir, "clips.txt"), []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func largeArgs(src, out string, extra ...string) []string {
	return append([]string{"--clips", filepath.Join(src, "clips.txt"), "--out", out, "--quiet",
		"-m", "feat=feat/{clip}.npy", "-m", "extra=extra/{clip}.npy"}, extra...)
}

// TestKillLargeClips kills convert with -9 while multi-chunk blobs are
// being written (with and without a journal checkpoint after every clip,
// and in the checksum phase), resumes, and checks that the result equals
// an uninterrupted run and that every sha256 recorded is the file's.
func TestKillLargeClips(t *testing.T) {
	src := largeSet(t, 30)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := runConvert(t, nil, largeArgs(src, ref)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	rep, err := manifests.VerifyDataset(ref, manifests.VerifyOptions{Deep: true})
	if err != nil || !rep.OK() {
		t.Fatalf("reference: %v %+v", err, rep)
	}
	want := snapshot(t, ref)
	for _, c := range []struct {
		kill       string
		checkpoint string
	}{
		{"CLIPSHARD_KILL_AFTER_CLIPS=3", "0"},
		{"CLIPSHARD_KILL_AFTER_CLIPS=17", "0"},
		{"CLIPSHARD_KILL_AFTER_CLIPS=17", "16MiB"},
		{"CLIPSHARD_KILL_AFTER_CLIPS=29", "4MiB"},
		{"CLIPSHARD_KILL_AT_PHASE=checksum", "16MiB"},
	} {
		t.Run(c.kill+"/checkpoint="+c.checkpoint, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "ds")
			r := runConvert(t, []string{c.kill}, largeArgs(src, out, "--checkpoint", c.checkpoint)...)
			if r.Code != -1 {
				t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
			}
			r = runConvert(t, nil, largeArgs(src, out)...)
			if r.Code != 0 {
				t.Fatalf("resume: exit %d: %s", r.Code, r.Stderr)
			}
			sameTree(t, want, snapshot(t, out), "resumed")
		})
	}
}
