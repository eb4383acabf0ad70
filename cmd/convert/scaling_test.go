package main_test

import (
	"debug/elf"
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

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// buildTools builds clipshard (whose subcommands the scripts call), shuffle
// and verify next to the convert binary under test and returns
// CLIPSHARD_BIN=that folder.
func buildTools(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(bin)
	for _, c := range []string{"clipshard", "shuffle", "verify"} {
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

// TestKubernetesIndexedJob runs docs/scaling/convert-job.yaml's pods as
// the Indexed Job would start them (the ConfigMap's variables, and
// JOB_COMPLETION_INDEX, in the environment of the container's command,
// with /data mapped to a local folder), then merge-job.yaml's pod, with
// binaries built by the Dockerfile's go build line (and checked static;
// with CLIPSHARD_EXHAUSTIVE=1, CI: else its packages built as the tests'
// are): the merged, verified dataset equals a single-process convert.
func TestKubernetesIndexedJob(t *testing.T) {
	numpytest.Module(t, "yaml", "python3-yaml")
	scaling := filepath.Join("..", "..", "docs", "scaling")
	var docs []struct {
		Kind     string `json:"kind"`
		Metadata struct{ Name string }
		Data     map[string]string `json:"data"`
		Spec     struct {
			Completions    *int   `json:"completions"`
			CompletionMode string `json:"completionMode"`
			Template       struct {
				Spec struct {
					SecurityContext struct {
						RunAsNonRoot bool `json:"runAsNonRoot"`
						RunAsUser    int  `json:"runAsUser"`
					} `json:"securityContext"`
					Containers []struct {
						Image   string
						Command []string
						Args    []string
						EnvFrom []struct {
							ConfigMapRef struct{ Name string } `json:"configMapRef"`
						} `json:"envFrom"`
					}
				}
			}
		}
	}
	out := numpytest.Run(t, filepath.Join("..", "..", "testdata", "k8s_docs.py"),
		filepath.Join(scaling, "convert-job.yaml"), filepath.Join(scaling, "merge-job.yaml"))
	if err := json.Unmarshal(out, &docs); err != nil || len(docs) != 3 || docs[0].Kind != "ConfigMap" || docs[1].Kind != "Job" || docs[2].Kind != "Job" {
		t.Fatalf("want a ConfigMap and two Jobs: %v %s", err, out)
	}
	cm, conv, merge := docs[0], docs[1], docs[2]
	n, err := strconv.Atoi(cm.Data["PARTS_COUNT"])
	if conv.Spec.Completions == nil || conv.Spec.CompletionMode != "Indexed" || err != nil || *conv.Spec.Completions != n {
		t.Fatalf("convert Job: completions %v (%s), PARTS_COUNT %q: want an Indexed Job with completions = PARTS_COUNT",
			conv.Spec.Completions, conv.Spec.CompletionMode, cm.Data["PARTS_COUNT"])
	}
	for _, j := range []int{1, 2} {
		ps := docs[j].Spec.Template.Spec
		if len(ps.Containers) != 1 || !ps.SecurityContext.RunAsNonRoot || ps.SecurityContext.RunAsUser == 0 ||
			len(ps.Containers[0].EnvFrom) != 1 || ps.Containers[0].EnvFrom[0].ConfigMapRef.Name != cm.Metadata.Name ||
			ps.Containers[0].Image != conv.Spec.Template.Spec.Containers[0].Image {
			t.Fatalf("%s: want one container of the same image, non-root, its environment from ConfigMap %q: %+v", docs[j].Metadata.Name, cm.Metadata.Name, ps)
		}
	}

	// The Dockerfile's build, static binaries in /clipshard/bin, non-root.
	df, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`(?m)^RUN CGO_ENABLED=0 (go build .*) -o /out/ (.*)$`).FindSubmatch(df)
	if build == nil || !regexp.MustCompile(`(?m)^COPY --from=build /out/ /clipshard/bin/$`).Match(df) ||
		!regexp.MustCompile(`(?m)^USER [1-9][0-9]*:[1-9][0-9]*$`).Match(df) {
		t.Fatal("Dockerfile: want RUN CGO_ENABLED=0 go build ... -o /out/ ./cmd/..., COPY --from=build /out/ /clipshard/bin/, and a numeric non-root USER")
	}
	binDir := t.TempDir()
	if clitest.Long() {
		args := append(strings.Fields(string(build[1]))[1:], "-o", binDir+"/")
		args = append(args, strings.Fields(string(build[2]))...)
		clitest.StaticBuild(t, filepath.Join("..", ".."), nil, "go", args...) // (the Dockerfile's go build)
		for _, c := range []string{"clipshard", "convert", "shuffle", "verify"} {
			f, err := elf.Open(filepath.Join(binDir, c))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s is dynamically linked: busybox has no loader for it", c)
				}
			}
			f.Close()
		}
	} else {
		// The Dockerfile's packages, built as the tests' own are (its
		// CGO_ENABLED=0 -trimpath build compiles every package again on a
		// cold build cache: 162 s of this package's time with the other
		// core busy, on a fresh machine; CI builds it).
		cmd := exec.Command("go", append([]string{"build", "-o", binDir + "/"}, strings.Fields(string(build[2]))...)...)
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", build[2], err, out)
		}
	}

	// The pods, as Kubernetes would start them.
	data := copyDemo(t)
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	for k, v := range cm.Data {
		if v == "/data" || strings.HasPrefix(v, "/data/") {
			v = data + strings.TrimPrefix(v, "/data")
		}
		env = append(env, k+"="+v)
	}
	pod := func(c []string, extra ...string) ([]byte, error) {
		args := append([]string{}, c...)
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "/clipshard/bin/", binDir+"/")
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(append(os.Environ(), env...), extra...)
		return cmd.CombinedOutput()
	}
	convC, mergeC := conv.Spec.Template.Spec.Containers[0], merge.Spec.Template.Spec.Containers[0]
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if out, err := pod(append(convC.Command, convC.Args...), fmt.Sprintf("JOB_COMPLETION_INDEX=%d", i)); err != nil {
				t.Errorf("index %d: %v\n%s", i, err, out)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if out, err := pod(append(mergeC.Command, mergeC.Args...)); err != nil {
		t.Fatalf("merge pod: %v\n%s", err, out)
	}
	single := filepath.Join(t.TempDir(), "single")
	sargs := []string{"--clips", filepath.Join(data, "clips.txt"), "--root", data, "--out", single, "--quiet"}
	for _, m := range strings.Fields(cm.Data["MODALITIES"]) {
		sargs = append(sargs, "-m", m)
	}
	if r := runConvert(t, nil, sargs...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	sameTree(t, snapshot(t, single), snapshot(t, filepath.Join(data, "dataset")), "Indexed Job parts + merge Job vs one process")
}
