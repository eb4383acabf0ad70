package main_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// segArgs are the demo's arguments for a clip list and modalities.
func segArgs(list, out string, mods []string, extra ...string) []string {
	args := []string{"--clips", list, "--out", out, "--quiet"}
	args = append(args, mods...)
	return append(args, extra...)
}

// writeList writes the clip ids, one a line, into src/name.
func writeList(t *testing.T, src, name string, ids []string) string {
	t.Helper()
	p := filepath.Join(src, name)
	if err := os.WriteFile(p, []byte(strings.Join(ids, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// demoIDs returns the demo's clip ids.
func demoIDs(t *testing.T, src string) []string {
	var ids []string
	for _, l := range strings.Split(string(must(os.ReadFile(filepath.Join(src, "clips.txt")))), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			ids = append(ids, l)
		}
	}
	return ids
}

// clipBytes reads every clip's rows of every modality of the dataset in
// dir through its manifests (where.npy for format 2): clip id ->
// modality -> bytes, and the ids in order.
func clipBytes(t *testing.T, dir string) ([]string, map[string]map[string][]byte) {
	t.Helper()
	d, rows, err := manifests.Vouch(dir)
	if err != nil {
		t.Fatal(err)
	}
	starts, lengths, err := manifests.ReadIndex(filepath.Join(dir, d.Files.Index))
	if err != nil {
		t.Fatal(err)
	}
	wh, err := manifests.LoadWhere(dir, d, starts, lengths)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{}
	var ids []string
	for i, r := range rows {
		ids = append(ids, r.Clip)
		out[r.Clip] = map[string][]byte{}
		for k, m := range d.Modalities {
			b, first, n := d.Locate(wh, k, i, starts[i], lengths[i])
			blob := m.BlobList()[b]
			f, _, err := regfile.Open(filepath.Join(dir, blob.File))
			if err != nil {
				t.Fatal(err)
			}
			rb := (blob.Size - blob.DataOffset) / max(1, blob.Rows)
			buf := make([]byte, n*rb)
			if _, err := f.ReadAt(buf, blob.DataOffset+first*rb); err != nil {
				t.Fatalf("%s: clip %s: %v", blob.File, r.Clip, err)
			}
			f.Close()
			out[r.Clip][m.Name] = buf
		}
	}
	return ids, out
}

// sameClips fails unless the datasets in a and b hold the same clips in
// the same order with the same rows of every modality, and the same
// index.npy and clips.txt.
func sameClips(t *testing.T, a, b, what string) {
	t.Helper()
	ia, ra := clipBytes(t, a)
	ib, rb := clipBytes(t, b)
	if strings.Join(ia, ",") != strings.Join(ib, ",") {
		t.Fatalf("%s: clips %v, want %v", what, ia, ib)
	}
	for _, id := range ia {
		if len(ra[id]) != len(rb[id]) {
			t.Fatalf("%s: clip %s: modalities %d, want %d", what, id, len(ra[id]), len(rb[id]))
		}
		for m, x := range ra[id] {
			if !bytes.Equal(x, rb[id][m]) {
				t.Fatalf("%s: clip %s modality %s: rows differ from a full convert's", what, id, m)
			}
		}
	}
	da, _ := manifests.LoadDataset(a)
	db, _ := manifests.LoadDataset(b)
	for _, f := range [][2]string{{da.Files.Index, db.Files.Index}, {da.Files.IDs, db.Files.IDs}} {
		x, _ := os.ReadFile(filepath.Join(a, f[0]))
		y, _ := os.ReadFile(filepath.Join(b, f[1]))
		if !bytes.Equal(x, y) {
			t.Fatalf("%s: %s differs from the full convert's %s", what, f[0], f[1])
		}
	}
	if da.Clips != db.Clips || da.Frames != db.Frames || fmt.Sprint(da.Stats) != fmt.Sprint(db.Stats) {
		t.Fatalf("%s: %d clips %d frames stats %v, want %d %d %v", what, da.Clips, da.Frames, da.Stats, db.Clips, db.Frames, db.Stats)
	}
}

// shuffleTree shuffles the dataset in dir (2 epochs; mem small forces the
// external two-pass path) and returns its shard files' bytes.
func shuffleTree(t *testing.T, dir string, mem int64) map[string][]byte {
	t.Helper()
	return shuffleVersion(t, dir, mem, 0)
}

// shuffleVersion is shuffleTree of version v of the dataset in dir (0:
// the current one).
func shuffleVersion(t *testing.T, dir string, mem int64, v int) map[string][]byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "epochs")
	_, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: dir, Version: v, Out: out, EpochEnd: 2, Seed: 7, ShardSize: 8, Mem: mem,
		Sampling: manifests.Sampling{Window: 15, Mode: "random", PerClip: 3, Short: "pad"}})
	if err != nil {
		t.Fatal(err)
	}
	tree := clitest.Tree(t, out)
	for k := range tree {
		if strings.HasSuffix(k, ".json") || strings.HasSuffix(k, "SHA256SUMS") {
			delete(tree, k) // (they name the dataset)
		}
	}
	return tree
}

// segFiles lists the files under dir/segments.
func segFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	filepath.WalkDir(filepath.Join(dir, "segments"), func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			st, _ := os.Stat(p)
			rel, _ := filepath.Rel(dir, p)
			out[rel] = st.Size()
		}
		return nil
	})
	return out
}

// TestSegments (#61): over a dataset, convert --segments writes only what
// changed, as a new segment and a new version in place: clips appended
// (their rows only), a modality added (its blob only), sources changed
// (those clips' rows only), clips removed and reordered (a manifest
// only). Every version reads, clip by clip and modality by modality,
// byte-equal to a full convert of its clip list, shuffles to the same
// shards (in memory and on the external path), and verifies; the files
// of earlier versions are never rewritten; epochs cut from version 1 keep
// verifying; a convert without --segments writes one segment again,
// byte-identical to a full convert.
func TestSegments(t *testing.T) {
	src := copyDemo(t)
	all := demoIDs(t, src)
	if len(all) != 12 {
		t.Fatalf("demo clips: %v", all)
	}
	base := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy"}
	withEmo := append(append([]string{}, base...), "-m", "emotion=emotion/{clip}.npy")
	out := filepath.Join(t.TempDir(), "ds")
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	full := func(list string, mods []string) string {
		t.Helper()
		f := filepath.Join(t.TempDir(), "full")
		if r := runConvert(t, env, segArgs(list, f, mods)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		return f
	}
	// check compares the version in out with a full convert of list.
	check := func(what, list string, mods []string) {
		t.Helper()
		f := full(list, mods)
		sameClips(t, out, f, what)
		verifyOK(t, out)
		want := shuffleTree(t, f, 2<<30)
		clitest.SameTree(t, want, shuffleTree(t, out, 2<<30), what+": shuffled in memory")
		clitest.SameTree(t, want, shuffleTree(t, out, 64<<10), what+": shuffled on the external path")
	}
	// Every file of the dataset so far, to check that none is rewritten.
	kept := func() map[string][]byte {
		tree := clitest.Tree(t, out)
		delete(tree, "dataset.json") // the commit point, replaced by each version
		return tree
	}
	unchanged := func(before map[string][]byte, what string) {
		t.Helper()
		now := clitest.Tree(t, out)
		for f, b := range before {
			if !bytes.Equal(now[f], b) {
				t.Fatalf("%s: %s of an earlier version was rewritten or removed", what, f)
			}
		}
	}

	// Version 1: 8 clips, format 1, one segment under today's names.
	l8 := writeList(t, src, "l8.txt", all[:8])
	if r := runConvert(t, env, segArgs(l8, out, base, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if d, _ := manifests.LoadDataset(out); d.Version != 1 {
		t.Fatalf("a fresh convert --segments wrote format %d, want 1", d.Version)
	}
	ep1 := filepath.Join(t.TempDir(), "ep1")
	if _, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: out, Out: ep1, EpochEnd: 1, Seed: 3, ShardSize: 8,
		Sampling: manifests.Sampling{Window: 15, Mode: "random", PerClip: 3, Short: "pad"}}); err != nil {
		t.Fatal(err)
	}

	// Append 4 clips: a segment of their rows alone.
	before := kept()
	l12 := writeList(t, src, "l12.txt", all)
	r := runConvert(t, env, segArgs(l12, out, base, "--segments", "--json")...)
	if r.Code != 0 || !strings.Contains(r.Stdout, `"reused": 8`) {
		t.Fatalf("append: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	unchanged(before, "append")
	d, _ := manifests.LoadDataset(out)
	if d.Version != 2 || d.Number() != 2 {
		t.Fatalf("append: format %d version %d, want 2 2", d.Version, d.Number())
	}
	segs := segFiles(t, out)
	f4 := full(writeList(t, src, "l4.txt", all[8:]), base)
	var newBytes, segBytes int64
	for _, m := range []string{"motion", "shape", "whisper"} {
		st, _ := os.Stat(filepath.Join(f4, m+".npy"))
		newBytes += st.Size()
	}
	for _, n := range segs {
		segBytes += n
	}
	if len(segs) != 3 || segBytes != newBytes {
		t.Fatalf("append: segments %v (%d bytes), want the 4 new clips' 3 blobs (%d bytes)", segs, segBytes, newBytes)
	}
	check("append", l12, base)

	// Add a modality: its blob alone.
	before = kept()
	if r := runConvert(t, env, segArgs(l12, out, withEmo, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	unchanged(before, "add a modality")
	var added []string
	for f := range segFiles(t, out) {
		if _, ok := segs[f]; !ok {
			added = append(added, f)
		}
	}
	if len(added) != 1 || filepath.Base(added[0]) != "emotion.npy" {
		t.Fatalf("add a modality: new segment files %v, want one emotion.npy", added)
	}
	check("add a modality", l12, withEmo)

	// A changed source (clip003's whisper): that clip's whisper rows alone.
	segs = segFiles(t, out)
	before = kept()
	wp := filepath.Join(src, "whisper", all[3]+".npy")
	b := must(os.ReadFile(wp))
	b[len(b)-5] ^= 0x40
	os.WriteFile(wp, b, 0o644)
	if r := runConvert(t, env, segArgs(l12, out, withEmo, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	unchanged(before, "changed source")
	added = nil
	for f, n := range segFiles(t, out) {
		if _, ok := segs[f]; !ok {
			added = append(added, fmt.Sprintf("%s:%d", filepath.Base(f), n))
		}
	}
	_, rows := clipBytes(t, out)
	if want := fmt.Sprintf("whisper.npy:%d", 4096+len(rows[all[3]]["whisper"])); len(added) != 1 || added[0] != want {
		t.Fatalf("changed source: new segment files %v, want %s", added, want)
	}
	check("changed source", l12, withEmo)

	// Remove and reorder clips: a new manifest, no rows.
	segs = segFiles(t, out)
	before = kept()
	mixed := []string{all[11], all[2], all[7], all[0], all[9], all[4], all[5], all[10], all[1]}
	lm := writeList(t, src, "lm.txt", mixed)
	if r := runConvert(t, env, segArgs(lm, out, withEmo, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	unchanged(before, "remove and reorder")
	if now := segFiles(t, out); len(now) != len(segs) {
		t.Fatalf("remove and reorder wrote rows: %v", now)
	}
	check("remove and reorder", lm, withEmo)
	if d, _ := manifests.LoadDataset(out); d.Number() != 5 {
		t.Fatalf("version %d, want 5", d.Number())
	}

	// The same line again: up to date, nothing written.
	before = clitest.Tree(t, out)
	if r := runConvert(t, env, segArgs(lm, out, withEmo, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	clitest.SameTree(t, before, clitest.Tree(t, out), "up to date")

	// Epochs cut now from a kept version (shuffle --version 2) are those
	// of a full convert of its list; a version never made is refused.
	clitest.SameTree(t, shuffleTree(t, full(l12, base), 2<<30), shuffleVersion(t, out, 64<<10, 2), "shuffle --version 2")
	if _, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: out, Version: 9, Out: filepath.Join(t.TempDir(), "e"), EpochEnd: 1,
		Sampling: manifests.Sampling{Window: 15, Mode: "tile", Short: "pad"}}); err == nil || !strings.Contains(err.Error(), "keeps versions [1 2 3 4 5]") {
		t.Fatalf("shuffle --version 9: %v", err)
	}

	// Epochs cut from version 1 still verify (plain and deep): they read
	// version 1, which is kept.
	for _, deep := range []bool{false, true} {
		rep, err := manifests.VerifyEpochs(ep1, manifests.VerifyOptions{Deep: deep})
		if err != nil || !rep.OK() {
			t.Fatalf("epochs of version 1 after version 5 (deep %v): %v %v", deep, err, rep.Problems)
		}
	}

	// Without --segments: one segment again, format 1, byte for byte a
	// full convert's.
	if r := runConvert(t, env, segArgs(lm, out, withEmo)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	sameTree(t, snapshot(t, full(lm, withEmo)), snapshot(t, out), "compacted vs full convert")
	// ... and the epochs of version 1 are now refused, naming the change.
	rep, err := manifests.VerifyEpochs(ep1, manifests.VerifyOptions{})
	if err != nil || rep.OK() || !strings.Contains(fmt.Sprint(rep.Problems), "converted again") {
		t.Fatalf("epochs of a dataset compacted under them: %v %v", err, rep.Problems)
	}
}

// TestSegmentsKilled: kill -9 at every fault point of a convert
// --segments that appends clips and adds a modality: --out holds the
// previous version (its files untouched) or the new one, readable and
// verified, and the Python Dataset and drawn epochs read it as the one it
// is (testdata/check_same_dataset.py); the re-run completes to the bytes
// of an uninterrupted run, and removes what the killed run left; nothing
// is left beside --out.
func TestSegmentsKilled(t *testing.T) {
	src := copyDemo(t)
	all := demoIDs(t, src)
	base := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy"}
	grown := append(append([]string{}, base...), "-m", "emotion=emotion/{clip}.npy")
	l8 := writeList(t, src, "l8.txt", all[:8])
	l12 := writeList(t, src, "l12.txt", all)
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	makeOld := func(t *testing.T, out string) map[string][]byte {
		if r := runConvert(t, env, segArgs(l8, out, base, "--workers", "1")...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		return clitest.Tree(t, out)
	}
	args := func(out string) []string {
		return segArgs(l12, out, grown, "--segments", "--workers", "1", "--checkpoint", "0")
	}
	ref, oldRef := filepath.Join(t.TempDir(), "ds"), filepath.Join(t.TempDir(), "old")
	makeOld(t, ref)
	makeOld(t, oldRef)
	points := faultPoints(t, func(e []string) clitest.Result { return runConvert(t, append(e, env...), args(ref)...) })
	readsAs := filepath.Join("..", "..", "testdata", "check_same_dataset.py")
	want := clitest.Tree(t, ref)
	for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(min(len(points), 6), len(points))) {
		t.Run(fmt.Sprintf("%d-%s", k, points[k-1]), func(t *testing.T) {
			parent := t.TempDir()
			out := filepath.Join(parent, "ds")
			old := makeOld(t, out)
			r := runConvert(t, append([]string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, env...), args(out)...)
			if r.Code != -1 {
				t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
			}
			now := clitest.Tree(t, out)
			for f, b := range old {
				if f != "dataset.json" && !bytes.Equal(now[f], b) {
					t.Fatalf("after the kill, %s of the previous version was changed", f)
				}
			}
			cur := string(now["dataset.json"])
			if cur != string(old["dataset.json"]) && cur != string(want["dataset.json"]) {
				t.Fatalf("after the kill dataset.json is neither the previous version nor the new one")
			}
			if _, _, err := manifests.Vouch(out); err != nil && cur != string(old["dataset.json"]) {
				t.Fatalf("after the kill, the version committed does not vouch: %v", err)
			}
			if cur == string(old["dataset.json"]) {
				numpytest.Run(t, readsAs, out, oldRef)
			} else {
				numpytest.Run(t, readsAs, out, ref)
			}
			if r := runConvert(t, env, args(out)...); r.Code != 0 {
				t.Fatalf("re-run: exit %d: %s", r.Code, r.Stderr)
			}
			clitest.SameTree(t, want, clitest.Tree(t, out), "after kill and re-run")
			if entries, _ := os.ReadDir(parent); len(entries) != 1 {
				t.Fatalf("left beside --out: %v", entries)
			}
			verifyOK(t, out)
		})
	}
}

// whisperOf8 converts the whisper of the demo's first 8 clips: the demo's
// copy, its ids, the modality's arguments and the dataset.
func whisperOf8(t *testing.T) (string, []string, []string, string) {
	t.Helper()
	src := copyDemo(t)
	all := demoIDs(t, src)
	base := []string{"-m", "whisper@2=whisper/{clip}.npy"}
	out := filepath.Join(t.TempDir(), "ds")
	if r := runConvert(t, nil, segArgs(writeList(t, src, "l8.txt", all[:8]), out, base)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return src, all, base, out
}

// TestSegmentsLeftoverNotOurs: a folder under segments/ that no version
// lists but that holds a file convert does not write (a user's) is
// named and left, never removed; with it moved away the run completes.
func TestSegmentsLeftoverNotOurs(t *testing.T) {
	src, all, base, out := whisperOf8(t)
	odd := filepath.Join(out, "segments", "0123456789abcdef")
	os.MkdirAll(filepath.Join(odd, "notes"), 0o755)
	os.WriteFile(filepath.Join(odd, "notes", "mine.txt"), []byte("mine"), 0o644)
	r := runConvert(t, nil, segArgs(writeList(t, src, "l12.txt", all), out, base, "--segments")...)
	if r.Code == 0 || !strings.Contains(r.Stderr, "notes") {
		t.Fatalf("a user's folder in a leftover segment: exit %d: %s", r.Code, r.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(odd, "notes", "mine.txt")); err != nil || string(b) != "mine" {
		t.Fatalf("the user's file was touched: %v", err)
	}
	os.RemoveAll(odd)
	if r := runConvert(t, nil, segArgs(filepath.Join(src, "l12.txt"), out, base, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	verifyOK(t, out)
}

// TestSegmentsDamagedRefused: a dataset in segments whose blob was
// damaged (a byte appended) is not silently rebuilt by convert
// --segments (which would drop the versions its epochs read): the run
// is refused, exit 1, naming the blob and the way out, and changes
// nothing.
func TestSegmentsDamagedRefused(t *testing.T) {
	src, all, base, out := whisperOf8(t)
	l12 := writeList(t, src, "l12.txt", all)
	if r := runConvert(t, nil, segArgs(l12, out, base, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	var blob string
	for f := range segFiles(t, out) {
		blob = filepath.Join(out, f)
	}
	fh, err := os.OpenFile(blob, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.Write([]byte{0})
	fh.Close()
	before := clitest.Tree(t, out)
	os.Remove(filepath.Join(src, "whisper", all[0]+".npy")) // (a change: clip000 is to be skipped)
	r := runConvert(t, nil, segArgs(l12, out, base, "--segments", "--on-error", "skip")...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "cannot be grown") || !strings.Contains(r.Stderr, filepath.Base(blob)) || !strings.Contains(r.Stderr, "without --segments") {
		t.Fatalf("a damaged dataset in segments: exit %d: %s", r.Code, r.Stderr)
	}
	clitest.SameTree(t, before, clitest.Tree(t, out), "after the refusal")
}

// TestSegmentsConcurrent: two convert --segments at once over one dataset
// (one appends clips, the other adds a modality): the second to ask is
// refused (exit 2, naming the lock) or runs after the first's commit, over
// it; never both at once. Whatever ran, each version committed is whole:
// verify --deep passes, the version number counts the runs that
// succeeded, and the Python readers read the last one as a full convert
// of its line (testdata/check_same_dataset.py).
func TestSegmentsConcurrent(t *testing.T) {
	src := copyDemo(t)
	all := demoIDs(t, src)
	base := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy"}
	emo := append(append([]string{}, base...), "-m", "emotion=emotion/{clip}.npy")
	l8 := writeList(t, src, "l8.txt", all[:8])
	l12 := writeList(t, src, "l12.txt", all)
	runs := [][]string{segArgs(l12, "", base, "--segments"), segArgs(l8, "", emo, "--segments")}
	twins := make([]string, len(runs))
	for i, a := range runs {
		twins[i] = filepath.Join(t.TempDir(), "twin")
		if r := runConvert(t, nil, withOut(a, twins[i], "--segments")...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
	}
	ok, refused := 0, 0
	for round := range clitest.Exhaustive(3, 10) {
		out := filepath.Join(t.TempDir(), "ds")
		if r := runConvert(t, nil, segArgs(l8, out, base)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		res := make([]clitest.Result, len(runs))
		done := make(chan int)
		for i, a := range runs {
			// (each fault point slowed: the runs overlap, the second to ask meets the lock)
			go func() {
				res[i] = runConvert(t, []string{"CLIPSHARD_FAULT_DELAY=15ms"}, withOut(a, out, "")...)
				done <- i
			}()
		}
		var order []int
		for range runs {
			order = append(order, <-done)
		}
		committed := 0
		last := -1
		for _, i := range order {
			switch r := res[i]; {
			case r.Code == 0:
				committed++
				last = i
			case r.Code == 2 && strings.Contains(r.Stderr, "another clipshard convert is writing"):
				refused++
			default:
				t.Fatalf("round %d, run %d: exit %d: %s", round, i, r.Code, r.Stderr)
			}
		}
		if committed == 0 {
			t.Fatalf("round %d: neither run committed: %v", round, res)
		}
		ok += committed
		d, err := manifests.LoadDataset(out)
		if err != nil || d.Number() != 1+committed {
			t.Fatalf("round %d: %d runs committed, the dataset is version %d (%v)", round, committed, d.Number(), err)
		}
		verifyOK(t, out)
		numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_same_dataset.py"), out, twins[last])
	}
	t.Logf("%d commits, %d refused in %d rounds", ok, refused, clitest.Exhaustive(3, 10))
}

// withOut is a convert's arguments a with --out dir (segArgs made them
// with an empty --out); extra, if not empty, is dropped from them (a twin
// is converted whole).
func withOut(a []string, dir, extra string) []string {
	var b []string
	for i := 0; i < len(a); i++ {
		switch {
		case a[i] == "--out":
			b = append(b, "--out", dir)
			i++
		case extra != "" && a[i] == extra:
		default:
			b = append(b, a[i])
		}
	}
	return b
}

// TestSegmentsCompact (#61): convert --compact over a dataset of three
// versions (4 clips appended, then 11 reordered and one removed: dead
// rows) commits a version whose rows are all in one new segment: one blob
// per modality holding exactly its clips' rows, in order, byte-equal clip
// by clip to a full convert, shuffled to the same shards; the earlier
// versions' files untouched, epochs cut from version 2 still verified.
// Run again: up to date, nothing written (and so is a plain --segments
// run of the same line). --keep 1 then leaves only its files, blobs the
// sizes of a full convert's. Kill -9 at spread points of the compaction:
// the previous version intact, or the new one whole; the re-run gives
// the uninterrupted bytes.
func TestSegmentsCompact(t *testing.T) {
	src := copyDemo(t)
	all := demoIDs(t, src)
	base := []string{"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy"}
	env := []string{"SOURCE_DATE_EPOCH=1700000000"}
	l8 := writeList(t, src, "l8.txt", all[:8])
	l12 := writeList(t, src, "l12.txt", all)
	var rev []string
	for i := len(all) - 1; i >= 0; i-- {
		if i != 5 {
			rev = append(rev, all[i])
		}
	}
	l11 := writeList(t, src, "l11.txt", rev)
	grow := func(t *testing.T, out string) string {
		for _, l := range []string{l8, l12, l11} {
			if r := runConvert(t, env, segArgs(l, out, base, "--segments")...); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
		}
		return out
	}
	out := grow(t, filepath.Join(t.TempDir(), "ds"))
	ep := filepath.Join(t.TempDir(), "ep")
	if _, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: out, Out: ep, EpochEnd: 1, Seed: 3, ShardSize: 8,
		Version: 2, Sampling: manifests.Sampling{Window: 5, Mode: "tile", Short: "pad"}}); err != nil {
		t.Fatal(err)
	}
	compact := segArgs(l11, out, base, "--compact")
	// The user's files in the folder (at its top, in segments/): refused,
	// naming them, nothing touched.
	must(t, os.WriteFile(filepath.Join(out, "notes.txt"), []byte("mine\n"), 0o644))
	must(t, os.MkdirAll(filepath.Join(out, "segments", "mydir"), 0o755))
	must(t, os.WriteFile(filepath.Join(out, "segments", "mydir", "f"), []byte("mine\n"), 0o644))
	before := clitest.Tree(t, out)
	if r := runConvert(t, env, compact...); r.Code != 2 || !strings.Contains(r.Stderr, "holds files that are not clipshard's: notes.txt, segments/mydir: refusing") {
		t.Fatalf("compact over the user's files: exit %d %s", r.Code, r.Stderr)
	}
	clitest.SameTree(t, before, clitest.Tree(t, out), "compact over the user's files")
	must(t, os.Remove(filepath.Join(out, "notes.txt")))
	must(t, os.RemoveAll(filepath.Join(out, "segments", "mydir")))
	before = clitest.Tree(t, out)
	r := runConvert(t, env, compact...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "copied into the new segment") || !strings.Contains(r.Stdout, "committed version 4") {
		t.Fatalf("compact: exit %d: %s %s", r.Code, r.Stdout, r.Stderr)
	}
	now := clitest.Tree(t, out)
	for f, b := range before {
		if f != "dataset.json" && !bytes.Equal(now[f], b) {
			t.Fatalf("compact: %s of an earlier version was rewritten or removed", f)
		}
	}
	d, err := manifests.LoadDataset(out)
	if err != nil || d.Number() != 4 {
		t.Fatalf("after compact: version %d, %v", d.Number(), err)
	}
	var seg string
	for _, m := range d.Modalities {
		bl := m.BlobList()
		if len(bl) != 1 || bl[0].Rows != m.Rows || !strings.HasPrefix(bl[0].File, "segments/") {
			t.Fatalf("compact: modality %s in blobs %+v, want one blob of its %d rows", m.Name, bl, m.Rows)
		}
		if seg != "" && path.Dir(bl[0].File) != seg {
			t.Fatalf("compact: blobs in %s and %s, want one segment", seg, path.Dir(bl[0].File))
		}
		seg = path.Dir(bl[0].File)
	}
	twin := filepath.Join(t.TempDir(), "full")
	if r := runConvert(t, env, segArgs(l11, twin, base)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	sameClips(t, out, twin, "compacted")
	verifyOK(t, out)
	clitest.SameTree(t, shuffleTree(t, twin, 2<<30), shuffleTree(t, out, 64<<10), "compacted: shuffled")
	if rep, err := manifests.VerifyEpochs(ep, manifests.VerifyOptions{Deep: true}); err != nil || !rep.OK() {
		t.Fatalf("epochs of version 2 after the compaction: %v %v", err, rep.Problems)
	}
	for _, again := range [][]string{compact, segArgs(l11, out, base, "--segments")} {
		before := clitest.Tree(t, out)
		if r := runConvert(t, env, again...); r.Code != 0 || !strings.HasPrefix(r.Stdout, "up to date") {
			t.Fatalf("%v again: exit %d: %s %s", again, r.Code, r.Stdout, r.Stderr)
		}
		clitest.SameTree(t, before, clitest.Tree(t, out), "compact again")
	}
	if r := runConvert(t, env, "--keep", "1", "--out", out); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	var blobs, want int64
	for f, n := range segFiles(t, out) {
		if !strings.HasPrefix(f, filepath.FromSlash(seg)+string(filepath.Separator)) {
			t.Fatalf("after --keep 1: %s left", f)
		}
		blobs += n
	}
	for _, m := range base {
		if strings.Contains(m, "=") {
			name := strings.SplitN(strings.SplitN(m, "=", 2)[0], "@", 2)[0]
			st, err := os.Stat(filepath.Join(twin, name+".npy"))
			if err != nil {
				t.Fatal(err)
			}
			want += st.Size()
		}
	}
	if blobs != want {
		t.Fatalf("after --keep 1: %d bytes of blobs, a full convert's are %d", blobs, want)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 3 {
		t.Fatalf("after --keep 1: %v, want dataset.json, segments, versions", entries)
	}
	sameClips(t, out, twin, "compacted, the rest dropped")

	// Killed at spread points of the compaction.
	ref := grow(t, filepath.Join(t.TempDir(), "ref"))
	points := faultPoints(t, func(e []string) clitest.Result {
		return runConvert(t, append(e, env...), segArgs(l11, ref, base, "--compact")...)
	})
	wantTree := clitest.Tree(t, ref)
	ks := clitest.Spread(t, len(points), clitest.Exhaustive(min(len(points), 4), len(points)))
	for k, p := range points { // (and always the commit's steps: a version over a format 2 one, moved in, not yet committed)
		if (p == "convert.segment" || p == "convert.version") && !slices.Contains(ks, k+1) {
			ks = append(ks, k+1)
		}
	}
	for _, k := range ks {
		t.Run(fmt.Sprintf("%d-%s", k, points[k-1]), func(t *testing.T) {
			out := grow(t, filepath.Join(t.TempDir(), "ds"))
			old := clitest.Tree(t, out)
			args := segArgs(l11, out, base, "--compact")
			if r := runConvert(t, append([]string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, env...), args...); r.Code != -1 {
				t.Fatalf("not killed: exit %d %s", r.Code, r.Stderr)
			}
			now := clitest.Tree(t, out)
			for f, b := range old {
				if f != "dataset.json" && !bytes.Equal(now[f], b) {
					t.Fatalf("after the kill, %s of the previous version was changed", f)
				}
			}
			if cur := string(now["dataset.json"]); cur != string(old["dataset.json"]) && cur != string(wantTree["dataset.json"]) {
				t.Fatal("after the kill dataset.json is neither the previous version nor the new one")
			}
			if points[k-1] == "convert.version" {
				// versions/4 moved in, dataset.json still version 3's: not a
				// kept version (verify names it, shuffle refuses it).
				if rep, err := manifests.VerifyDataset(out, manifests.VerifyOptions{}); err != nil || rep.OK() ||
					!strings.Contains(fmt.Sprint(rep.Problems), "versions/4/: left by a convert --segments killed before its commit") {
					t.Fatalf("verify after a kill between the version and the commit: %v %v", err, rep.Problems)
				}
				if _, err := shuffle.Run(context.Background(), shuffle.Options{Dataset: out, Out: filepath.Join(t.TempDir(), "ep"), EpochEnd: 1, ShardSize: 8,
					Version: 4, Sampling: manifests.Sampling{Window: 5, Mode: "tile", Short: "pad"}}); err == nil || !strings.Contains(err.Error(), "above the current one") {
					t.Fatalf("shuffle --version 4 of an uncommitted version: %v", err)
				}
			}
			if r := runConvert(t, env, args...); r.Code != 0 {
				t.Fatalf("re-run: exit %d: %s", r.Code, r.Stderr)
			}
			clitest.SameTree(t, wantTree, clitest.Tree(t, out), "after kill and re-run")
		})
	}
}
