// Package clitest builds a command of this module and runs it, for tests
// that check the real binary's exit codes and output.
package clitest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/x448/float16"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
)

// Build builds the command in the current directory (a test's package)
// into a temporary folder and returns its path and a cleanup func. It is
// meant for TestMain; on failure it prints the build output and exits.
func Build(name string, flags ...string) (string, func()) { return BuildOf(name, ".", flags...) }

// BuildOf is Build of the command in the folder pkg (relative to the
// test's package).
func BuildOf(name, pkg string, flags ...string) (string, func()) {
	dir, err := os.MkdirTemp("", "clipshard-"+name+"-test")
	if err != nil {
		panic(err)
	}
	bin := filepath.Join(dir, name)
	if out, err := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, pkg)...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	return bin, func() { os.RemoveAll(dir) }
}

// Main is a test package's TestMain: it builds the command name into *bin
// (see Build), runs the tests and removes the build.
func Main(m *testing.M, name string, bin *string, flags ...string) {
	MainOf(m, name, ".", bin, flags...)
}

// MainOf is Main with the command of the folder pkg.
func MainOf(m *testing.M, name, pkg string, bin *string, flags ...string) {
	var cleanup func()
	*bin, cleanup = BuildOf(name, pkg, flags...)
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// Result is how a run ended. Code is -1 when the process was killed.
// MaxRSS is the command's peak resident memory (VmHWM, as it reports it
// when it exits; 0 if killed), and Elapsed its wall time.
type Result struct {
	Code           int
	Stdout, Stderr string
	MaxRSS         int64
	Elapsed        time.Duration
}

// RunTimeout bounds a Run: a command that hangs (on a FIFO, say) fails
// its test instead of the whole test binary's timeout.
const RunTimeout = 3 * time.Minute

// Run runs bin with args, the test environment plus SOURCE_DATE_EPOCH (so
// that outputs are byte-comparable) plus env. A run that takes longer than
// RunTimeout is killed and fails the test.
func Run(t testing.TB, bin string, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), RunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	peak := filepath.Join(t.TempDir(), "peak")
	cmd.Env = append(append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000", "CLIPSHARD_PEAK_FILE="+peak), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	began := time.Now()
	err := cmd.Run()
	elapsed := time.Since(began)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
		if !ee.Exited() {
			code = -1
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %v: still running after %v (hangs?); killed", filepath.Base(bin), args, RunTimeout)
	}
	if bytes.Contains(se.Bytes(), []byte("goroutine ")) {
		t.Fatalf("%s printed a stack trace:\n%s", filepath.Base(bin), se.String())
	}
	var rss int64
	if b, err := os.ReadFile(peak); err == nil {
		fmt.Sscanf(string(b), "%d kB", &rss)
		rss <<= 10
	}
	return Result{code, so.String(), se.String(), rss, elapsed}
}

// Tree returns every regular file under dir, by slash path relative to dir.
func Tree(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// SameTree fails the test unless a and b (from Tree) hold the same files
// with the same bytes.
func SameTree(t testing.TB, a, b map[string][]byte, what string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d files vs %d", what, len(a), len(b))
	}
	for name, data := range a {
		other, ok := b[name]
		if !ok {
			t.Fatalf("%s: %s only on one side", what, name)
		}
		if !bytes.Equal(data, other) {
			t.Fatalf("%s: %s differs", what, name)
		}
	}
}

// AllSame runs produce for every case (each writes a fresh output and
// returns its Tree) and fails the test unless all the trees are equal.
func AllSame(t testing.TB, cases []string, produce func(c string) map[string][]byte) {
	t.Helper()
	var first map[string][]byte
	for _, c := range cases {
		got := produce(c)
		if first == nil {
			first = got
			continue
		}
		SameTree(t, first, got, c+" vs "+cases[0])
	}
}

// CopyTree copies the files under src to dst (created), for tests that
// change their inputs.
func CopyTree(t testing.TB, src, dst string) {
	t.Helper()
	for rel, b := range Tree(t, src) {
		p := filepath.Join(dst, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Spread picks about n of the points 1..total for a crash test: all of
// them if there are few more, otherwise evenly spaced from a random start,
// and the last one always (a commit's). The choice is logged, so that a
// failure names its point.
func Spread(t testing.TB, total, n int) []int {
	t.Helper()
	var ks []int
	if total <= n+n/2 {
		for k := 1; k <= total; k++ {
			ks = append(ks, k)
		}
	} else {
		off := rand.IntN(total / n)
		for i := range n - 1 {
			ks = append(ks, 1+off+i*total/n)
		}
		ks = append(ks, total)
	}
	t.Logf("%d kill points, killing at %v", total, ks)
	return ks
}

// ClipSet writes one .npy per entry of rows, sub/c0.npy, c1.npy, ..., of
// that many rows x cols values of dt (BigNPY), under a new temporary
// folder, and returns its clip list. Memory tests put a large clip between
// small ones.
func ClipSet(t testing.TB, sub string, dt array.DType, cols int, rows ...int) string {
	t.Helper()
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, sub), 0o755); err != nil {
		t.Fatal(err)
	}
	var list strings.Builder
	for i, n := range rows {
		BigNPY(t, filepath.Join(src, sub, fmt.Sprintf("c%d.npy", i)), dt, n, cols)
		fmt.Fprintf(&list, "c%d\n", i)
	}
	path := filepath.Join(src, "clips.txt")
	if err := os.WriteFile(path, []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// ClipSetMods writes, for each of mods, one .npy per entry of rows under
// mod/ (as ClipSet does for one), and returns the clip list.
func ClipSetMods(t testing.TB, mods []string, dt array.DType, cols int, rows ...int) string {
	t.Helper()
	src := t.TempDir()
	var list strings.Builder
	for i := range rows {
		fmt.Fprintf(&list, "c%d\n", i)
	}
	for _, sub := range mods {
		if err := os.MkdirAll(filepath.Join(src, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		for i, n := range rows {
			// As BigNPY writes them (a 4096-byte header), in one write
			// without an fsync: thousands of small files.
			b, err := npy.EncodeHeader(dt.Descr(), false, []int{n, cols}, npy.DataAlign)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(src, sub, fmt.Sprintf("c%d.npy", i)), appendValues(b, dt, 0, n, cols), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	path := filepath.Join(src, "clips.txt")
	if err := os.WriteFile(path, []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// appendValues appends BigNPY's rows [r0, r1) of cols values of dt.
func appendValues(buf []byte, dt array.DType, r0, r1, cols int) []byte {
	for r := r0; r < r1; r++ {
		for c := 0; c < cols; c++ {
			v := float64((r*31+c*7)%4096)/1024 - 2
			switch dt.Size {
			case 2:
				buf = binary.LittleEndian.AppendUint16(buf, float16.Fromfloat32(float32(v)).Bits())
			case 4:
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(float32(v)))
			default:
				buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(v))
			}
		}
	}
	return buf
}

// BigNPY writes a C-order .npy of rows x cols values of dt (float16, 32 or
// 64) at path, in pieces (memory stays small whatever its size): finite
// values in [-2, 2) that vary with row and column, so that every clip's
// bytes differ.
func BigNPY(t testing.TB, path string, dt array.DType, rows, cols int) {
	t.Helper()
	w, err := npy.Create(path, dt, []int{cols})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	const piece = 4096 // rows
	buf := make([]byte, 0, piece*cols*dt.Size)
	for r0 := 0; r0 < rows; r0 += piece {
		buf = buf[:0]
		buf = appendValues(buf, dt, r0, min(rows, r0+piece), cols)
		if _, err := w.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// StaticBuild runs go build with CGO off (a static binary: the
// Dockerfile's and the wheel's build) under a lock shared by every test
// process of this machine (a file in the temporary folder), so that two
// packages' tests do not compile the standard library and every module
// without cgo at once on a cold build cache: the first compiles, the
// second finds it in Go's cache and links. dir is where go runs; env is
// added to the environment.
func StaticBuild(t testing.TB, dir string, env []string, name string, args ...string) []byte {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "clipshard-static-build.lock"), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return out
}

// List lists the files under dir (but __pycache__, which imports make).
func List(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return filepath.SkipDir
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// OneLine: a failure is one line on stderr, named, and nothing on stdout.
func OneLine(t testing.TB, r Result, code int, prefix string) {
	t.Helper()
	if r.Code != code || r.Stdout != "" || strings.Count(r.Stderr, "\n") != 1 || !strings.HasPrefix(r.Stderr, prefix) {
		t.Fatalf("want exit %d and one line %q... on stderr, got exit %d, stdout %q, stderr %q", code, prefix, r.Code, r.Stdout, r.Stderr)
	}
}

// WriteF32 writes a .npy of float32 [rows, cols] with value(r, c).
func WriteF32(t testing.TB, path string, rows, cols int, value func(r, c int) float32) {
	t.Helper()
	b, err := npy.EncodeHeader("<f4", false, []int{rows, cols}, npy.DataAlign)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(value(r, c)))
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Demo converts a copy of testdata/demo (motion, shape per clip, whisper)
// with the clipshard command bin and shuffles it into 2 epochs (W=1,
// shards of 64), each into a temporary folder of t's.
func Demo(t testing.TB, bin string) (ds, ep string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	CopyTree(t, DemoDir(), src)
	dir := t.TempDir()
	ds, ep = filepath.Join(dir, "ds"), filepath.Join(dir, "ep")
	if r := Run(t, bin, nil, "convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--out", ds, "-m", "motion=motion/{clip}.pkl:exp+pose",
		"-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := Run(t, bin, nil, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "1", "--epochs", "2", "--shard-samples", "64"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return ds, ep
}

// DemoDir is testdata/demo of this checkout.
func DemoDir() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "testdata", "demo")
}

// Long reports the one switch of the exhaustive cases:
// CLIPSHARD_EXHAUSTIVE set (just test-long, CI).
func Long() bool { return os.Getenv("CLIPSHARD_EXHAUSTIVE") != "" }

// LongOnly skips t unless Long(): a test that runs a bench script end to
// end (20-40 s each on a busy 2-core box, which kept the README's test
// command over its 10 minutes), run by CI and just test-long.
func LongOnly(t testing.TB, what string) {
	t.Helper()
	if !Long() {
		t.Skipf("%s: runs with CLIPSHARD_EXHAUSTIVE=1 (just test-long; CI sets it)", what)
	}
}

// Exhaustive is n, or all with Long: how many cases a test runs.
func Exhaustive(n, all int) int {
	if Long() {
		return all
	}
	return n
}
