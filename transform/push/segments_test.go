package push_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/internal/s3test"
	"github.com/clipshard/clipshard/manifests"
)

// growing is a folder of n clips' sources (g00, g01, ...: x [600+i, 100]
// float32) and a convert of their first clips into ds.
type growing struct {
	src, ds string
}

func newGrowing(t *testing.T, n int) *growing {
	t.Helper()
	g := &growing{src: t.TempDir(), ds: filepath.Join(t.TempDir(), "ds")}
	for i := range n {
		id := fmt.Sprintf("g%02d", i)
		clitest.WriteF32(t, filepath.Join(g.src, "x", id+".npy"), 600+i, 100, func(r, c int) float32 { return float32((r*5+c*3+i)%997) / 64 })
	}
	return g
}

// convert converts clips [0, n) of g's sources into dir, with extra flags.
func (g *growing) convert(t *testing.T, dir string, n int, extra ...string) {
	t.Helper()
	var ids strings.Builder
	for i := range n {
		fmt.Fprintf(&ids, "g%02d\n", i)
	}
	list := filepath.Join(g.src, fmt.Sprintf("clips-%d.txt", n))
	os.WriteFile(list, []byte(ids.String()), 0o644)
	args := append([]string{"convert", "--quiet", "--clips", list, "--root", g.src, "--out", dir, "-m", "x=x/{clip}.npy"}, extra...)
	if r := clip(t, args...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
}

// pushJSON pushes with --json and returns its summary.
func pushJSON(t *testing.T, s *s3test.Server, extraEnv []string, args ...string) (clitest.Result, map[string]any) {
	t.Helper()
	r := pushRun(t, s, extraEnv, append([]string{"--json"}, args...)...)
	var out map[string]any
	if r.Code == 0 {
		if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
			t.Fatalf("push --json: %v: %s", err, r.Stdout)
		}
	}
	return r, out
}

// segmentedTree is what the bucket holds after pushes of a dataset in
// segments (dir, its last state) and its earlier versions (extra: files
// of dropped versions the bucket keeps): dir's files, CLAIM, and a
// BLOCKSUMS in each folder holding blobs (taken from the bucket after
// checking it names exactly those blobs, with dir's sha256s).
func segmentedTree(t *testing.T, dir string, got map[string][]byte) map[string][]byte {
	t.Helper()
	want := clitest.Tree(t, dir)
	want[manifests.ClaimFile] = manifests.DatasetClaim(want[manifests.DatasetFile]).Marshal()
	k, err := manifests.KeptFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string][]string{}
	for f := range k.Blobs {
		groups[manifests.BlockFolder(f)] = append(groups[manifests.BlockFolder(f)], f)
	}
	for f, files := range groups {
		rel := manifests.BlockSumsOf(f)
		s, err := manifests.ParseBlockSums(got[rel], rel)
		if err != nil {
			t.Fatalf("the bucket's %s: %v", rel, err)
		}
		var names []string
		for _, bf := range s.Files {
			names = append(names, bf.Name)
			if k.Sums[bf.Name] != "" && bf.SHA256 != k.Sums[bf.Name] {
				t.Fatalf("%s: %s: sha256 %s, the folder's %s", rel, bf.Name, bf.SHA256, k.Sums[bf.Name])
			}
		}
		slices.Sort(files)
		if !slices.Equal(names, files) {
			t.Fatalf("%s lists %v, want %v", rel, names, files)
		}
		want[rel] = got[rel]
	}
	return want
}

// TestPushSegments (#61.5): a dataset pushed as format 1, grown by
// convert --segments and pushed again into the same prefix, sends only
// the new segment and the new version's manifests (no --force), leaves
// every object of version 1 as it was (a reader of it reads on), and the
// bucket then holds the folder's files (aws s3 sync gives it back) and
// verifies; an unrelated push, the old folder, and a fork of version 1
// are refused (exit 2) without --force; a push of a fork killed before its
// commit keeps the other fork out (its claim), and once it commits, the
// other is refused as not a fast-forward. A push of version 3 killed at
// points spread over it and run again leaves the bucket as a clean one.
func TestPushSegments(t *testing.T) {
	s := s3test.Start(t, "bkt")
	g := newGrowing(t, 48)
	g.convert(t, g.ds, 40)
	v1 := filepath.Join(t.TempDir(), "v1")
	clitest.CopyTree(t, g.ds, v1)
	root := filepath.Join(s.Root, "bkt", "ds")
	if r, _ := pushJSON(t, s, nil, g.ds, "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("push of version 1: %s", r.Stderr)
	}
	before := bucketTree(t, root)
	st0, _ := os.Stat(filepath.Join(root, "x.npy"))

	// Version 2: 4 clips appended (one new segment).
	g.convert(t, g.ds, 44, "--segments")
	v2 := filepath.Join(t.TempDir(), "v2")
	clitest.CopyTree(t, g.ds, v2)
	r, out := pushJSON(t, s, nil, g.ds, "s3://bkt/ds")
	if r.Code != 0 {
		t.Fatalf("push of version 2 over version 1: %d %s", r.Code, r.Stderr)
	}
	k, err := manifests.KeptFiles(g.ds)
	if err != nil {
		t.Fatal(err)
	}
	var segBytes int64
	for f := range k.Blobs {
		if strings.HasPrefix(f, "segments/") {
			st, _ := os.Stat(filepath.Join(g.ds, f))
			segBytes += st.Size()
		}
	}
	sent := int64(out["bytes_sent"].(float64))
	t.Logf("version 2 over version 1: %s", strings.TrimSpace(r.Stdout))
	if segBytes == 0 || sent < segBytes || float64(sent) > 1.1*float64(segBytes)+(2<<20) {
		t.Fatalf("the push of version 2 sent %d bytes; its new segment has %d (want at most 1.1x + 2 MiB)", sent, segBytes)
	}
	got := bucketTree(t, root)
	clitest.SameTree(t, got, segmentedTree(t, g.ds, got), "the bucket after a push of version 2")
	for rel, b := range before {
		if rel == manifests.DatasetFile || rel == manifests.ClaimFile {
			continue
		}
		if string(got[rel]) != string(b) {
			t.Fatalf("%s: changed by the push of version 2", rel)
		}
	}
	if st, _ := os.Stat(filepath.Join(root, "x.npy")); !os.SameFile(st0, st) || !st.ModTime().Equal(st0.ModTime()) {
		t.Fatal("x.npy (version 1's blob) was written again")
	}
	if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("verify of the bucket: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	// A segment's object damaged in the bucket: verify names it.
	var seg string
	for f := range k.Blobs {
		if strings.HasPrefix(f, "segments/") {
			seg = f
		}
	}
	p := filepath.Join(root, filepath.FromSlash(seg))
	good, _ := os.ReadFile(p)
	bad := slices.Clone(good)
	bad[len(bad)-1] ^= 1
	os.WriteFile(p, bad, 0o644)
	if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/ds"); r.Code != 1 || !strings.Contains(r.Stdout, "s3://bkt/ds/"+seg) {
		t.Fatalf("verify of a bucket whose %s is damaged: %d %s %s", seg, r.Code, r.Stdout, r.Stderr)
	}
	os.WriteFile(p, good, 0o644)
	if r := clitest.Run(t, bin, s.Env(), "inspect", "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("inspect of the bucket: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	if r := pushRun(t, s, nil, g.ds, "s3://bkt/ds"); r.Code != 0 || !strings.HasPrefix(r.Stdout, "up to date") {
		t.Fatalf("again: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}

	// The old folder (version 1 alone), an unrelated dataset: refused.
	r = pushRun(t, s, nil, v1, "s3://bkt/ds")
	oneLine(t, r, 2, "clipshard push: ")
	if !strings.Contains(r.Stderr, "holds version 2 of this dataset, later than") {
		t.Fatal(r.Stderr)
	}
	r = pushRun(t, s, nil, v2, "s3://bkt/ds") // (version 2 is current there: up to date)
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	other := newGrowing(t, 3)
	other.convert(t, other.ds, 3)
	other.convert(t, other.ds, 3, "--segments", "-m", "y=x/{clip}.npy")
	r = pushRun(t, s, nil, other.ds, "s3://bkt/ds")
	oneLine(t, r, 2, "clipshard push: ")
	if !strings.Contains(r.Stderr, "not a version") || !strings.Contains(r.Stderr, "--force") {
		t.Fatal(r.Stderr)
	}
	clitest.SameTree(t, bucketTree(t, root), got, "the bucket after refused pushes")

	// Two forks of version 2: A appends clips 44..47, B drops clip 0.
	a := filepath.Join(t.TempDir(), "a")
	b := filepath.Join(t.TempDir(), "b")
	clitest.CopyTree(t, v2, a)
	clitest.CopyTree(t, v2, b)
	g.convert(t, a, 48, "--segments")
	var ids strings.Builder
	for i := 1; i < 44; i++ {
		fmt.Fprintf(&ids, "g%02d\n", i)
	}
	list := filepath.Join(g.src, "drop0.txt")
	os.WriteFile(list, []byte(ids.String()), 0o644)
	if r := clip(t, "convert", "--quiet", "--clips", list, "--root", g.src, "--out", b, "-m", "x=x/{clip}.npy", "--segments"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	log := filepath.Join(t.TempDir(), "points")
	clean := "s3://bkt/clean"
	if r := pushRun(t, s, nil, v2, clean); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := pushRun(t, s, []string{"CLIPSHARD_FAULT_LOG=" + log}, a, clean); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	wantA := bucketTree(t, filepath.Join(s.Root, "bkt", "clean"))
	pb, _ := os.ReadFile(log)
	names := strings.Split(strings.TrimSpace(string(pb)), "\n")
	commitAt := slices.Index(names, "push.commit") + 1
	if commitAt <= 0 {
		t.Fatalf("no push.commit point: %v", names)
	}
	r = pushRun(t, s, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", commitAt)}, a, "s3://bkt/ds")
	if r.Code != -1 {
		t.Fatalf("A's push: not killed at its commit: %d %s", r.Code, r.Stderr)
	}
	r = pushRun(t, s, nil, b, "s3://bkt/ds")
	oneLine(t, r, 2, "clipshard push: ")
	t.Log(r.Stderr)
	if !strings.Contains(r.Stderr, "is claimed by") {
		t.Fatalf("B during A's push: %s", r.Stderr)
	}
	if r := pushRun(t, s, nil, a, "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("A resumed: %s", r.Stderr)
	}
	r = pushRun(t, s, nil, b, "s3://bkt/ds")
	oneLine(t, r, 2, "clipshard push: ")
	t.Log(r.Stderr)
	if !strings.Contains(r.Stderr, "version 3 of a dataset") {
		t.Fatalf("B after A's commit: %s", r.Stderr)
	}
	got = bucketTree(t, root)
	clitest.SameTree(t, got, segmentedTree(t, a, got), "the bucket after A's push")
	if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("verify after A: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	// --force: B replaces it (what A's version alone holds is removed).
	if r := pushRun(t, s, nil, "--force", b, "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("B --force: %s", r.Stderr)
	}
	got = bucketTree(t, root)
	clitest.SameTree(t, got, segmentedTree(t, b, got), "the bucket after B --force")

	// A folder that dropped the bucket's version (convert --keep 1) after
	// growing from it still fast-forwards: its version's "previous" is the
	// bucket's; the bucket keeps what it held, and verifies.
	c := filepath.Join(t.TempDir(), "c")
	clitest.CopyTree(t, v2, c)
	g.convert(t, c, 48, "--segments")
	if r := clip(t, "convert", "--keep", "1", "--out", c); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if ns, _ := manifests.KeptVersions(c); !slices.Equal(ns, []int{3}) {
		t.Fatalf("kept after --keep 1: %v", ns)
	}
	if r := pushRun(t, s, nil, v2, "s3://bkt/dropped"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := pushRun(t, s, nil, c, "s3://bkt/dropped"); r.Code != 0 {
		t.Fatalf("push of version 3 (versions 1 and 2 dropped here) over version 2: %s", r.Stderr)
	}
	for _, n := range []string{"1", "2", "3"} {
		if _, err := os.Stat(filepath.Join(s.Root, "bkt", "dropped", "versions", n, "dataset.json")); err != nil {
			t.Fatalf("the bucket lost version %s: %v", n, err)
		}
	}
	if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/dropped"); r.Code != 0 {
		t.Fatalf("verify after a push from a folder that dropped versions: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}

	// Killed at points spread over a fast-forward push, then run again:
	// as a clean push.
	points := []int{1, 2, len(names) / 3, len(names) / 2, commitAt - 1, commitAt, len(names)}
	if clitest.Exhaustive(0, 1) == 1 {
		points = points[:0]
		for i := 1; i <= len(names); i++ {
			points = append(points, i)
		}
	}
	for k, at := range points {
		prefix := fmt.Sprintf("killed-%d", k)
		if r := pushRun(t, s, nil, v2, "s3://bkt/"+prefix); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		r := pushRun(t, s, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", at)}, a, "s3://bkt/"+prefix)
		if r.Code != -1 {
			t.Fatalf("point %d (%s): not killed: %d %s", at, names[at-1], r.Code, r.Stderr)
		}
		top, _ := os.ReadFile(filepath.Join(s.Root, "bkt", prefix, manifests.DatasetFile))
		v2top, _ := os.ReadFile(filepath.Join(v2, manifests.DatasetFile))
		if at < commitAt && string(top) != string(v2top) {
			t.Fatalf("killed at point %d (%s), before the commit: dataset.json is not version 2's", at, names[at-1])
		}
		if r := pushRun(t, s, nil, a, "s3://bkt/"+prefix); r.Code != 0 {
			t.Fatalf("resume after point %d (%s): %d %s", at, names[at-1], r.Code, r.Stderr)
		}
		clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", prefix)), wantA, fmt.Sprintf("resumed after a kill at point %d (%s)", at, names[at-1]))
	}
}

// TestDrawnFromBucketGrowing (#61.5): a reader of a dataset's version 1 in
// a bucket reads on, byte-equal, after version 2 is pushed over it; a
// reader of version 2 on the node that cached version 1 fetches only the
// new segment (testdata/check_drawn_bucket_grow.py).
func TestDrawnFromBucketGrowing(t *testing.T) {
	numpytest.Module(t, "boto3", "python3-boto3")
	s := s3test.Start(t, "bkt")
	g := newGrowing(t, 24)
	g.convert(t, g.ds, 20)
	v1 := filepath.Join(t.TempDir(), "v1")
	clitest.CopyTree(t, g.ds, v1)
	if r := pushRun(t, s, nil, v1, "s3://bkt/ds"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	g.convert(t, g.ds, 24, "--segments")
	s.Setenv(t)
	got := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_drawn_bucket_grow.py"), bin, v1, g.ds, "s3://bkt/ds", filepath.Join(t.TempDir(), "caches"))
	if !strings.Contains(string(got), "ok: drawn bucket grow") {
		t.Fatalf("check_drawn_bucket_grow: %s", got)
	}
	t.Logf("%s", got)
	// A hostile dataset.json in the bucket (format 2, its SHA256SUMS path
	// out of the folder; a SHA256SUMS line that is not a sha256): refused,
	// naming it, nothing read outside the cache.
	top := filepath.Join(s.Root, "bkt", "ds", "dataset.json")
	man, _ := os.ReadFile(top)
	var m map[string]any
	if err := json.Unmarshal(man, &m); err != nil {
		t.Fatal(err)
	}
	sums := m["files"].(map[string]any)["sha256sums"].(string)
	m["files"].(map[string]any)["sha256sums"] = "../../etc/passwd"
	bad, _ := json.Marshal(m)
	os.WriteFile(top, bad, 0o644)
	probe := filepath.Join(t.TempDir(), "probe.py")
	os.WriteFile(probe, []byte(`import sys
sys.path.insert(0, sys.argv[1])
import clipshard
try:
    clipshard.Loader(dataset=sys.argv[2], epochs=[0], batch_size=4, window=8, cache_dir=sys.argv[3], cache_limit="256MiB")
    print("taken")
except ValueError as e:
    print("refused:", e)
`), 0o644)
	py := filepath.Join("..", "..", "python")
	if out := string(numpytest.Run(t, probe, py, "s3://bkt/ds", filepath.Join(t.TempDir(), "c"))); !strings.Contains(out, "refused:") || !strings.Contains(out, "sha256sums") {
		t.Fatalf("a sha256sums path out of the folder: %s", out)
	}
	os.WriteFile(top, man, 0o644)
	sp := filepath.Join(s.Root, "bkt", "ds", filepath.FromSlash(sums))
	good, _ := os.ReadFile(sp)
	os.WriteFile(sp, []byte(strings.Replace(string(good), string(good[:64]), strings.Repeat("/.", 32), 1)), 0o644)
	if out := string(numpytest.Run(t, probe, py, "s3://bkt/ds", filepath.Join(t.TempDir(), "c"))); !strings.Contains(out, "refused:") || !strings.Contains(out, "not a sha256") {
		t.Fatalf("a SHA256SUMS line that is not a sha256: %s", out)
	}
	os.WriteFile(sp, good, 0o644)
}

// TestPushSegmentsHostile: a dataset in segments whose folder holds the
// user's own files (beside segments/, and in it) is refused naming one
// and the fix, as verify refuses it; a segment's blob that is a FIFO, a segment folder or a blob that
// is a symbolic link out of the folder (to a copy of the same bytes),
// and a version's SHA256SUMS that is a link out, are each refused in one
// line naming it, never opened or waited on, and the prefix is left
// without a dataset.json.
func TestPushSegmentsHostile(t *testing.T) {
	s := s3test.Start(t, "bkt")
	g := newGrowing(t, 12)
	g.convert(t, g.ds, 10)
	g.convert(t, g.ds, 12, "--segments")
	k, err := manifests.KeptFiles(g.ds)
	if err != nil {
		t.Fatal(err)
	}
	var seg string // (a segment's blob)
	for f := range k.Blobs {
		if strings.HasPrefix(f, "segments/") {
			seg = f
		}
	}
	if seg == "" {
		t.Fatal("no segment")
	}
	clean := filepath.Join(t.TempDir(), "clean")
	clitest.CopyTree(t, g.ds, clean)

	// The user's files beside the dataset's (at the top, in segments/, in
	// a segment): refused as verify refuses them, naming the first and
	// the fix; nothing sent. Moved out, the push is the clean folder's.
	for _, f := range []string{"notes.txt", "segments/README", filepath.Dir(seg) + "/mine.txt"} {
		must(t, os.WriteFile(filepath.Join(g.ds, filepath.FromSlash(f)), []byte("the user's\n"), 0o644))
	}
	r := pushRun(t, s, nil, g.ds, "s3://bkt/mine")
	oneLine(t, r, 1, "clipshard push: ")
	if !strings.Contains(r.Stderr, "unexpected file (not in dataset.json: a file of yours? move it out") || !strings.Contains(r.Stderr, "and 2 more problems") {
		t.Fatalf("push of a folder holding the user's files: %s", r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "bkt", "mine")); err == nil {
		t.Fatal("the push of a folder holding the user's files wrote to the bucket")
	}
	for _, f := range []string{"notes.txt", "segments/README", filepath.Dir(seg) + "/mine.txt"} {
		must(t, os.Remove(filepath.Join(g.ds, filepath.FromSlash(f))))
	}
	if r := pushRun(t, s, nil, g.ds, "s3://bkt/mine"); r.Code != 0 {
		t.Fatalf("push: %d %s", r.Code, r.Stderr)
	}
	got := bucketTree(t, filepath.Join(s.Root, "bkt", "mine"))
	clitest.SameTree(t, got, segmentedTree(t, clean, got), "the bucket")

	outside := t.TempDir()
	cases := []struct {
		name, want string
		spoil      func(ds string)
	}{
		{"fifo", "not a regular file (a FIFO)", func(ds string) {
			p := filepath.Join(ds, filepath.FromSlash(seg))
			must(t, os.Remove(p))
			must(t, syscall.Mkfifo(p, 0o644))
		}},
		{"segment-link", "out of the folder", func(ds string) {
			p := filepath.Join(ds, filepath.FromSlash(filepath.Dir(seg)))
			to := filepath.Join(outside, "seg")
			must(t, os.Rename(p, to))
			must(t, os.Symlink(to, p))
		}},
		{"blob-link", "out of the folder", func(ds string) {
			p := filepath.Join(ds, "x.npy")
			to := filepath.Join(outside, "x.npy")
			must(t, os.Rename(p, to))
			must(t, os.Symlink(to, p))
		}},
		{"sums-link", "out of the folder", func(ds string) {
			p := filepath.Join(ds, filepath.FromSlash(manifests.VersionsDir+"/2/"+manifests.SumsFile))
			to := filepath.Join(outside, "SHA256SUMS")
			must(t, os.Rename(p, to))
			must(t, os.Symlink(to, p))
		}},
	}
	for _, c := range cases {
		ds := filepath.Join(t.TempDir(), c.name)
		clitest.CopyTree(t, clean, ds)
		c.spoil(ds)
		r = pushRun(t, s, nil, ds, "s3://bkt/"+c.name)
		if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || !strings.Contains(r.Stderr, c.want) {
			t.Fatalf("%s: push: exit %d, want one line saying %q: %s", c.name, r.Code, c.want, r.Stderr)
		}
		if _, err := os.Stat(filepath.Join(s.Root, "bkt", c.name, manifests.DatasetFile)); err == nil {
			t.Fatalf("%s: a dataset.json committed", c.name)
		}
		if c.name != "fifo" {
			if r := clip(t, "verify", ds); r.Code != 1 || !strings.Contains(r.Stdout, "a symbolic link to ") {
				t.Fatalf("%s: verify: exit %d %s %s", c.name, r.Code, r.Stdout, r.Stderr)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
