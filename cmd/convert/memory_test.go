package main_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
)

// TestMemoryBounded: a .npy clip larger than --mem is converted in pieces:
// peak RSS of the real binary stays under --mem + 64 MiB (it held the
// whole clip and its float16 copy before), and the dataset is exact. So
// is a run over that dataset after another clip changed, which copies
// the large clip's rows from it a piece at a time.
func TestMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 384 MiB clip; run without -short")
	}
	list := clitest.ClipSet(t, "f", array.Float32, 1024, 500, 96<<10, 300) // 384 MiB of float32 in the middle
	var out string
	for _, workers := range []string{"1", "2"} {
		out = filepath.Join(t.TempDir(), "ds")
		r := runConvert(t, nil, "--clips", list, "--out", out, "-m", "f=f/{clip}.npy", "--mem", "64MiB", "--workers", workers, "--quiet")
		if r.Code != 0 {
			t.Fatalf("exit %d: %s", r.Code, r.Stderr)
		}
		t.Logf("workers %s: peak RSS %d MiB in %v", workers, r.MaxRSS>>20, r.Elapsed)
		if r.MaxRSS == 0 || r.MaxRSS > (64+64)<<20 {
			t.Errorf("workers %s: peak RSS %d MiB > --mem 64 MiB + 64 MiB", workers, r.MaxRSS>>20)
		}
		rep, err := manifests.VerifyDataset(out, manifests.VerifyOptions{Deep: true, Sources: true})
		if err != nil || !rep.OK() {
			t.Fatalf("verify --deep --sources: %v %v", err, rep.Problems)
		}
	}
	before, err := os.ReadFile(filepath.Join(out, "f.npy"))
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	os.Chtimes(filepath.Join(filepath.Dir(list), "f", "c0.npy"), later, later)
	r := runConvert(t, nil, "--clips", list, "--out", out, "-m", "f=f/{clip}.npy", "--mem", "64MiB", "--workers", "2", "--quiet")
	if r.Code != 0 || !strings.Contains(r.Stdout, "all the rows of 2 clips") {
		t.Fatalf("incremental: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	t.Logf("incremental: peak RSS %d MiB in %v", r.MaxRSS>>20, r.Elapsed)
	if r.MaxRSS == 0 || r.MaxRSS > (64+64)<<20 {
		t.Errorf("incremental: peak RSS %d MiB > --mem 64 MiB + 64 MiB", r.MaxRSS>>20)
	}
	if after, _ := os.ReadFile(filepath.Join(out, "f.npy")); !bytes.Equal(before, after) {
		t.Error("incremental: f.npy differs from the full conversion")
	}
}

// TestTermDuringLongClip: SIGTERM while a large clip is being converted
// stops the run within a second (it was acted on only after the clip),
// with the one line that says so, and leaves --out alone.
func TestTermDuringLongClip(t *testing.T) {
	list := clitest.ClipSet(t, "f", array.Float32, 1024, 500, 16<<10, 300) // 64 MiB in the middle, 16 pieces
	out := filepath.Join(t.TempDir(), "ds")
	cmd := exec.Command(bin, "--clips", list, "--out", out, "-m", "f=f/{clip}.npy", "--mem", "16MiB", "--workers", "1", "--quiet")
	// Every piece takes 300 ms more: the clip takes about 10 s.
	cmd.Env = append(os.Environ(), "CLIPSHARD_FAULT_DELAY=300ms")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	took := time.Since(sent)
	code := -1
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if took > time.Second {
		t.Errorf("exited %v after SIGTERM", took)
	}
	if code != 1 || !strings.Contains(stderr.String(), "interrupted") || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
		t.Errorf("exit %d (%v), stderr %q", code, err, stderr.String())
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("--out made by an interrupted run")
	}
}
