package examples_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
// a plain folder of 3 epochs too, where the resumed run is made to crash
// (SIGABRT in a rank) and is resumed again.
func TestTrainDDP(t *testing.T) {
	numpytest.Module(t, "torch", "python3-torch")
	ds := demodata.Dataset(t, filepath.Dir(bin))
	run := func(out string, env []string, args ...string) string {
		t.Helper()
		if r := clitest.Run(t, bin, nil, append(append([]string{"--quiet"}, args...), "--out", out, "--window", "5", "--shard-samples", "8")...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		got := string(numpytest.RunEnv(t, env, filepath.Join("..", "testdata", "check_ddp.py"), out))
		if !strings.Contains(got, "ok: ddp") {
			t.Fatalf("check_ddp on %v: %s", args, got)
		}
		return got
	}
	if got := run(filepath.Join(t.TempDir(), "mixed"), nil, "--source", "a="+ds, "--source", "b="+ds, "--weights", "a=1,b=2", "--epochs", "2"); strings.Contains(got, "resumed again") {
		t.Logf("a rank of the resumed run ended by SIGABRT (torch's abort; resumed again, exactly-once held): %s", got)
	}
	if clitest.Long() {
		// The resumed run crashes too (a rank ends by SIGABRT after 8 steps,
		// as a rank torch aborts does) and is resumed again on 3 ranks.
		got := run(filepath.Join(t.TempDir(), "ep"), []string{"CLIPSHARD_DDP_ABORT=8"}, "--dataset", ds, "--epochs", "3", "--seed", "7")
		// (between checkpoints: steps past the checkpoint trained again)
		m := regexp.MustCompile(`ended by SIGABRT after step (\d+), resumed again after step (\d+)`).FindStringSubmatch(got)
		if m == nil {
			t.Fatalf("check_ddp: the resumed run was not made to crash: %s", got)
		}
		if crashed, resumed := atoi(t, m[1]), atoi(t, m[2]); crashed <= resumed {
			t.Fatalf("check_ddp: the crash at step %d came at its checkpoint (%d): nothing was trained again: %s", crashed, resumed, got)
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTrainLightning (#64.8): examples/train_lightning.py (a
// LightningDataModule over clipshard.torch.Loader) on 2 CPU processes,
// stopped at step 7 and resumed from its checkpoint, trains every sample
// of every epoch exactly once (testdata/check_lightning.py). It needs
// lightning: CI installs it into its numpy 2 venv and runs this with
// CLIPSHARD_LIGHTNING=1; elsewhere it is skipped, saying so.
func TestTrainLightning(t *testing.T) {
	if os.Getenv("CLIPSHARD_LIGHTNING") == "" {
		t.Skip("needs lightning: pip install lightning into a venv with torch, then CLIPSHARD_LIGHTNING=1 CLIPSHARD_PYTHON=VENV/bin/python go test ./examples -run TestTrainLightning (CI does)")
	}
	numpytest.Module(t, "lightning", "python3 -m pip install lightning")
	ds := demodata.Dataset(t, filepath.Dir(bin))
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clitest.Run(t, bin, nil, "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "2", "--shard-samples", "8", "--seed", "3"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got := string(numpytest.Run(t, filepath.Join("..", "testdata", "check_lightning.py"), ep, t.TempDir()))
	if !strings.Contains(got, "ok: lightning") {
		t.Fatalf("check_lightning: %s", got)
	}
	t.Log(strings.TrimSpace(got))
}
