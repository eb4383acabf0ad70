package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestBenchGoRuns (#35): bench/bench_go.sh (just bench go) runs the Go
// benchmarks of formats/ and numpy's astype in 3 rounds and prints each
// benchmark's median (range) with the load average; here (with
// CLIPSHARD_EXHAUSTIVE=1, CI) one iteration of npy's ReadFile, the
// decoders, the byte swaps and float16 from float32, and numpy's "stream"
// on 64 Ki values, so that the script cannot rot.
func TestBenchGoRuns(t *testing.T) {
	clitest.LongOnly(t, "the Go benchmarks end to end")
	py := numpytest.Python(t)
	filter := "FromFloat32|ReadFile|DecodeFile|SwapBytes"
	rows := []string{"npy | `BenchmarkReadFile", "numpy | `astype-float32-stream`", "numpy | `astype-float64-L2`",
		"f16 | `BenchmarkFromFloat32/L2/f16c/audit=true", "pickle | `BenchmarkDecodeFile/protocol5", "array | `BenchmarkSwapBytes/2"}
	cmd := exec.Command("bash", filepath.Join("..", "..", "bench", "bench_go.sh"), t.TempDir())
	cmd.Env = append(os.Environ(), "CLIPSHARD_PYTHON="+py, "BENCHTIME=1x", "ROUNDS=2", "BENCH_FILTER="+filter, "BENCH_STREAM_VALUES=65536")
	out, err := cmd.CombinedOutput()
	got := string(out)
	if err != nil {
		t.Fatalf("bench_go.sh: %v\n%s", err, got)
	}
	if !regexp.MustCompile(`3 rounds; load average before [\d.]+ [\d.]+ [\d.]+, after [\d.]+`).MatchString(got) {
		t.Fatalf("bench_go.sh: no heading of 3 rounds (ROUNDS=2 is raised to 3) with the load average in\n%s", got)
	}
	for _, row := range rows {
		if !regexp.MustCompile(regexp.QuoteMeta(row) + "[^|]*\\| \\d+ \\(\\d+–\\d+\\) \\|").MatchString(got) {
			t.Fatalf("bench_go.sh: no row %s with a median (range) in\n%s", row, got)
		}
	}
}
