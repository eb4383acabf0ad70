package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
)

// smallFS mounts a tmpfs of size bytes (root only: CI runs as root, and
// there a failed mount fails the test).
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("mounting a tmpfs needs root: %v", err)
		}
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill takes all but keep bytes of the filesystem at dir.
func fill(t *testing.T, dir string, keep int64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	if free > keep {
		if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, free-keep), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiskFull (#26 acceptance): a convert --force, an incremental
// convert and a shuffle of more epochs that run out of room fail with one
// line naming the cause, and leave the previous dataset and epochs as
// they were (byte for byte, and verify passes).
func TestDiskFull(t *testing.T) {
	buildTools(t)
	tools := filepath.Dir(bin)
	src := copyDemo(t)
	mnt := smallFS(t, "4m")
	out := filepath.Join(mnt, "ds")
	if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	edir := filepath.Join(mnt, "ep")
	shuffle := func(args ...string) clitest.Result {
		return clitest.Run(t, filepath.Join(tools, "shuffle"), nil, append([]string{"--quiet", "--dataset", out, "--out", edir, "--window", "15", "--seed", "7", "--shard-samples", "5"}, args...)...)
	}
	if r := shuffle("--epochs", "2"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	ds, ep := snapshot(t, out), snapshot(t, edir)
	fill(t, mnt, 64<<10)
	oneLine := func(what string, r clitest.Result) {
		t.Helper()
		t.Logf("%s: exit %d: %s", what, r.Code, strings.TrimSpace(r.Stderr))
		if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || !strings.Contains(r.Stderr, "space") && !strings.Contains(r.Stderr, "free") {
			t.Errorf("%s: exit %d, want one line about space left: %q", what, r.Code, r.Stderr)
		}
	}
	oneLine("convert --force", runConvert(t, nil, demoArgs(src, out, "--force")...))
	os.Chtimes(filepath.Join(src, "emotion", "clip005.npy"), timeFuture(), timeFuture())
	oneLine("incremental convert", runConvert(t, nil, demoArgs(src, out)...))
	oneLine("shuffle", shuffle("--epoch-range", "2:4"))
	sameTree(t, ds, snapshot(t, out), "the dataset after runs that ran out of room")
	sameTree(t, ep, snapshot(t, edir), "the epochs after a shuffle that ran out of room")
	for _, d := range []string{out, edir} {
		if v := clitest.Run(t, filepath.Join(tools, "verify"), nil, "--quiet", "--deep", d); v.Code != 0 {
			t.Errorf("verify %s: %s", d, v.Stdout)
		}
	}
	// With room again, the runs go through.
	os.Remove(filepath.Join(mnt, "filler"))
	if r := runConvert(t, nil, demoArgs(src, out)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
}

func timeFuture() time.Time { return time.Now().Add(time.Hour) }
