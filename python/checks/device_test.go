package checks_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestDeviceGuard (#62.5): the loader's buffer reuse rule against a fake
// device whose copies complete only when the test says so: a buffer is
// rewritten only once nothing refers to it and the copy that read it
// completed, over epochs and drawn epochs, prefetch 4 and 0; without the
// rule the same run corrupts copies (the check can fail); close waits for
// the copies in flight (testdata/check_device_guard.py, numpy only).
func TestDeviceGuard(t *testing.T) {
	ds := demoDataset(t)
	out := filepath.Join(t.TempDir(), "ep")
	if r := shuffleRun(t, nil, base(ds, out, "--epochs", "2", "--window", "5", "--shard-samples", "8")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_device_guard.py"), out, ds))
	if !strings.Contains(got, "ok: device guard") {
		t.Fatalf("check_device_guard: %s", got)
	}
	t.Log(strings.TrimSpace(got))
}
