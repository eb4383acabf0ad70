package main_test

import (
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
)

// slurm is a single-node Slurm (Debian slurm-wlm + munge) started by a
// test on 127.0.0.1: munged with its own key, socket and pid file,
// slurmctld and slurmd in the foreground, everything under one folder,
// each stopped by its PID when the test ends.
type slurm struct {
	dir string
	env []string // SLURM_CONF, for sbatch, squeue, scontrol
}

const slurmInstall = "apt-get install slurm-wlm munge (.ci/run does it)"

// startSlurm starts the cluster, or skips the test (outside CI) if Slurm
// is not installed; in CI it fails.
func startSlurm(t *testing.T) *slurm {
	t.Helper()
	for _, c := range []string{"munged", "slurmctld", "slurmd", "sbatch"} {
		if _, err := exec.LookPath(c); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing in CI: %s", c, slurmInstall)
			}
			t.Skipf("no %s (a real single-node Slurm): %s", c, slurmInstall)
		}
	}
	if os.Getuid() != 0 {
		t.Skip("starting slurmd here needs root (it runs the jobs as their users)")
	}
	s := &slurm{dir: t.TempDir()}
	for _, d := range []string{"state", "spool", "munge"} {
		os.Mkdir(filepath.Join(s.dir, d), 0o700)
	}
	m := filepath.Join(s.dir, "munge")
	key := make([]byte, 1024)
	rand.Read(key)
	os.WriteFile(filepath.Join(m, "munge.key"), key, 0o400)
	sock := filepath.Join(m, "munge.socket")
	if out, err := exec.Command("munged", "--force", "--key-file="+filepath.Join(m, "munge.key"), "--socket="+sock,
		"--pid-file="+filepath.Join(m, "munged.pid"), "--log-file="+filepath.Join(m, "munged.log"),
		"--seed-file="+filepath.Join(m, "munged.seed")).CombinedOutput(); err != nil {
		t.Fatalf("munged: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(m, "munged.pid")); err == nil {
			var pid int
			fmt.Sscan(string(b), &pid)
			stopPID(pid)
		}
	})
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	ctl, node := freePort(t), freePort(t)
	// The node declares 32 CPUs and 64 GiB (config_overrides), so that
	// the scripts' own --cpus-per-task and --mem fit on this box.
	conf := fmt.Sprintf(`ClusterName=clipshard-test
SlurmctldHost=%[1]s(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=%[2]s
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=%[3]d
SlurmdPort=%[4]d
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/slurmctld.log
SlurmdLogFile=%[5]s/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=32 RealMemory=65536 State=UNKNOWN
PartitionName=debug Nodes=%[1]s Default=YES MaxTime=INFINITE State=UP
`, host, sock, ctl, node, s.dir)
	cf := filepath.Join(s.dir, "slurm.conf")
	os.WriteFile(cf, []byte(conf), 0o644)
	s.env = []string{"SLURM_CONF=" + cf}
	for _, d := range []string{"slurmctld", "slurmd"} {
		cmd := exec.Command(d, "-D", "-f", cf)
		cmd.Env = append(os.Environ(), s.env...)
		log, _ := os.Create(filepath.Join(s.dir, d+".stdout"))
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		t.Cleanup(func() {
			stopPID(cmd.Process.Pid)
			cmd.Wait()
			log.Close()
		})
	}
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		out, _ := s.run("sinfo", "-h", "-o", "%T")
		if st := strings.TrimSpace(out); st == "idle" || st == "mixed" {
			return s
		}
		if time.Now().After(end) {
			b1, _ := os.ReadFile(filepath.Join(s.dir, "slurmctld.log"))
			b2, _ := os.ReadFile(filepath.Join(s.dir, "slurmd.log"))
			t.Fatalf("the node did not come up (sinfo: %q)\n%s\n%s", out, tail(b1), tail(b2))
		}
	}
}

func (s *slurm) run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), s.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// sbatch submits a job (its environment: this one, and env), returning
// its id.
func (s *slurm) sbatch(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("sbatch", append([]string{"--parsable"}, args...)...)
	cmd.Env = append(append(os.Environ(), s.env...), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch %v: %v\n%s", args, err, out)
	}
	id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	return id
}

// wait waits until no job is queued or running, and returns each job's
// state and exit code (scontrol).
func (s *slurm) wait(t *testing.T, limit time.Duration, jobs ...string) map[string]string {
	t.Helper()
	for end := time.Now().Add(limit); ; time.Sleep(300 * time.Millisecond) {
		out, _ := s.run("squeue", "-h")
		if strings.TrimSpace(out) == "" {
			break
		}
		if time.Now().After(end) {
			s.run("scancel", "--user=root")
			t.Fatalf("jobs still queued after %v:\n%s", limit, out)
		}
	}
	states := map[string]string{}
	for _, j := range jobs {
		out, _ := s.run("scontrol", "-o", "show", "job", j)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var id, state, code string
			for _, f := range strings.Fields(line) {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "JobId":
					id = v
				case "JobState":
					state = v
				case "ExitCode":
					code = v
				}
			}
			states[id] = state + " " + code
		}
	}
	return states
}

func stopPID(pid int) {
	if pid <= 0 {
		return
	}
	syscall.Kill(-pid, syscall.SIGTERM)
	syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGKILL)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// TestSlurmChain (#36.7): the unmodified docs/scaling scripts under a real
// single-node Slurm (started here on 127.0.0.1, stopped by PID): the
// convert array (its own #SBATCH --array), the merge after it
// (--dependency=afterok), and a 4-task shuffle array after that. Every
// job completes with exit 0; the dataset is byte-identical to a
// single-process convert, the epochs to one shuffle run of 4 epochs, and
// verify --deep finds both intact. (TestSlurmScripts runs the same scripts
// with Slurm's variables simulated, in a second.)
func TestSlurmChain(t *testing.T) {
	s := startSlurm(t)
	path := buildTools(t)
	scripts, err := filepath.Abs(filepath.Join("..", "..", "docs", "scaling"))
	if err != nil {
		t.Fatal(err)
	}
	data := copyDemo(t)
	work := t.TempDir()
	logs := filepath.Join(work, "logs")
	os.Mkdir(logs, 0o755)
	parts, dataset, epochs := filepath.Join(work, "parts"), filepath.Join(work, "dataset"), filepath.Join(work, "epochs")
	mods := "motion=motion/{clip}.pkl:exp+pose shape@clip=motion/{clip}.pkl:shape whisper@2=whisper/{clip}.npy emotion=emotion/{clip}.npy"
	env := []string{path, "SOURCE_DATE_EPOCH=1700000000", "MODALITIES=" + mods}
	j1 := s.sbatch(t, env, "--chdir="+logs, "--export=ALL,DATA="+data+",PARTS="+parts, filepath.Join(scripts, "convert.sbatch"))
	j2 := s.sbatch(t, env, "--chdir="+logs, "--dependency=afterok:"+j1, "--export=ALL,PARTS="+parts+",DATASET="+dataset, filepath.Join(scripts, "merge.sbatch"))
	j3 := s.sbatch(t, env, "--chdir="+logs, "--array=0-3", "--dependency=afterok:"+j2,
		"--export=ALL,DATASET="+dataset+",EPOCHS="+epochs+",SHARD_SAMPLES=8,MEM=64KiB", filepath.Join(scripts, "shuffle.sbatch"))
	states := s.wait(t, 3*time.Minute, j1, j2, j3)
	for id, st := range states {
		if st != "COMPLETED 0:0" {
			entries, _ := os.ReadDir(logs)
			var b strings.Builder
			for _, e := range entries {
				c, _ := os.ReadFile(filepath.Join(logs, e.Name()))
				fmt.Fprintf(&b, "%s:\n%s\n", e.Name(), tail(c))
			}
			t.Fatalf("job %s: %s (all: %v)\n%s", id, st, states, b.String())
		}
	}
	// One process each, for comparison.
	single := filepath.Join(work, "single")
	r := runConvert(t, []string{"SOURCE_DATE_EPOCH=1700000000"}, "--clips", filepath.Join(data, "clips.txt"), "--root", data, "--out", single, "--quiet",
		"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy", "-m", "emotion=emotion/{clip}.npy")
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	clitest.SameTree(t, clitest.Tree(t, dataset), clitest.Tree(t, single), "the dataset of the Slurm chain and a single-process convert")
	one := filepath.Join(work, "one")
	cs := filepath.Join(strings.TrimPrefix(path, "CLIPSHARD_BIN="), "clipshard")
	sh := exec.Command(cs, "shuffle", "--dataset", dataset, "--out", one, "--epochs", "4", "--window", "15", "--seed", "1",
		"--shard-samples", "8", "--mem", "64KiB", "--quiet")
	sh.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("shuffle: %v\n%s", err, out)
	}
	clitest.SameTree(t, clitest.Tree(t, epochs), clitest.Tree(t, one), "the epochs of 4 Slurm array tasks and one shuffle run")
	for _, d := range []string{dataset, epochs} {
		if out, err := exec.Command(cs, "verify", "--deep", "--quiet", d).CombinedOutput(); err != nil {
			t.Fatalf("verify --deep %s: %v\n%s", d, err, out)
		}
	}
	t.Logf("jobs: %v", states)
}
