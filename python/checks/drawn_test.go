package checks_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestDrawnEpochs (#38): epochs drawn at read time from the datasets
// themselves (clipshard.Loader(dataset=...)): the order re-derived from
// FORMAT.md alone, exactly once over world sizes 1-8, batch sizes that do
// not divide and workers, the same batches whatever the workers and
// threads, each window the dataset's rows, resumed with another world
// size and batch size across epochs, hostile datasets refused naming the
// file, and torch's EpochDataset and Loader (testdata/check_drawn.py).
func TestDrawnEpochs(t *testing.T) {
	ds := demoDataset(t)
	d := mixDatasets(t)
	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_drawn.py"), ds, d["a"], d["b"], d["c"], d["other"]))
	if !strings.Contains(got, "ok: drawn") {
		t.Fatalf("check_drawn: %s", got)
	}
	if os.Getenv("CI") != "" && !strings.Contains(got, "; torch ") {
		t.Fatalf("check_drawn ran without torch in CI: %s", got)
	}
	t.Log(strings.TrimSpace(got))
}

// TestDrawnHugeClip (#38): a dataset with a clip of 4.6 GB (a sparse
// blob) drawn from: windows past 2 and 4 GiB of the blob come back as the
// rows index.npy says, exactly once, through the memory map and through
// preads (testdata/check_drawn_huge.py; an offset cut to 32 bits in
// either path fails it: tried).
func TestDrawnHugeClip(t *testing.T) {
	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_drawn_huge.py")))
	if !strings.Contains(got, "ok: drawn huge clip") {
		t.Fatalf("check_drawn_huge: %s", got)
	}
	t.Log(strings.TrimSpace(got))
}

// TestBenchDrawnRuns: bench/bench_drawn.py (just bench drawn) runs end to
// end on the demo set, so that it cannot rot: the quality table (with
// materialised epochs, and without), a fake dataset's, and a speed row
// of each kind, and the speed table.
func TestBenchDrawnRuns(t *testing.T) {
	clitest.LongOnly(t, "bench_drawn.sh end to end")
	ds := demoDataset(t)
	ep := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "2", "--shard-samples", "8", "--seed", "3"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	script := filepath.Join("..", "..", "bench", "bench_drawn.py")
	env := []string{"BENCH_B=4", "BENCH_W=5"}
	for _, args := range [][]string{{"quality", ds, ep}, {"quality", ds, "-"}} {
		got := string(numpytest.RunEnv(t, env, append([]string{script}, args...)...))
		if !strings.Contains(got, "| drawn, buffer") || !strings.Contains(got, "tile offsets") {
			t.Fatalf("bench_drawn %v: %s", args, got)
		}
	}
	fake := filepath.Join(t.TempDir(), "fake")
	numpytest.RunEnv(t, env, script, "fake", fake, "30", "20", "40")
	if got := string(numpytest.RunEnv(t, env, script, "quality", fake, "-")); !strings.Contains(got, "(") {
		t.Fatalf("bench_drawn quality of a fake set: %s", got)
	}
	if got := string(numpytest.RunEnv(t, env, script, "gather", ds, "1")); strings.Count(got, " GB/s") != 1 ||
		len(regexp.MustCompile(`\| [0-9.]+ \([0-9.]+–[0-9.]+\) \|`).FindAllString(got, -1)) != 4 {
		t.Fatalf("bench_drawn gather: %s", got)
	}
	var rows strings.Builder
	for _, row := range []string{"materialised", "drawn-auto", "drawn-8MiB-64MiB", "drawn-auto-read"} {
		rows.Write(numpytest.RunEnv(t, env, script, "speed", row, "warm", "0", ds, ep, "2"))
	}
	jsonl := filepath.Join(t.TempDir(), "speed.jsonl")
	os.WriteFile(jsonl, []byte(rows.String()), 0o644)
	got := string(numpytest.RunEnv(t, env, script, "table", jsonl))
	if strings.Count(got, "| warm |") != 4 || !strings.Contains(got, "| drawn-auto-read |") {
		t.Fatalf("bench_drawn table: %s", got)
	}
	// each drawn row's ratio to the materialised one, "median (range)"
	// then its first epoch's and its later epochs' ratios (2 epochs a row here)
	r := `[0-9.]+ \([0-9.]+–[0-9.]+\)`
	if m := regexp.MustCompile(`\| drawn-[^|]+ \| [0-9]+ \([0-9]+–[0-9]+\) \| `+r+` \| `+r+`; `+r+` \|`).FindAllString(got, -1); len(m) != 3 {
		t.Fatalf("bench_drawn table: the ratios to materialised: %q in %s", m, got)
	}
}
