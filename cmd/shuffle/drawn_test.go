package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
