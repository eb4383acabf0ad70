package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// buildTools builds shuffle and verify next to the convert binary under
// test and returns CLIPSHARD_BIN=that folder.
func buildTools(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(bin)
	for _, c := range []string{"shuffle", "verify"} {
		if _, err := os.Stat(filepath.Join(dir, c)); err == nil {
			continue
		}
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, c), "../"+c).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", c, err, out)
		}
	}
	return "CLIPSHARD_BIN=" + dir
}

func runScript(t *testing.T, script string, env ...string) {
	t.Helper()
	cmd := exec.Command("bash", script)
	cmd.Env = append(append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000"), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", script, env, err, out)
	}
}

// arrayIDs reads the task ids of an "#SBATCH --array=A-B" line.
func arrayIDs(t *testing.T, script string) []int {
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#SBATCH --array=(\d+)-(\d+)$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("%s: no #SBATCH --array=A-B line", script)
	}
	a, _ := strconv.Atoi(m[1])
	z, _ := strconv.Atoi(m[2])
	var ids []int
	for i := a; i <= z; i++ {
		ids = append(ids, i)
	}
	return ids
}

// TestSlurmScripts runs the Slurm scripts of docs/scaling locally, each
// array task as Slurm would start it (its variables set, all at once),
// then the merge: the dataset equals a single-process convert, and the
// epochs written by concurrent tasks equal one shuffle run.
func TestSlurmScripts(t *testing.T) {
	path := buildTools(t)
	scripts := filepath.Join("..", "..", "docs", "scaling")
	data := copyDemo(t)
	work := t.TempDir()
	parts, dataset, epochs := filepath.Join(work, "parts"), filepath.Join(work, "dataset"), filepath.Join(work, "epochs")

	ids := arrayIDs(t, filepath.Join(scripts, "convert.sbatch"))
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runScript(t, filepath.Join(scripts, "convert.sbatch"), path, "DATA="+data, "PARTS="+parts,
				"MODALITIES=motion=motion/{clip}.pkl:exp+pose shape@clip=motion/{clip}.pkl:shape whisper@2=whisper/{clip}.npy emotion=emotion/{clip}.npy",
				fmt.Sprintf("SLURM_ARRAY_TASK_ID=%d", id), fmt.Sprintf("SLURM_ARRAY_TASK_COUNT=%d", len(ids)),
				fmt.Sprintf("SLURM_ARRAY_TASK_MIN=%d", ids[0]), "SLURM_CPUS_PER_TASK=2")
		}()
	}
	wg.Wait()
	runScript(t, filepath.Join(scripts, "merge.sbatch"), path, "PARTS="+parts, "DATASET="+dataset)

	single := filepath.Join(work, "single")
	if r := runConvert(t, nil, demoArgs(data, single)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	sameTree(t, snapshot(t, single), snapshot(t, dataset), "Slurm parts + merge vs one process")

	// Epochs: one task per epoch of the array, concurrently, into one folder.
	epIDs := arrayIDs(t, filepath.Join(scripts, "shuffle.sbatch"))[:4]
	for _, id := range epIDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runScript(t, filepath.Join(scripts, "shuffle.sbatch"), path, "DATASET="+dataset, "EPOCHS="+epochs,
				fmt.Sprintf("SLURM_ARRAY_TASK_ID=%d", id), "SHARD_SAMPLES=8", "MEM=64KiB")
		}()
	}
	wg.Wait()
	one := filepath.Join(work, "one")
	cmd := exec.Command(filepath.Join(filepath.Dir(bin), "shuffle"), "--dataset", dataset, "--out", one, "--epochs", "4",
		"--window", "15", "--seed", "1", "--shard-samples", "8", "--quiet")
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("shuffle: %v %s", err, out)
	}
	sameTree(t, snapshot(t, one), snapshot(t, epochs), "epochs: one run vs 4 array tasks")
	vcmd := exec.Command(filepath.Join(filepath.Dir(bin), "verify"), "--deep", "--quiet", epochs)
	if out, err := vcmd.CombinedOutput(); err != nil {
		t.Fatalf("verify --deep: %v %s", err, out)
	}
}

// TestKubernetesIndexedJob runs the container command of
// docs/scaling/convert-job.yaml once per completion index, as the Indexed
// Job would (with /data mapped to a local folder), then the merge.
func TestKubernetesIndexedJob(t *testing.T) {
	path := buildTools(t)
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "scaling", "convert-job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^  completions: (\d+)$`).FindSubmatch(b)
	c := regexp.MustCompile(`(?m)^\s+command: (\[.*\])$`).FindSubmatch(b)
	if m == nil || c == nil {
		t.Fatal("convert-job.yaml: no completions or command line")
	}
	n, _ := strconv.Atoi(string(m[1]))
	var command []string
	if err := json.Unmarshal(c[1], &command); err != nil {
		t.Fatalf("command is not a flow list: %v", err)
	}
	data := copyDemo(t)
	binDir := strings.TrimPrefix(path, "CLIPSHARD_BIN=")
	for i := range command {
		command[i] = strings.ReplaceAll(command[i], "/data", data)
		command[i] = strings.ReplaceAll(command[i], "/clipshard/bin", binDir)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(command[0], command[1:]...)
			cmd.Env = append(os.Environ(), fmt.Sprintf("JOB_COMPLETION_INDEX=%d", i), "SOURCE_DATE_EPOCH=1700000000")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("index %d: %v\n%s", i, err, out)
			}
		}()
	}
	wg.Wait()
	partDirs, _ := filepath.Glob(filepath.Join(data, "parts", "part-*"))
	if len(partDirs) != n {
		t.Fatalf("%d parts, want %d", len(partDirs), n)
	}
	merged := filepath.Join(t.TempDir(), "dataset")
	if r := runConvert(t, nil, append(append([]string{"--merge"}, partDirs...), "--out", merged)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	single := filepath.Join(t.TempDir(), "single")
	if r := runConvert(t, nil, demoArgs(data, single)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	sameTree(t, snapshot(t, single), snapshot(t, merged), "Indexed Job parts + merge vs one process")
}
