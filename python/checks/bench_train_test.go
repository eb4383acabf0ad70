package checks_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestBenchTrainRuns (#35): bench/bench_train.sh (just bench train) runs
// end to end on a small mixed set, so that it cannot rot: its rows in
// rounds (every row at every S once a round, in turn), and the table of
// the medians and ranges of the rounds with the load average and the
// goals' ratios round by round. (Warm only, the loader's rows and cat:
// the cold, capped and sshfs legs need root, a cgroup and an sshd, and
// the naive loader reads its clips whole, seconds a batch.)
func TestBenchTrainRuns(t *testing.T) {
	clitest.LongOnly(t, "bench_train.sh end to end")
	py := numpytest.Python(t)
	numpytest.Module(t, "torch", "python3-torch")
	w := t.TempDir()
	got := benchScript(t, "bench_train.sh", w, "CLIPSHARD_PYTHON="+py, "BENCH_CLIPS=40", "BENCH_ROUNDS=2", "BENCH_PASSES=2",
		"BENCH_S=0 20", "BENCH_ROWS=cat loader-f16 loader", "BENCH_LEGS=warm")
	if strings.Contains(got, "killed") || strings.Contains(got, "Traceback") {
		t.Fatalf("bench_train.sh: a run failed\n%s", got)
	}
	for _, want := range []string{
		"warm: 2 round(s), load average ",
		"| row | S=0 ms | S=20 ms |",
		"loader float16 / cat samples/s at S=0, round by round: ",
		"loader float32 wait at S=20: median ",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("bench_train.sh: no %q in\n%s", want, got)
		}
	}
	// every row's cells: a wait and the rounds' median (range) of samples/s
	for _, row := range []string{"loader-f16", "loader"} {
		re := regexp.MustCompile(`\| ` + row + ` \| \d+\.\d\d / \d+\.\d, \d+ \(\d+–\d+\) \| \d+\.\d\d / \d+\.\d, \d+ \(\d+–\d+\) \|`)
		if !re.MatchString(got) {
			t.Fatalf("bench_train.sh: no row %s of 2 rounds in\n%s", row, got)
		}
	}
	// the rows ran in turn: round 1 of every row before round 2 of any
	lines, _ := os.ReadFile(filepath.Join(w, "train.jsonl"))
	var order []string
	for _, l := range strings.Split(string(lines), "\n") {
		if m := regexp.MustCompile(`"round": (\d)`).FindStringSubmatch(l); m != nil {
			order = append(order, m[1])
		}
	}
	if strings.Join(order, "") != strings.Repeat("1", 6)+strings.Repeat("2", 6) {
		t.Fatalf("bench_train.sh: rows not run in rounds: %v", order)
	}
	// each pass an epoch of its own (the script made BENCH_PASSES of
	// them): no pass reads what the one before left in the page cache
	if n := strings.Count(string(lines), `"distinct_epochs": true`); n != 12 {
		t.Fatalf("bench_train.sh: %d of 12 runs read an epoch a pass:\n%s", n, lines)
	}
}

// TestBenchReadRuns (#35): bench/bench_read.py (the training-read
// simulation of just bench shuffle) runs end to end on a small set: its
// five ways in rounds, each with the median and range of the rounds,
// the ratios to the first round by round, and the load average.
func TestBenchReadRuns(t *testing.T) {
	clitest.LongOnly(t, "bench_read.sh end to end")
	py := numpytest.Python(t)
	w := t.TempDir()
	sh := `set -euo pipefail
W=$1; PY=$2
go build -o "$W/" ./cmd/convert ./cmd/shuffle
"$PY" bench/bench_gen.py "$W/src" 30 50 80 16
"$W/convert" --quiet --clips "$W/src/clips.txt" --out "$W/ds" -m 'feat=feat/{clip}.npy' -m 'motion=motion/{clip}.pkl:exp+pose' >/dev/null
"$W/shuffle" --quiet --dataset "$W/ds" --out "$W/ep" --window 15 --epochs 1 --seed 1 >/dev/null
BENCH_ROUNDS=3 "$PY" bench/bench_read.py "$W/src" "$W/ds" "$W/ep" warm`
	cmd := exec.Command("bash", "-c", sh, "bash", w, py)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	got := string(out)
	if err != nil {
		t.Fatalf("bench_read.py: %v\n%s", err, got)
	}
	if !regexp.MustCompile(`warm: \d+ samples \(W=15, batch 256\), 3 rounds, load average [\d.]+–[\d.]+`).MatchString(got) {
		t.Fatalf("bench_read.py: no heading of 3 rounds with the load average in\n%s", got)
	}
	for _, way := range []string{`\(a\) shards in order`, `\(a'\) same, read=True`, `\(b\) random gather, blobs`, `\(b'\) same, MADV_RANDOM`, `\(c\) per sample, sources`} {
		if !regexp.MustCompile(way + ` +\d+ \(\d+–\d+\) samples/s`).MatchString(got) {
			t.Fatalf("bench_read.py: no %s in\n%s", way, got)
		}
	}
	if strings.Count(got, "slower than (a)") != 3 {
		t.Fatalf("bench_read.py: not 3 ratios to (a) in\n%s", got)
	}
}

// TestBenchTrainLegsRun (#35): bench_train.sh's memory-capped and sshfs
// legs run end to end on 40 clips, one round, a few rows each, so that
// they cannot rot any more than the warm leg can: each leg's table with
// a figure for every row (none killed), and nothing they made is left
// after: the cgroup, the mount, the loopback sshd. Needs root, a cgroup
// memory controller, /dev/fuse, sshfs and openssh-server (.ci/run
// installs the packages; outside CI a missing one skips, naming it).
func TestBenchTrainLegsRun(t *testing.T) {
	clitest.LongOnly(t, "bench_train.sh's capped and sshfs legs end to end")
	py := numpytest.Python(t)
	numpytest.Module(t, "torch", "python3-torch")
	if why := legsMissing(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("the capped and sshfs legs cannot run in CI: no %s", why)
		}
		t.Skipf("the capped and sshfs legs need %s", why)
	}
	w := t.TempDir()
	got := benchScript(t, "bench_train.sh", w, "CLIPSHARD_PYTHON="+py, "BENCH_CLIPS=40", "BENCH_ROUNDS=1", "BENCH_PASSES=2",
		"BENCH_LEGS=capped sshfs", "BENCH_CAP_ROWS=loader-f16 loader-np reader-read", "BENCH_NET_ROWS=cat loader-f16 reader-mmap reader-read")
	if strings.Contains(got, "killed") || strings.Contains(got, "Traceback") || strings.Contains(got, "skipped") {
		t.Fatalf("bench_train.sh: a leg or a run failed\n%s", got)
	}
	cell := `[\d.]+ / [\d.]+, \d+`
	for leg, rows := range map[string][]string{
		"cold, memory capped at 160M: 1 round(s), load average ": {"loader-f16", "loader-np", "reader-read"},
		"sshfs, cold: 1 round(s), load average ":                 {"loader-f16", "reader-mmap", "reader-read"},
	} {
		i := strings.Index(got, leg)
		if i < 0 {
			t.Fatalf("bench_train.sh: no table %q in\n%s", leg, got)
		}
		for _, row := range rows {
			if !regexp.MustCompile(`\| ` + row + ` \| ` + cell + ` \| ` + cell + ` \|`).MatchString(got[i:]) {
				t.Fatalf("bench_train.sh: no row %s at S=0 and 20 after %q:\n%s", row, leg, got)
			}
		}
	}
	if !regexp.MustCompile(`\| cat \| -, \d+ \| -, \d+ \|`).MatchString(got) || !strings.Contains(got, "sshfs: ") {
		t.Fatalf("bench_train.sh: no cat row or sshfs version in the sshfs leg:\n%s", got)
	}
	leftBehind(t, w, "clipshard-bench-train", "net")
}

// legsMissing says what the bench scripts' sshfs and memory-capped legs
// need that this machine lacks ("" if nothing): root (they make a cgroup,
// start an sshd on 127.0.0.1 and mount), a cgroup memory controller (v1
// or v2), /dev/fuse, sshfs and sshd.
func legsMissing() string {
	var no []string
	if os.Geteuid() != 0 {
		no = append(no, "root")
	}
	v2, _ := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if _, v1 := os.Stat("/sys/fs/cgroup/memory"); !strings.Contains(string(v2), "memory") && v1 != nil {
		no = append(no, "cgroup memory controller")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		no = append(no, "/dev/fuse")
	}
	if _, err := exec.LookPath("sshfs"); err != nil {
		no = append(no, "sshfs (apt-get install sshfs)")
	}
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		no = append(no, "sshd (apt-get install openssh-server)")
	}
	return strings.Join(no, ", ")
}

// leftBehind fails the test if a bench script run in w left its cgroup
// (named cg, v1 or v2), its sshfs mount or its sshd (in the folder net of
// w) behind.
func leftBehind(t *testing.T, w, cg, net string) {
	t.Helper()
	for _, p := range []string{filepath.Join("/sys/fs/cgroup", cg), filepath.Join("/sys/fs/cgroup/memory", cg)} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("the capped leg left its cgroup %s", p)
		}
	}
	mounts, _ := os.ReadFile("/proc/mounts")
	if strings.Contains(string(mounts), filepath.Join(w, net)) {
		t.Errorf("the sshfs leg left its mount under %s", filepath.Join(w, net))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); strings.Contains(string(b), filepath.Join(w, net, "sshd_config")) {
			t.Errorf("the sshfs leg left its sshd running: %s %q", p, b)
		}
	}
}

// TestBenchDropLeavesFifos: the bench scripts' page cache drop and warm-up
// (bench_train.py's drop and warm, which bench_peers.py shares) touch only
// the regular files of a work folder: a FIFO or a link to /dev/zero in it
// is left alone (the drop's open of a FIFO blocked forever before).
func TestBenchDropLeavesFifos(t *testing.T) {
	py := numpytest.Python(t)
	d := t.TempDir()
	if err := exec.Command("mkfifo", filepath.Join(d, "fifo")).Run(); err != nil {
		t.Fatal(err)
	}
	os.Symlink("/dev/zero", filepath.Join(d, "zero"))
	os.WriteFile(filepath.Join(d, "data"), []byte("x"), 0o644)
	script := `import sys; sys.path[:0] = ["bench", "python"]; import bench_train as b
print(sorted(b.regular_files([sys.argv[1]]))); b.drop([sys.argv[1]]); b.warm([sys.argv[1]]); print("done")`
	cmd := exec.Command("timeout", "20", py, "-c", script, d)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	if want := "['" + filepath.Join(d, "data") + "']\ndone\n"; err != nil || string(out) != want {
		t.Fatalf("drop and warm over a folder with a FIFO and a link to /dev/zero: %v\n%s", err, out)
	}
}
