package examples_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/demodata"
	"github.com/clipshard/clipshard/internal/numpytest"

	// Imported so the test cache is keyed on the shuffle command's sources.
	_ "github.com/clipshard/clipshard/internal/commands/shuffle"
)

// bin is the shuffle command, built from cmd/shuffle for these tests.
var bin string

func TestMain(m *testing.M) { clitest.MainOf(m, "shuffle", "../cmd/shuffle", &bin) }

// TestTrainDDP (#24.5): train_ddp.py, real torch.distributed (gloo, CPU)
// on 2 ranks, killed with SIGKILL after a checkpoint and resumed on 3
// ranks with another batch size, trains every sample of every epoch once,
// in the epoch's order (testdata/check_ddp.py): on a mixed folder (its
// samples have 4 columns) of 2 epochs; with CLIPSHARD_EXHAUSTIVE=1 (CI) on
// a plain folder of 3 epochs too.
func TestTrainDDP(t *testing.T) {
	numpytest.Module(t, "torch", "python3-torch")
	ds := demodata.Dataset(t, filepath.Dir(bin))
	run := func(out string, args ...string) {
		t.Helper()
		if r := clitest.Run(t, bin, nil, append(append([]string{"--quiet"}, args...), "--out", out, "--window", "5", "--shard-samples", "8")...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		if got := numpytest.Run(t, filepath.Join("..", "testdata", "check_ddp.py"), out); !strings.Contains(string(got), "ok: ddp") {
			t.Fatalf("check_ddp on %v: %s", args, got)
		}
	}
	run(filepath.Join(t.TempDir(), "mixed"), "--source", "a="+ds, "--source", "b="+ds, "--weights", "a=1,b=2", "--epochs", "2")
	if clitest.Long() {
		run(filepath.Join(t.TempDir(), "ep"), "--dataset", ds, "--epochs", "3", "--seed", "7")
	}
}
