package formats

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/internal/units"
)

// WholeLimit is the largest .npy source read whole (a per-clip value, or
// one below the streaming size): the memory this machine has, or its
// memory cgroup's limit where that is lower. A larger one (a sparse file,
// a per-clip value that is really a time series) is refused before
// anything is allocated: allocating it ends the process (the Go runtime's
// "out of memory", or the kernel's OOM killer) instead of saying which
// file. A variable for the tests.
var WholeLimit = sync.OnceValue(machineMemory)

// machineMemory is the physical memory, or the lowest memory cgroup limit
// where that is lower.
func machineMemory() int64 {
	var si unix.Sysinfo_t
	mem := int64(1) << 62
	if unix.Sysinfo(&si) == nil && si.Totalram > 0 {
		mem = int64(si.Totalram) * int64(max(si.Unit, 1))
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	return cgroupLimit("/sys/fs/cgroup", string(b), mem)
}

// cgroupLimit lowers mem to the lowest memory limit of the cgroups that
// procCgroup (the text of /proc/self/cgroup) names under root: v2
// memory.max of the cgroup and of each of its ancestors (under root, or
// root/unified in the hybrid layout), v1 memory.limit_in_bytes of the
// memory controller's cgroup (root/memory/PATH, else root/memory).
func cgroupLimit(root, procCgroup string, mem int64) int64 {
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "/") {
			continue
		}
		var files []string
		switch {
		case f[0] == "0" && f[1] == "":
			for p := f[2]; ; p = filepath.Dir(p) {
				files = append(files, filepath.Join(root, p, "memory.max"), filepath.Join(root, "unified", p, "memory.max"))
				if p == "/" {
					break
				}
			}
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			files = append(files, filepath.Join(root, "memory", f[2], "memory.limit_in_bytes"), filepath.Join(root, "memory", "memory.limit_in_bytes"))
		}
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				// ("max" where there is no limit.)
				if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
					mem = min(mem, n)
				}
			}
		}
	}
	return mem
}

// checkWhole refuses a .npy source of size bytes read whole that is larger
// than WholeLimit.
func checkWhole(size int64) error {
	if lim := WholeLimit(); size > lim {
		return fmt.Errorf("%d bytes (%s) to read whole, more than the memory of this machine (or its memory cgroup): %s; a value of one clip (NAME@clip=) is read whole: is it a time series (NAME=TEMPLATE, converted a piece at a time)? Else its header or size is wrong (a sparse file)",
			size, units.Bytes(size), units.Bytes(lim))
	}
	return nil
}
