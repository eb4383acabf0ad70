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

// TestIncremental: a convert over its previous dataset decodes only the
// clips whose sources changed, says how much it reused, and writes the
// bytes of a full rebuild. A rewrite that keeps a source's size and mtime
// (touch -r, cp -p, rsync -t, or one within the mtime's granularity) is a
// change too: its ctime or inode differ (#26.7; before, the garbage below
// was reused, exit 0).
func TestIncremental(t *testing.T) {
	buildTools(t) // verify
	src := copyDemo(t)
	out := filepath.Join(t.TempDir(), "ds")
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	if r := runConvert(t, env, demoArgs(src, out)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	// A changed source: clip005's emotion, one value (size unchanged).
	emo := filepath.Join(src, "emotion", "clip005.npy")
	b, _ := os.ReadFile(emo)
	b[len(b)-3] ^= 0x01
	os.WriteFile(emo, b, 0o644)
	future := time.Now().Add(time.Minute)
	os.Chtimes(emo, future, future)
	r := runConvert(t, env, append(demoArgs(src, out), "--json")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, `"reused": 11`) || !strings.Contains(r.Stdout, `"reused_in_part": 1`) {
		t.Fatalf("incremental: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	// The same, in words.
	os.Chtimes(emo, future.Add(time.Minute), future.Add(time.Minute))
	r = runConvert(t, env, demoArgs(src, out)...)
	if want := "reused from the previous dataset (sources unchanged, not decoded): all the rows of 11 clips, and some modalities of 1 more clip"; r.Code != 0 || !strings.Contains(r.Stdout+r.Stderr, want) {
		t.Fatalf("summary: want %q: %s %s", want, r.Stdout, r.Stderr)
	}
	// A source rewritten in place with its old size and mtime (touch -r):
	// decoded, so the garbage is found.
	pkl := filepath.Join(src, "motion", "clip007.pkl")
	orig, _ := os.ReadFile(pkl)
	st, _ := os.Stat(pkl)
	os.WriteFile(pkl, make([]byte, st.Size()), 0o644)
	os.Chtimes(pkl, st.ModTime(), st.ModTime())
	if r := runConvert(t, env, demoArgs(src, out)...); r.Code != 1 || !strings.Contains(r.Stderr, "clip007.pkl") {
		t.Fatalf("same size and mtime, other bytes: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	if r := runConvert(t, nil, "--clean", "--out", out); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	// Written elsewhere and renamed into place with the old size and mtime
	// (rsync -t): a new inode, decoded; only the pickle's two modalities.
	tmp := pkl + ".tmp"
	os.WriteFile(tmp, orig, 0o644)
	os.Chtimes(tmp, st.ModTime(), st.ModTime())
	os.Rename(tmp, pkl)
	if r := runConvert(t, env, append(demoArgs(src, out), "--json")...); r.Code != 0 || !strings.Contains(r.Stdout, `"reused": 11`) || !strings.Contains(r.Stdout, `"reused_in_part": 1`) {
		t.Fatalf("renamed into place: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}

	// With the source back, the incremental result equals a full rebuild.
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo", "motion"), filepath.Join(src, "motion"))
	if r := runConvert(t, env, demoArgs(src, out)...); r.Code != 0 || !strings.Contains(r.Stdout, "all the rows of 0 clips, and some modalities of 12 more clips") {
		// (the pickles were copied again: new mtimes, all decoded)
		t.Fatalf("after restoring: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	full := filepath.Join(t.TempDir(), "full")
	if r := runConvert(t, env, demoArgs(src, full)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	sameTree(t, snapshot(t, full), snapshot(t, out), "incremental vs full rebuild")

	// A previous blob replaced by a FIFO is not waited on: its rows are
	// decoded again.
	os.Remove(filepath.Join(out, "whisper.npy"))
	if err := syscall.Mkfifo(filepath.Join(out, "whisper.npy"), 0o644); err != nil {
		t.Fatal(err)
	}
	// (a run that hangs fails in clitest.Run)
	if r := runConvert(t, env, demoArgs(src, out)...); r.Code != 0 {
		t.Fatalf("over a FIFO: exit %d: %s", r.Code, r.Stderr)
	}
	sameTree(t, snapshot(t, full), snapshot(t, out), "incremental over a FIFO vs full rebuild")
}
