package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// TestSegmentsKeep: convert --keep N drops every version but the N newest:
// their manifests, and the blobs no kept version reads (a blob a kept
// version reads a row of stays, dead rows and all); epochs of a kept
// version still verify --deep, those of a dropped one are refused. With
// --keep 1 after a version that reads none of the first convert's rows,
// only its own files are left. A kill -9 at every step of a drop leaves
// the kept versions whole, and the re-run completes to the same files.
func TestSegmentsKeep(t *testing.T) {
	src := copyDemo(t)
	all := demoIDs(t, src)
	base := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy"}
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	l8, l12 := writeList(t, src, "l8.txt", all[:8]), writeList(t, src, "l12.txt", all)
	l10 := writeList(t, src, "l10.txt", all[:10])
	l4 := writeList(t, src, "l4.txt", all[8:])
	cut := func(ds, name string) string {
		ep := filepath.Join(t.TempDir(), name)
		if _, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: ds, Out: ep, EpochEnd: 1, Seed: 5, ShardSize: 8,
			Sampling: manifests.Sampling{Window: 15, Mode: "random", PerClip: 2, Short: "pad"}}); err != nil {
			t.Fatal(err)
		}
		return ep
	}
	epochsOK := func(ep string, ok bool, what string) {
		t.Helper()
		rep, err := manifests.VerifyEpochs(ep, manifests.VerifyOptions{Deep: true})
		if err != nil || rep.OK() != ok {
			t.Fatalf("%s: verify --deep: %v %v (want ok %v)", what, err, rep.Problems, ok)
		}
	}
	// versions 1 (8 clips), 2 (+4), 3 (clip003's whisper changed), 4 (10 clips)
	build := func(t *testing.T, epochs bool) (string, []string) {
		out := filepath.Join(t.TempDir(), "ds")
		var eps []string
		for i, l := range []string{l8, l12, l12, l10} {
			if i == 2 {
				wp := filepath.Join(src, "whisper", all[3]+".npy")
				b := must(os.ReadFile(wp))
				b[len(b)-5] ^= 0x20
				os.WriteFile(wp, b, 0o644)
			}
			if r := runConvert(t, env, segArgs(l, out, base, "--segments")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			if epochs {
				eps = append(eps, cut(out, fmt.Sprintf("ep%d", i+1)))
			}
		}
		return out, eps
	}
	out, eps := build(t, true)
	before := clitest.Tree(t, out)
	r := runConvert(t, env, "--keep", "2", "--out", out, "--json")
	if r.Code != 0 || !strings.Contains(r.Stdout, `"dropped_versions": [`) {
		t.Fatalf("--keep 2: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	after := clitest.Tree(t, out)
	for _, gone := range []string{"index.npy", "clips.parquet", "clips.txt", "SHA256SUMS", "versions/1/dataset.json", "versions/2/dataset.json", "versions/2/where.npy"} {
		if _, ok := after[gone]; ok {
			t.Fatalf("--keep 2: %s of a dropped version is still there", gone)
		}
		if _, ok := before[gone]; !ok {
			t.Fatalf("%s was not there before", gone)
		}
	}
	for f, b := range after {
		if !bytes.Equal(before[f], b) {
			t.Fatalf("--keep 2 changed %s", f)
		}
	}
	if _, ok := after["motion.npy"]; !ok {
		t.Fatal("--keep 2 removed motion.npy, which versions 3 and 4 read")
	}
	verifyOK(t, out)
	epochsOK(eps[0], false, "epochs of dropped version 1")
	epochsOK(eps[1], false, "epochs of dropped version 2")
	epochsOK(eps[2], true, "epochs of kept version 3")
	epochsOK(eps[3], true, "epochs of the current version 4")
	// Version 5 reads only the segment of version 2's clips: with --keep
	// 1, version 1's blobs and version 3's segment go too.
	if r := runConvert(t, env, segArgs(l4, out, base, "--segments", "--keep", "1")...); r.Code != 0 || !strings.Contains(r.Stdout, "dropped versions 3, 4") {
		t.Fatalf("--segments --keep 1: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	d, _ := manifests.LoadDataset(out)
	mine := d.OwnFiles()
	for f := range clitest.Tree(t, out) {
		if !mine[f] {
			t.Fatalf("after --keep 1: %s is not version 5's", f)
		}
	}
	verifyOK(t, out)
	sameClips(t, out, func() string {
		f := filepath.Join(t.TempDir(), "full")
		if r := runConvert(t, env, segArgs(l4, f, base)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		return f
	}(), "version 5 after the drop")
	epochsOK(eps[3], false, "epochs of dropped version 4")

	// Killed at every step of a drop of versions 1-3 (each build's files
	// differ, its sources' stamps with them: each case compares with an
	// uninterrupted drop of a copy of its own).
	ref, _ := build(t, false)
	points := faultPoints(t, func(e []string) clitest.Result { return runConvert(t, append(e, env...), "--keep", "1", "--out", ref) })
	for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(min(len(points), 5), len(points))) {
		t.Run(fmt.Sprintf("%d-%s", k, points[k-1]), func(t *testing.T) {
			out, _ := build(t, false)
			twin := filepath.Join(t.TempDir(), "ds")
			clitest.CopyTree(t, out, twin)
			if r := runConvert(t, env, "--keep", "1", "--out", twin); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
			want := clitest.Tree(t, twin)
			shards := shuffleTree(t, out, 2<<30)
			r := runConvert(t, append([]string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, env...), "--keep", "1", "--out", out)
			if r.Code != -1 {
				t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
			}
			// The current version reads as before; verify names only what
			// the drop left.
			clitest.SameTree(t, shards, shuffleTree(t, out, 2<<30), "the current version shuffled after the kill")
			rep, err := manifests.VerifyDataset(out, manifests.VerifyOptions{Deep: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range rep.Problems {
				if !strings.Contains(p.What, "left by a convert --keep killed") {
					t.Fatalf("after the kill: %v", p)
				}
			}
			if r := runConvert(t, env, "--keep", "1", "--out", out); r.Code != 0 {
				t.Fatalf("re-run: exit %d: %s", r.Code, r.Stderr)
			}
			clitest.SameTree(t, want, clitest.Tree(t, out), "after kill and re-run")
			verifyOK(t, out)
		})
	}
}

// TestMergeByReference: convert --merge --segments joins the parts of a
// partitioned convert by reference: each part's blobs become a segment
// of the merged dataset (format 2, version 1), hard links of the parts'
// files (no blob byte written), and the dataset reads clip by clip equal
// to a single-process convert, shuffles to its shards, verifies (--deep,
// --sources), keeps doing so with the parts removed, and grows with
// --segments. A kill at every step leaves --out as it was or merged
// whole; the re-run completes.
func TestMergeByReference(t *testing.T) {
	src := copyDemo(t)
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	single := filepath.Join(t.TempDir(), "single")
	if r := runConvert(t, env, demoArgs(src, single)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	partsDir := t.TempDir()
	for i := range 3 {
		if r := runConvert(t, env, demoArgs(src, filepath.Join(partsDir, "part-{part}"), "--part", fmt.Sprintf("%d/3", i))...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
	}
	parts, _ := filepath.Glob(filepath.Join(partsDir, "part-*"))
	merge := func(env []string, out string) clitest.Result {
		return runConvert(t, env, append(append([]string{"--merge"}, parts...), "--out", out, "--segments", "--json")...)
	}
	merged := filepath.Join(t.TempDir(), "merged")
	r := merge(env, merged)
	if r.Code != 0 || !strings.Contains(r.Stdout, `"bytes_out": 0`) {
		t.Fatalf("merge by reference: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	d, _ := manifests.LoadDataset(merged)
	if d.Version != 2 || d.Number() != 1 || len(d.Modalities[0].Blobs) != 3 {
		t.Fatalf("merged: format %d version %d, %d blobs", d.Version, d.Number(), len(d.Modalities[0].Blobs))
	}
	for _, f := range d.BlobFiles() {
		st, err := os.Stat(filepath.Join(merged, f))
		if err != nil {
			t.Fatal(err)
		}
		if n := st.Sys().(*syscall.Stat_t).Nlink; n != 2 {
			t.Fatalf("%s: %d links, want 2 (the part's file, linked)", f, n)
		}
	}
	check := func(what string) {
		t.Helper()
		sameClips(t, merged, single, what)
		rep, err := manifests.VerifyDataset(merged, manifests.VerifyOptions{Deep: true, Sources: true})
		if err != nil || !rep.OK() {
			t.Fatalf("%s: verify --deep --sources: %v %v", what, err, rep.Problems)
		}
		clitest.SameTree(t, shuffleTree(t, single, 2<<30), shuffleTree(t, merged, 64<<10), what+": shards")
	}
	check("merged by reference")
	// Killed at every step: --out as it was (none) or merged whole.
	points := faultPoints(t, func(e []string) clitest.Result { return merge(append(e, env...), filepath.Join(t.TempDir(), "m")) })
	for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(min(len(points), 5), len(points))) {
		t.Run(fmt.Sprintf("%d-%s", k, points[k-1]), func(t *testing.T) {
			parent := t.TempDir()
			out := filepath.Join(parent, "m")
			if r := merge(append([]string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, env...), out); r.Code != -1 {
				t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
			}
			if _, err := os.Stat(out); err == nil {
				verifyOK(t, out)
			}
			if r := merge(env, out); r.Code != 0 {
				t.Fatalf("re-run: exit %d: %s", r.Code, r.Stderr)
			}
			clitest.SameTree(t, clitest.Tree(t, merged), clitest.Tree(t, out), "after kill and re-run")
			if entries, _ := os.ReadDir(parent); len(entries) != 1 {
				t.Fatalf("left beside --out: %v", entries)
			}
		})
	}
	// The parts removed: the merged dataset holds its blobs.
	for _, p := range parts {
		os.RemoveAll(p)
	}
	check("with the parts removed")
	// Grown: a changed source, a new version of its rows only.
	wp := filepath.Join(src, "whisper", "clip005.npy")
	b := must(os.ReadFile(wp))
	b[len(b)-3] ^= 0x10
	os.WriteFile(wp, b, 0o644)
	if r := runConvert(t, env, demoArgs(src, merged, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := runConvert(t, env, demoArgs(src, single)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	check("grown after the merge")
}

// TestSegmentsHostile: a dataset in segments with a FIFO where a
// segment's blob was, or its segments folder replaced by a link to a
// folder of the user's: verify names the file (never waits on the FIFO),
// shuffle refuses it, convert --segments refuses to grow it, and nothing
// is written into the linked folder.
func TestSegmentsHostile(t *testing.T) {
	src := copyDemo(t)
	all := demoIDs(t, src)
	base := []string{"-m", "whisper@2=whisper/{clip}.npy"}
	l8, l12 := writeList(t, src, "l8.txt", all[:8]), writeList(t, src, "l12.txt", all)
	grown := func(t *testing.T) string {
		out := filepath.Join(t.TempDir(), "ds")
		for _, l := range []string{l8, l12} {
			if r := runConvert(t, nil, segArgs(l, out, base, "--segments")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
		}
		return out
	}
	refused := func(t *testing.T, out, want string) {
		t.Helper()
		rep, err := manifests.VerifyDataset(out, manifests.VerifyOptions{Deep: true})
		if err == nil && rep.OK() {
			t.Fatal("verify: ok")
		}
		if err == nil && !strings.Contains(fmt.Sprint(rep.Problems), want) {
			t.Fatalf("verify: %v, want %q named", rep.Problems, want)
		}
		if _, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: out, Out: filepath.Join(t.TempDir(), "e"), EpochEnd: 1,
			Sampling: manifests.Sampling{Window: 15, Mode: "tile", Short: "pad"}}); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("shuffle: %v, want %q named", err, want)
		}
		os.WriteFile(filepath.Join(src, "l13.txt"), []byte(strings.Join(all, "\n")+"\nclip000x\n"), 0o644)
		r := runConvert(t, nil, segArgs(l8, out, base, "--segments")...)
		if r.Code == 0 || !strings.Contains(r.Stderr, want) {
			t.Fatalf("convert --segments: exit %d: %s, want %q named", r.Code, r.Stderr, want)
		}
	}
	t.Run("fifo", func(t *testing.T) {
		out := grown(t)
		var blob string
		for f := range segFiles(t, out) {
			blob = f
		}
		os.Remove(filepath.Join(out, blob))
		if err := syscall.Mkfifo(filepath.Join(out, blob), 0o644); err != nil {
			t.Fatal(err)
		}
		refused(t, out, filepath.Base(blob))
	})
	t.Run("linked segments folder", func(t *testing.T) {
		out := grown(t)
		mine := filepath.Join(t.TempDir(), "mine")
		os.Rename(filepath.Join(out, "segments"), mine)
		os.Symlink(mine, filepath.Join(out, "segments"))
		before := clitest.Tree(t, mine)
		refused(t, out, "segments")
		clitest.SameTree(t, before, clitest.Tree(t, mine), "the linked folder")
	})
}
