package formats

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/npy"
)

// TestCgroupLimit: the memory limit of a whole read is the lowest of the
// machine's and its cgroups' (v2: the cgroup's and its ancestors'
// memory.max, "max" meaning none; v1: the memory controller's
// memory.limit_in_bytes), on a fake /sys/fs/cgroup.
func TestCgroupLimit(t *testing.T) {
	root := t.TempDir()
	put := func(p, s string) {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("a/memory.max", "300000000\n")
	put("a/b/memory.max", "max\n")
	put("memory/job/memory.limit_in_bytes", "167772160\n")
	put("memory/memory.limit_in_bytes", "9223372036854771712\n")
	for _, c := range []struct {
		proc string
		want int64
	}{
		{"0::/a/b\n", 300000000},                       // an ancestor's limit
		{"0::/a/b\n", 300000000},                       // (twice: nothing cached)
		{"0::/\n", 1 << 40},                            // none
		{"4:memory:/job\n0::/\n", 167772160},           // v1
		{"4:cpu,memory:/gone\n", 1 << 40},              // v1, no such cgroup: the root's (no limit)
		{"12:pids:/a\n1:name=systemd:/a/b\n", 1 << 40}, // other controllers
		{"0::/a/b\n4:memory:/job\n", 167772160},        // both: the lowest
		{"garbage\n0::relative\n", 1 << 40},            // not a cgroup line
	} {
		if got := cgroupLimit(root, c.proc, 1<<40); got != c.want {
			t.Errorf("%q: %d, want %d", c.proc, got, c.want)
		}
	}
	if got := cgroupLimit(root, "0::/a/b\n", 1<<20); got != 1<<20 {
		t.Errorf("the machine's lower: %d", got)
	}
	if m := machineMemory(); m < 64<<20 {
		t.Errorf("this machine's memory: %d", m)
	}
}

// TestWholeLimit: a .npy read whole that is larger than WholeLimit is
// refused naming the file and both sizes (nothing allocated); one at the
// limit is read.
func TestWholeLimit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "v.npy")
	h, _ := npy.EncodeHeader("<f4", false, []int{32}, 128)
	os.WriteFile(p, append(h, make([]byte, 128)...), 0o644)
	defer func(f func() int64) { WholeLimit = f }(WholeLimit)
	WholeLimit = func() int64 { return 256 }
	if _, err := Load(p, ""); err != nil {
		t.Fatal(err)
	}
	WholeLimit = func() int64 { return 255 }
	_, err := Load(p, "")
	if err == nil || !strings.Contains(err.Error(), p+": 256 bytes (256B) to read whole") || !strings.Contains(err.Error(), ": 255B;") {
		t.Fatalf("over the limit: %v", err)
	}
}
