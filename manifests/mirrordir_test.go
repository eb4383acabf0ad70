package manifests

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestSweepMirrors: a sweep removes only the folders a killed mirror
// leaves (marked, or empty, and not locked) and nothing else of the same
// prefix: a symbolic link to a marked folder, a marked folder of another
// user, a folder whose marker says something else, a folder holding other
// files, a file, a live (locked) mirror's folder.
func TestSweepMirrors(t *testing.T) {
	tmp := t.TempDir()
	mk := func(name string, files map[string]string) string {
		p := filepath.Join(tmp, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		for n, s := range files {
			if err := os.WriteFile(filepath.Join(p, n), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	marked := map[string]string{mirrorMark: string(mirrorMarkText), "mirror": ""}
	mk(mirrorPrefix+"dead", marked)
	mk(mirrorPrefix+"empty", nil)
	target := mk("elsewhere", marked)
	if err := os.Symlink(target, filepath.Join(tmp, mirrorPrefix+"link")); err != nil {
		t.Fatal(err)
	}
	mk(mirrorPrefix+"othermark", map[string]string{mirrorMark: "mine\n"})
	mk(mirrorPrefix+"files", map[string]string{"notes.txt": "the user's"})
	mk(mirrorPrefix+"bigmark", map[string]string{mirrorMark: string(mirrorMarkText) + "x"})
	// A marker that is a link to /dev/zero, or a FIFO: read, either would
	// never end or block the sweep.
	zero := mk(mirrorPrefix+"zero", nil)
	if err := os.Symlink("/dev/zero", filepath.Join(zero, mirrorMark)); err != nil {
		t.Fatal(err)
	}
	fifo := mk(mirrorPrefix+"fifo", nil)
	if err := syscall.Mkfifo(filepath.Join(fifo, mirrorMark), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, mirrorPrefix+"file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	live := mk(mirrorPrefix+"live", marked)
	lock, err := lockedDir(live)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	want := []string{"elsewhere", mirrorPrefix + "bigmark", mirrorPrefix + "fifo", mirrorPrefix + "file", mirrorPrefix + "files", mirrorPrefix + "link", mirrorPrefix + "live", mirrorPrefix + "othermark", mirrorPrefix + "zero"}
	if os.Geteuid() == 0 {
		// As root: a marked folder another user owns is theirs to sweep.
		p := mk(mirrorPrefix+"nobody", marked)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		want = append(want, mirrorPrefix+"nobody")
		slices.Sort(want)
	}
	sweepMirrors(tmp)
	ents, _ := os.ReadDir(tmp)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after a sweep: %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(target, mirrorMark)); err != nil {
		t.Fatalf("the link's target: %v", err)
	}
	// Once its process is gone, the live one's folder goes too.
	lock.Close()
	sweepMirrors(tmp)
	if _, err := os.Stat(live); !os.IsNotExist(err) {
		t.Fatalf("a mirror no process holds: %v", err)
	}
}
