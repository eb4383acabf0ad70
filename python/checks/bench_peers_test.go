package checks_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestBenchPeersRuns (#35): bench/bench_peers.sh (just bench peers) runs
// end to end on a tiny mixed set, so that it cannot rot: every peer's
// writer (Mosaic's in 2 processes, WebDataset's two layouts), a sweep of
// two configurations of each peer, the best chosen from it, the main
// rows warm and cold with the floor (page cache and O_DIRECT), the resume
// leg, and the tables. It needs a Python with torch, litdata,
// mosaicml-streaming and webdataset: $CLIPSHARD_PEERS_PYTHON (.ci/run's
// last leg installs them into its numpy 2 venv and sets it).
func TestBenchPeersRuns(t *testing.T) {
	py := os.Getenv("CLIPSHARD_PEERS_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Skip("CLIPSHARD_PEERS_PYTHON unset: in CI this test runs in .ci/run's peers leg, which sets it")
		}
		t.Skip("needs a Python with the peers: python3 -m venv V && V/bin/pip install litdata mosaicml-streaming webdataset torch; CLIPSHARD_PEERS_PYTHON=V/bin/python")
	}
	if out, err := exec.Command(py, "-c", "import torch, litdata, streaming, webdataset").CombinedOutput(); err != nil {
		t.Fatalf("CLIPSHARD_PEERS_PYTHON=%s cannot import the peers: %v\n%s", py, err, out)
	}
	w := t.TempDir()
	// The sshfs and memory-capped legs too where the machine allows them
	// (in CI it must: .ci/run installs sshfs and openssh-server).
	legs := "prepare sweep main resume"
	if why := legsMissing(); why == "" {
		legs += " sshfs capped"
	} else if os.Getenv("CI") != "" {
		t.Fatalf("bench_peers.sh's sshfs and capped legs cannot run in CI: no %s", why)
	} else {
		t.Logf("not running bench_peers.sh's sshfs and capped legs: they need %s", why)
	}
	got := benchScript(t, "bench_peers.sh", w, "BENCH_PEERS_PYTHON="+py, "BENCH_CLIPS=48", "BENCH_ROUNDS=1",
		"BENCH_EPOCHS=2", "BENCH_S=0", "BENCH_SWEEP=w0 w2p", "BENCH_LEGS="+legs, "BENCH_BIG_CLIPS=48")
	if strings.Contains(legs, "sshfs") {
		for _, want := range []string{
			"| sshfs, cold, S=0 (load average", "| floor: ", "sshfs: clipshard (float32 torch) / each peer's best, round by round: litdata ",
			"| capped 1200M, cold (an epoch of ", "capped: clipshard (float32 torch) / each peer's best, round by round: litdata ",
		} {
			if !strings.Contains(got, want) {
				t.Fatalf("bench_peers.sh: no %q in\n%s", want, got)
			}
		}
		if strings.Contains(got, "skipped") || strings.Contains(got, `"killed"`) {
			t.Fatalf("bench_peers.sh: a leg skipped or a capped run killed\n%s", got)
		}
		leftBehind(t, w, "clipshard-bench-peers", "peers-net")
	}
	for _, want := range []string{
		"| webdataset-1 |", "| mosaic w2p |", "| litdata w0 |", // prepare, the sweep
		"| floor: ", "| clipshard-f16 threads2 |", "(best)", "(default)", // the main rows
		"float16 (numpy) / floor", "clipshard / ", // the ratios
		"| clipshard | 0 |", // resume: nothing trained twice
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("bench_peers.sh: no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "failed runs:") || strings.Contains(got, "Traceback") {
		t.Fatalf("bench_peers.sh: a run failed\n%s", got)
	}
	// the cold rows of clipshard's materialised epochs read an epoch of
	// their own each pass (BENCH_EPOCHS=2 of them), the warm rows replays
	lines, _ := os.ReadFile(filepath.Join(w, "peers.jsonl"))
	var cold, warm int
	for _, l := range strings.Split(string(lines), "\n") {
		var r struct{ Tool, Mode, Data string }
		if json.Unmarshal([]byte(l), &r) != nil || (r.Tool != "clipshard" && r.Tool != "clipshard-f16") {
			continue
		}
		switch {
		case r.Mode == "cold" && strings.HasSuffix(r.Data, "ep-cold-2"):
			cold++
		case r.Mode == "warm" && strings.HasSuffix(r.Data, "/ep"):
			warm++
		case r.Mode == "cold" || r.Mode == "warm":
			t.Fatalf("bench_peers.sh: a %s row of %s read %s", r.Mode, r.Tool, r.Data)
		}
	}
	if cold == 0 || warm == 0 {
		t.Fatalf("bench_peers.sh: %d cold and %d warm rows of clipshard's epochs in\n%s", cold, warm, lines)
	}
	for _, mode := range []string{"| warm (load average", "| cold (load average"} {
		if !strings.Contains(got, mode) {
			t.Fatalf("bench_peers.sh: no %q table\n%s", mode, got)
		}
	}
	// One epoch a process (the sshfs and capped legs): the waits are that
	// epoch's steps after its first batch (they once all read 0 ms: no
	// steady epoch to take them from).
	p := filepath.Join(w, "peers-huge-48")
	for _, c := range []struct{ tool, config, data string }{{"clipshard", "threads2", "ep"}, {"litdata", "w0", "litdata"}} {
		cmd := exec.Command(py, filepath.Join("..", "..", "bench", "bench_peers.py"), "read", c.tool, c.config, "0", "warm", filepath.Join(p, c.data))
		cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir(), "BENCH_EPOCHS=1")
		out, err := cmd.Output()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var r struct {
			Epochs []any   `json:"epochs"`
			Wait   float64 `json:"wait_med_ms"`
			P99    float64 `json:"wait_p99_ms"`
		}
		if err != nil || json.Unmarshal([]byte(lines[len(lines)-1]), &r) != nil || len(r.Epochs) != 1 || !(r.Wait > 0 && r.P99 >= r.Wait) {
			t.Fatalf("bench_peers.py read %s %s, one epoch: %v %+v\n%s", c.tool, c.config, err, r, out)
		}
	}
	// bench/bench_cast.py (where a float32 batch's time goes) over the
	// same epoch, one round: every row a rate, the bound below the read.
	cmd := exec.Command(py, filepath.Join("..", "..", "bench", "bench_cast.py"), filepath.Join(p, "ep"), "1")
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	out, err := cmd.Output()
	var r map[string]float64
	first, _, _ := strings.Cut(string(out), "\n")
	if err != nil || json.Unmarshal([]byte(first), &r) != nil {
		t.Fatalf("bench_cast.py: %v\n%s", err, out)
	}
	for _, k := range []string{"read", "f16 ring", "f32 ring", "cast alone", "copy alone", "write alone", "f32 bound"} {
		if !(r[k] > 0) {
			t.Fatalf("bench_cast.py: no rate %q in %s", k, out)
		}
	}
	if !(r["f32 bound"] < r["read"] && r["f32 bound / read"] > 0 && r["f32 bound / read"] < 1 && r["any cast's bound / read"] < 1) ||
		!strings.Contains(string(out), "summary, 1 rounds") {
		t.Fatalf("bench_cast.py: %s", out)
	}
}

// benchScript runs docs/NAME (a bash script) with work folder w and env
// added to this process's environment, failing the test if it fails;
// its output. TMPDIR is a folder of the test's own: what the script's
// processes leave there (the peers' file locks and caches, the pymp-*
// folders of DataLoader workers) goes with the test, not into /tmp.
func benchScript(t *testing.T, name, w string, env ...string) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join("..", "..", "bench", name), w)
	cmd.Env = append(append(os.Environ(), "TMPDIR="+t.TempDir()), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
	return string(out)
}

// TestBenchLibRounds (#35): bench/bench_lib.sh's rounds, behind every
// best/bestpair of the bench_*.sh scripts, runs its rows in turn, one run
// of each a round, at least 3 rounds, FRESH removed before each run, an
// argument with spaces and quotes passed as it is, and prints each row's
// median, range, best, peak RSS and load average (and stores the median,
// the best and the times, whose ratio round by round `ratio` prints); a
// command that fails ends the script.
func TestBenchLibRounds(t *testing.T) {
	w := t.TempDir()
	sh := `set -euo pipefail
. bench/bench_lib.sh "$1"
RUNS=2 rounds a "$1/fresh" sh -c 'test ! -e "$1/fresh" || exit 9; echo x >> "$1/log"; touch "$1/fresh"' sh "$1" -- \
  b "" sh -c 'echo "y $2" >> "$1/log"; sleep 0.05' sh "$1" "it's one arg"
cat "$1/log"; cat "$1/a.median" "$1/b.best"
echo "times $(cat "$1/b.times") ratio $(ratio b a)"
rounds c "" false
echo not reached`
	cmd := exec.Command("bash", "-c", sh, "bash", w)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	got := string(out)
	if err == nil || strings.Contains(got, "not reached") {
		t.Fatalf("a failing row did not end the script: %v\n%s", err, got)
	}
	want := "x\ny it's one arg\nx\ny it's one arg\nx\ny it's one arg\n"
	if !strings.Contains(got, want) {
		t.Fatalf("rows not run in turn 3 times (RUNS=2 is raised to 3):\n%s", got)
	}
	for _, row := range []string{"a", "b"} {
		if !strings.Contains(got, "  "+row+" ") || !strings.Contains(got, "3 rounds), best ") || !strings.Contains(got, "load ") {
			t.Fatalf("no result line for %s:\n%s", row, got)
		}
	}
	if !regexp.MustCompile(`times \d+\.\d+ \d+\.\d+ \d+\.\d+ ratio \d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\)`).MatchString(got) {
		t.Fatalf("no times of 3 rounds or no ratio of two rows round by round:\n%s", got)
	}
	if !strings.HasPrefix(got, "load average at the start: ") {
		t.Fatalf("no load average first:\n%s", got)
	}
}

// TestBenchPeersTables: the sshfs and memory-capped legs' tables (legs
// TestBenchPeersRuns leaves out: sshd, a cgroup and a 2.4 GB set) give
// each row's median and range over the rounds, the load average, the
// runs killed, the floor over the mount, and clipshard's ratio to each
// peer and to the floor round by round.
func TestBenchPeersTables(t *testing.T) {
	lines := []string{}
	for round, rate := range []float64{2000, 4000} {
		lines = append(lines, fmt.Sprintf(`{"tool": "floor", "config": "2 threads, 1024 KiB", "mode": "sshfs, cold", "S": 0, "samples_per_s": %g, "load": 1}`, 4*rate))
		for _, r := range []struct {
			tool, config string
			x            float64
		}{{"clipshard", "threads2", 1}, {"litdata", "w0", 0.5}, {"mosaic", "w2p", 0.25}} {
			lines = append(lines, fmt.Sprintf(`{"tool": %q, "config": %q, "S": 0, "mode": "sshfs, cold", "samples_per_s": %g, "wait_med_ms": 0, "wait_p99_ms": 0, "load": %g}`,
				r.tool, r.config, rate*r.x, 1+float64(round)))
			if r.tool == "mosaic" && round == 0 {
				lines = append(lines, fmt.Sprintf(`{"tool": %q, "config": %q, "S": 20, "mode": "capped 1200M, cold", "killed": true}`, r.tool, r.config))
				continue
			}
			lines = append(lines, fmt.Sprintf(`{"tool": %q, "config": %q, "S": 20, "mode": "capped 1200M, cold", "samples_per_s": %g, "wait_med_ms": %g, "wait_p99_ms": 9, "load": 1.5}`,
				r.tool, r.config, rate*r.x, 0.1*float64(round+1)))
		}
	}
	lines = append(lines, `{"bytes": "big epoch", "MB": 2315}`)
	p := filepath.Join(t.TempDir(), "peers.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := string(numpytest.Run(t, filepath.Join("..", "..", "bench", "bench_peers.py"), "table", p))
	for _, want := range []string{
		"| sshfs, cold, S=0 (load average 1.00–2.00) |", "| clipshard threads2 | 3000 (2000–4000) | 2 |", "| litdata w0 | 1500 (1000–2000) | 2 |",
		"| floor: 2 threads, 1024 KiB | 12000 (8000–16000) | 2 |", "sshfs: clipshard / the floor, round by round: clipshard threads2 0.25 (0.25–0.25)",
		"sshfs: clipshard (float32 torch) / each peer's best, round by round: litdata w0 2.00 (2.00–2.00); mosaic w2p 4.00 (4.00–4.00)",
		"| capped 1200M, cold (an epoch of 2315 MB), S=20 (load average 1.50–1.50) |",
		"| clipshard threads2 | 3000 (2000–4000) | 0.15; 9.0 | 2 |", "| mosaic w2p | 1000 (1 killed) | 0.20; 9.0 | 2 |",
		"capped: clipshard (float32 torch) / each peer's best, round by round: litdata w0 2.00",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("bench_peers.py table: no %q in\n%s", want, got)
		}
	}
}
