package main_test

import (
	"bytes"
	"fmt"
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
	buildTools(t) // verify
	// 384 MiB of float32 in the middle
	list := clitest.ClipSet(t, "f", array.Float32, 1024, 500, 96<<10, 300)
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
	// #26.8: verify --sources within the same bound (it held the 384 MiB
	// clip whole, and its conversion: about twice its size).
	v := clitest.Run(t, filepath.Join(filepath.Dir(bin), "verify"), nil, "--sources", "--mem", "64MiB", "--quiet", out)
	t.Logf("verify --sources --mem 64MiB: peak RSS %d MiB in %v", v.MaxRSS>>20, v.Elapsed)
	if v.Code != 0 || v.MaxRSS == 0 || v.MaxRSS > (64+64)<<20 {
		t.Errorf("verify --sources: exit %d, peak RSS %d MiB > --mem 64 MiB + 64 MiB: %s", v.Code, v.MaxRSS>>20, v.Stdout)
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

// TestMemoryManyModalities (#26.8): the bound holds whatever the number
// of modalities and clips: thousands of small clips of four (and eight)
// modalities, at --mem 64 MiB and 256 MiB, peak under --mem + 64 MiB
// (2000 clips, eight modalities at 64 MiB and four at 256 MiB; 4000 clips
// and all four pairs with CLIPSHARD_EXHAUSTIVE=1, CI).
// Before, four modalities at 64 MiB peaked at 179 MiB and at 256 MiB at
// 341-360 MiB: each blob's chunk buffers (12 MiB) came on top of a Go heap
// allowed to grow to --mem + 64 MiB.
func TestMemoryManyModalities(t *testing.T) {
	if testing.Short() {
		t.Skip("writes thousands of clips of 8 modalities; run without -short")
	}
	mods := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	rows := make([]int, clitest.Exhaustive(2000, 4000))
	for i := range rows {
		rows[i] = 40 + i%50
	}
	list := clitest.ClipSetMods(t, mods, array.Float32, 128, rows...)
	cases := [][2]int{{8, 64}, {4, 256}} // (the most buffers under the lowest bound; and four modalities)
	if clitest.Long() {
		cases = [][2]int{{4, 64}, {4, 256}, {8, 64}, {8, 256}}
	}
	for _, c := range cases {
		n, mem := c[0], int64(c[1])
		{
			args := []string{"--clips", list, "--out", filepath.Join(t.TempDir(), "ds"), "--mem", fmt.Sprintf("%dMiB", mem), "--quiet"}
			for _, m := range mods[:n] {
				args = append(args, "-m", m+"="+m+"/{clip}.npy")
			}
			r := runConvert(t, nil, args...)
			if r.Code != 0 {
				t.Fatalf("exit %d: %s", r.Code, r.Stderr)
			}
			t.Logf("%d modalities, --mem %d MiB: peak RSS %d MiB in %v", n, mem, r.MaxRSS>>20, r.Elapsed)
			if r.MaxRSS == 0 || r.MaxRSS > (mem+64)<<20 {
				t.Errorf("%d modalities: peak RSS %d MiB > --mem %d MiB + 64 MiB", n, r.MaxRSS>>20, mem)
			}
		}
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
