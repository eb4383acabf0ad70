package push_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/internal/s3test"
	"github.com/clipshard/clipshard/manifests"
)

// bucketTree is the files of a folder of a versitygw posix bucket (its
// objects, as plain files), without the server's own (.sgwtmp, .vgw*).
func bucketTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	tr := clitest.Tree(t, dir)
	for k := range tr {
		if strings.HasPrefix(k, ".sgwtmp") || strings.HasPrefix(k, ".vgw") || strings.Contains(k, "/.sgwtmp") {
			delete(tr, k)
		}
	}
	return tr
}

// pushedTree is what a push of the folder dir leaves in the bucket: its
// files, and the BLOCKSUMS of its data files (a dataset's blobs at its
// top, an epoch's shard files in its folder) taken from the bucket's
// tree got, after checking them here: a JSON line naming each data file
// with its size and SHA256SUMS hash, then the sha256 of each block of
// each file (computed here, block by block), and of its first 4096 bytes.
func pushedTree(t *testing.T, dir string, got map[string][]byte) map[string][]byte {
	t.Helper()
	want := clitest.Tree(t, dir)
	sums, err := manifests.ReadSums(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string][]string{}
	if d, err := manifests.LoadDataset(dir); err == nil {
		for _, m := range d.Modalities {
			groups[manifests.BlockSumsFile] = append(groups[manifests.BlockSumsFile], m.File)
		}
		want[manifests.ClaimFile] = manifests.DatasetClaim(want[manifests.DatasetFile]).Marshal()
	} else {
		man, err := manifests.LoadEpochs(dir)
		if err != nil {
			t.Fatal(err)
		}
		want[manifests.ClaimFile] = manifests.EpochsClaim(man).Marshal()
		for _, e := range man.Epochs {
			for _, s := range e.Shards {
				for _, f := range s.Files {
					groups[e.Dir+"/"+manifests.BlockSumsFile] = append(groups[e.Dir+"/"+manifests.BlockSumsFile], f)
				}
			}
		}
	}
	for rel, files := range groups {
		b, ok := got[rel]
		if !ok {
			t.Fatalf("the bucket has no %s", rel)
		}
		line, digests, _ := bytes.Cut(b, []byte("\n"))
		var h struct {
			Format string `json:"format"`
			Block  int    `json:"block"`
			Files  []struct {
				Name   string `json:"name"`
				Size   int    `json:"size"`
				SHA256 string `json:"sha256"`
				Head   string `json:"head"`
			} `json:"files"`
		}
		if err := json.Unmarshal(line, &h); err != nil || h.Format != "clipshard.blocksums" || h.Block < 64<<10 {
			t.Fatalf("%s: %v %s", rel, err, line)
		}
		sort.Strings(files)
		var wantDigests []byte
		for i, f := range files {
			data := want[f]
			head := sha256.Sum256(data[:min(4096, len(data))])
			if i >= len(h.Files) || h.Files[i].Name != f || h.Files[i].Size != len(data) || h.Files[i].SHA256 != sums[f] || h.Files[i].Head != hex.EncodeToString(head[:]) {
				t.Fatalf("%s: entry %d is not %s (%d bytes, %s, head %x): %s", rel, i, f, len(data), sums[f], head, line)
			}
			for at := 0; at < len(data); at += h.Block {
				d := sha256.Sum256(data[at:min(at+h.Block, len(data))])
				wantDigests = append(wantDigests, d[:]...)
			}
		}
		if len(h.Files) != len(files) || !bytes.Equal(digests, wantDigests) {
			t.Fatalf("%s: %d files, the blocks' digests differ from the files'", rel, len(h.Files))
		}
		want[rel] = b
	}
	return want
}

// bigDataset converts a dataset whose blob is larger than a few parts of
// 5 MiB (40 clips of 1000 frames x 100 float32 features: 8 MB as float16),
// and one of other values (another dataset).
func bigDataset(t *testing.T, v float32) string {
	t.Helper()
	return synthDataset(t, "c", 40, 100, func(i int) int { return 1000 + i },
		func(i, r, c int) float32 { return v + float32((r*7+c*3+i)%1000)/64 }, false)
}

// synthDataset converts n clips (IDs prefix00, prefix01, ...) of float32
// x [frames(i), width] valued x(i, row, col), and with y a modality y
// [frames(i), 4], into a new dataset folder.
func synthDataset(t *testing.T, prefix string, n, width int, frames func(i int) int, x func(i, r, c int) float32, y bool) string {
	t.Helper()
	src := t.TempDir()
	var ids strings.Builder
	for i := range n {
		id := fmt.Sprintf("%s%02d", prefix, i)
		ids.WriteString(id + "\n")
		clitest.WriteF32(t, filepath.Join(src, "x", id+".npy"), frames(i), width, func(r, c int) float32 { return x(i, r, c) })
		if y {
			clitest.WriteF32(t, filepath.Join(src, "y", id+".npy"), frames(i), 4, func(r, c int) float32 { return float32(r%7+c) / 8 })
		}
	}
	os.WriteFile(filepath.Join(src, "clips.txt"), []byte(ids.String()), 0o644)
	ds := filepath.Join(t.TempDir(), "ds")
	args := []string{"convert", "--quiet", "--clips", filepath.Join(src, "clips.txt"), "--out", ds, "-m", "x=x/{clip}.npy"}
	if y {
		args = append(args, "-m", "y=y/{clip}.npy")
	}
	if r := clip(t, args...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return ds
}

func pushRun(t *testing.T, s *s3test.Server, extraEnv []string, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, append(s.Env(), extraEnv...), append([]string{"push", "--quiet", "--part-size", "5MiB"}, args...)...)
}

// TestPush (#34.2): a dataset and a mixed epochs folder pushed to a real
// S3 server (versitygw) are, object for object, the folders' files; a push
// again sends nothing ("up to date"); a prefix holding another dataset or
// other epochs is refused (exit 2) and --force replaces it; a folder whose
// blob does not match its SHA256SUMS is refused and nothing is committed.
func TestPush(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds := bigDataset(t, 0)
	r := pushRun(t, s, nil, ds, "s3://bkt/ds")
	if r.Code != 0 || !strings.Contains(r.Stdout, "pushed dataset") {
		t.Fatalf("push: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	got0 := bucketTree(t, filepath.Join(s.Root, "bkt", "ds"))
	clitest.SameTree(t, got0, pushedTree(t, ds, got0), "the bucket's dataset")
	if r := pushRun(t, s, nil, ds, "s3://bkt/ds"); r.Code != 0 || !strings.HasPrefix(r.Stdout, "up to date") {
		t.Fatalf("again: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	// A mixed epochs folder.
	ds2 := bigDataset(t, 1)
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--source", "a="+ds, "--source", "b="+ds2, "--weights", "a=1,b=2", "--out", ep, "--window", "7", "--epochs", "2", "--shard-samples", "512"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := pushRun(t, s, nil, ep, "s3://bkt/ep"); r.Code != 0 {
		t.Fatalf("push epochs: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	got := bucketTree(t, filepath.Join(s.Root, "bkt", "ep"))
	clitest.SameTree(t, got, pushedTree(t, ep, got), "the bucket's epochs")
	// Another dataset, other epochs: refused, then replaced with --force.
	r = pushRun(t, s, nil, ds2, "s3://bkt/ds")
	oneLine(t, r, 2, "clipshard push: ")
	if !strings.Contains(r.Stderr, "holds another dataset") {
		t.Fatal(r.Stderr)
	}
	clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", "ds")), pushedTree(t, ds, got0), "the refused push left the bucket")
	if r := pushRun(t, s, nil, "--force", ds2, "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("--force: %d %s", r.Code, r.Stderr)
	}
	got = bucketTree(t, filepath.Join(s.Root, "bkt", "ds"))
	clitest.SameTree(t, got, pushedTree(t, ds2, got), "the replaced dataset")
	other := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--source", "a="+ds, "--source", "b="+ds2, "--weights", "a=1,b=2", "--out", other, "--window", "7", "--epochs", "1", "--seed", "9", "--shard-samples", "512"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	oneLine(t, pushRun(t, s, nil, other, "s3://bkt/ep"), 2, "clipshard push: ")
	// A blob damaged after convert (its sums no longer hold): refused, the
	// object removed, no dataset.json.
	bad := filepath.Join(t.TempDir(), "ds")
	clitest.CopyTree(t, ds, bad)
	f, _ := os.OpenFile(filepath.Join(bad, "x.npy"), os.O_WRONLY, 0)
	f.WriteAt([]byte{0xff, 0xff}, 6<<20)
	f.Close()
	r = pushRun(t, s, nil, bad, "s3://bkt/bad")
	oneLine(t, r, 1, "clipshard push: ")
	if !strings.Contains(r.Stderr, "x.npy") || !strings.Contains(r.Stderr, "not those SHA256SUMS records") {
		t.Fatal(r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "bkt", "bad", "dataset.json")); err == nil {
		t.Fatal("a damaged dataset was committed")
	}
	if _, err := os.Stat(filepath.Join(s.Root, "bkt", "bad", "x.npy")); err == nil {
		t.Fatal("the damaged object was left")
	}
	// A prefix holding the user's own objects at the folder's names (put
	// there by another tool: no x-amz-meta-sha256): refused, untouched;
	// --force replaces them.
	for _, name := range []string{"x.npy", "SHA256SUMS", "epochs.json"} {
		prefix := "user-" + strings.ToLower(strings.TrimSuffix(name, filepath.Ext(name)))
		dir, src := filepath.Join(s.Root, "bkt", prefix), ds
		if name == "epochs.json" {
			src = ep
		}
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, name), []byte("the user's own"), 0o644)
		r := pushRun(t, s, nil, src, "s3://bkt/"+prefix)
		oneLine(t, r, 2, "clipshard push: ")
		if !strings.Contains(r.Stderr, "s3://bkt/"+prefix+"/"+name) || !strings.Contains(r.Stderr, "no clipshard push wrote it") {
			t.Fatalf("%s: %s", name, r.Stderr)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != "the user's own" {
			t.Fatalf("%s: the user's object was replaced", name)
		}
	}
	if r := pushRun(t, s, nil, "--force", ds, "s3://bkt/user-x"); r.Code != 0 {
		t.Fatalf("--force over the user's object: %s", r.Stderr)
	}
	oneLine(t, pushRun(t, s, nil, t.TempDir(), "s3://bkt/x"), 2, "clipshard push: ")
	oneLine(t, pushRun(t, s, nil, ds, "bkt/x"), 2, "clipshard push: ")
}

// TestPushKilled (#34.2): a push killed with SIGKILL at points spread over
// it (in the middle of a multipart object, between objects, before and
// after the manifests and the commit) and then run again leaves the
// bucket byte-identical to a clean push; before the commit no dataset.json
// or epochs.json is there. Seven points chosen and one (four in CI) drawn
// at random, in a dataset and an epochs folder.
func TestPushKilled(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds := bigDataset(t, 0)
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--source", "a="+ds, "--source", "b="+ds, "--out", ep, "--window", "5", "--epochs", "2", "--shard-samples", "1024"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, dir := range []string{ds, ep} {
		commit := manifests.DatasetFile
		if dir == ep {
			commit = manifests.EpochsFile
		}
		log := filepath.Join(t.TempDir(), "points")
		prefix := "clean-" + filepath.Base(dir)
		if r := pushRun(t, s, []string{"CLIPSHARD_FAULT_LOG=" + log}, dir, "s3://bkt/"+prefix); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		b, _ := os.ReadFile(log)
		names := strings.Split(strings.TrimSpace(string(b)), "\n")
		want := bucketTree(t, filepath.Join(s.Root, "bkt", prefix))
		clitest.SameTree(t, want, pushedTree(t, dir, want), "a clean push")
		points := []int{1, 2, len(names) / 3, len(names) / 2, len(names) - 2, len(names) - 1, len(names)}
		// (#60) and the first of each point it added: the claim, an
		// object's completion, the check before the commit.
		for _, p := range []string{"push.claim", "push.complete", "push.recheck"} {
			at := slices.Index(names, p)
			if at < 0 {
				t.Fatalf("no %s point in a clean push: %v", p, names)
			}
			points = append(points, at+1)
		}
		for range clitest.Exhaustive(1, 4) { // (points drawn at random besides)
			points = append(points, 1+rand.IntN(len(names)))
		}
		for k, at := range points {
			prefix := fmt.Sprintf("%s-%d", filepath.Base(dir), k)
			r := pushRun(t, s, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", at)}, dir, "s3://bkt/"+prefix)
			if r.Code != -1 {
				t.Fatalf("point %d (%s): not killed: %d %s", at, names[at-1], r.Code, r.Stderr)
			}
			committed := false
			if _, err := os.Stat(filepath.Join(s.Root, "bkt", prefix, commit)); err == nil {
				committed = true
			}
			if committed && !strings.Contains(strings.Join(names[:at-1], " "), "push.commit") {
				t.Fatalf("killed at point %d (%s), before the commit: %s is there", at, names[at-1], commit)
			}
			// A second kill later on, then the resume to the end.
			if at < len(names)-3 {
				pushRun(t, s, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", 3)}, dir, "s3://bkt/"+prefix)
			}
			if r := pushRun(t, s, nil, dir, "s3://bkt/"+prefix); r.Code != 0 {
				t.Fatalf("resume after point %d: %d %s", at, r.Code, r.Stderr)
			}
			clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", prefix)), want, fmt.Sprintf("resumed after a kill at point %d (%s)", at, names[at-1]))
		}
	}
}

// TestPushArrayTasks (#34.2): four array tasks, each with its own epochs
// folder holding one epoch (the same options), push at once into one
// prefix: epochs.json, by compare-and-swap, lists all four; SHA256SUMS and
// shards.parquet agree with it; the bucket folder verifies (--deep), and
// its shards are those of one shuffle --epochs 4.
func TestPushArrayTasks(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds, _ := demo(t)
	one := filepath.Join(t.TempDir(), "one")
	args := []string{"shuffle", "--quiet", "--dataset", ds, "--window", "2", "--shard-samples", "16", "--seed", "3"}
	if r := clip(t, append(args, "--out", one, "--epochs", "4")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	var dirs []string
	for e := range 4 {
		d := filepath.Join(t.TempDir(), "task")
		if r := clip(t, append(args, "--out", d, "--epoch-range", fmt.Sprintf("%d:%d", e, e+1))...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		dirs = append(dirs, d)
	}
	for round := range 2 { // the second round: into a prefix of its own, all again
		prefix := fmt.Sprintf("ep%d", round)
		var wg sync.WaitGroup
		errs := make(chan string, len(dirs))
		for _, d := range dirs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(bin, "push", "--quiet", d, "s3://bkt/"+prefix)
				cmd.Env = append(append(os.Environ(), s.Env()...), "CLIPSHARD_FAULT_DELAY=3ms")
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				cmd.SysProcAttr = &syscall.SysProcAttr{}
				if err := cmd.Run(); err != nil {
					errs <- fmt.Sprintf("%s: %v %s", d, err, stderr.String())
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatal(e)
		}
		got := filepath.Join(s.Root, "bkt", prefix)
		man, err := manifests.LoadEpochs(got)
		if err != nil {
			t.Fatal(err)
		}
		if len(man.Epochs) != 4 {
			t.Fatalf("round %d: the bucket lists %d epochs, want 4 (one lost in the compare-and-swap)", round, len(man.Epochs))
		}
		if r, err := manifests.VerifyEpochs(got, manifests.VerifyOptions{Deep: true}); err != nil || !r.OK() {
			t.Fatalf("round %d: the bucket's folder: %v %v", round, err, r.Problems)
		}
		a := bucketTree(t, got)
		b := pushedTree(t, one, a)
		for _, m := range []string{"epochs.json", "SHA256SUMS", "shards.parquet"} {
			delete(a, m)
			delete(b, m)
		}
		clitest.SameTree(t, a, b, "the array tasks' shards and one run's")
	}
}

// TestBucketVerifyInspect (#34.2): verify s3://... checks a pushed folder
// (manifests and headers by ranged reads, every object's sha256 streamed)
// and names a tampered object, a missing one and an extra one (exit 1);
// --deep is refused for a bucket (exit 2, saying what to do); inspect
// s3://... gives the figures inspect gives of the folder pushed.
func TestBucketVerifyInspect(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds, ep := demo(t)
	for _, d := range []string{ds, ep} {
		if r := pushRun(t, s, nil, d, "s3://bkt/"+filepath.Base(d)); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
	}
	run := func(args ...string) clitest.Result { return clitest.Run(t, bin, s.Env(), args...) }
	for _, d := range []string{ds, ep} {
		u := "s3://bkt/" + filepath.Base(d)
		if r := run("verify", u); r.Code != 0 || !strings.HasPrefix(r.Stdout, "ok: "+u+" intact") {
			t.Fatalf("verify %s: %d %s %s", u, r.Code, r.Stdout, r.Stderr)
		}
		local, remote := run("inspect", "--json", d), run("inspect", "--json", u)
		if local.Code != 0 || remote.Code != 0 || strings.ReplaceAll(remote.Stdout, u, d) != local.Stdout {
			t.Fatalf("inspect %s differs from inspect %s:\n%s\n%s %s", u, d, remote.Stdout, local.Stdout, remote.Stderr)
		}
	}
	oneLine(t, run("verify", "--deep", "s3://bkt/ep"), 2, "clipshard verify: ")
	// Tampered (same size), an extra object, a missing one.
	man, _ := manifests.LoadEpochs(ep)
	victim := man.Epochs[0].Shards[0].Files[man.Modalities[0].Name]
	p := filepath.Join(s.Root, "bkt", "ep", filepath.FromSlash(victim))
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0x7b}, 4100)
	f.Close()
	os.WriteFile(filepath.Join(s.Root, "bkt", "ep", "extra.npy"), []byte("x"), 0o644)
	gone := man.Epochs[1].Shards[0].Files["samples"]
	os.Remove(filepath.Join(s.Root, "bkt", "ep", filepath.FromSlash(gone)))
	r := run("verify", "s3://bkt/ep")
	if r.Code != 1 {
		t.Fatalf("a tampered bucket: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	for _, want := range []string{"s3://bkt/ep/" + victim + ": sha256 mismatch", "s3://bkt/ep/extra.npy: unexpected file", "s3://bkt/ep/" + gone + ": missing"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("verify does not say %q: %s", want, r.Stdout)
		}
	}
	oneLine(t, run("verify", "s3://bkt/nothing"), 2, "clipshard verify: ")

	// The dataset synced down (its BLOCKSUMS too) verifies; BLOCKSUMS
	// damaged, or recording other blocks, is named, locally and in the
	// bucket.
	down := t.TempDir()
	for rel, b := range bucketTree(t, filepath.Join(s.Root, "bkt", "ds")) {
		os.MkdirAll(filepath.Dir(filepath.Join(down, rel)), 0o755)
		os.WriteFile(filepath.Join(down, rel), b, 0o644)
	}
	if r := run("verify", down); r.Code != 0 {
		t.Fatalf("a dataset synced down with its BLOCKSUMS: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	sumsPath := filepath.Join(down, "BLOCKSUMS")
	good, _ := os.ReadFile(sumsPath)
	damaged := bytes.Clone(good)
	damaged[len(damaged)-1] ^= 1
	bs, err := manifests.ParseBlockSums(good, "BLOCKSUMS")
	if err != nil {
		t.Fatal(err)
	}
	bs.Files[0].Digests = bytes.Clone(bs.Files[0].Digests)
	bs.Files[0].Digests[0] ^= 1 // block 0 of the first blob: another digest
	other, _ := bs.Marshal()
	for _, c := range []struct {
		b    []byte
		want string
	}{{damaged, "BLOCKSUMS: its digests' sha256 is not the recorded"}, {other, bs.Files[0].Name + ": block 0 (bytes 0..65536): sha256 differs from BLOCKSUMS"}} {
		os.WriteFile(sumsPath, c.b, 0o644)
		if r := run("verify", down); r.Code != 1 || !strings.Contains(r.Stdout, c.want) {
			t.Fatalf("verify of a folder whose BLOCKSUMS is wrong: %d %s %s", r.Code, r.Stdout, r.Stderr)
		}
		os.WriteFile(filepath.Join(s.Root, "bkt", "ds", "BLOCKSUMS"), c.b, 0o644)
		if r := run("verify", "s3://bkt/ds"); r.Code != 1 || !strings.Contains(r.Stdout, "s3://bkt/ds/"+c.want) {
			t.Fatalf("verify of a bucket whose BLOCKSUMS is wrong: %d %s %s", r.Code, r.Stdout, r.Stderr)
		}
	}
}

// TestTrainFromBucket (#34.3): epochs pushed to versitygw, read through
// the node-local cache (testdata/check_bucket.py): the batches, their
// order and every byte equal to reading the folder, for world sizes and
// batch sizes that do not divide, the Loader, EpochDataset under 2
// DataLoader workers and torch's Loader; a resume on another world size
// and batch size goes on exactly; du of the cache, sampled during the
// reads, never above its limit; ranks sharing a cache fetch the epoch's
// bytes once (1.0x); a cache folder of the user's files is refused. Then
// examples/train_ddp.py from the bucket on 2 ranks, killed with SIGKILL
// after a checkpoint and resumed on 3 ranks with another batch size:
// every sample once (testdata/check_ddp.py).
func TestTrainFromBucket(t *testing.T) {
	s, ep := pushedEpochs(t, "2", "16") // (shards of 16 samples: half the objects of 8, each a boto3 GET of a few ms)
	env := append(s.Env(), "AWS_PROFILE=")
	// The two checks at once (each mostly waits: ranks starting, a kill,
	// a resume), each with caches of its own.
	t.Run("check_bucket", func(t *testing.T) {
		t.Parallel()
		got := numpytest.RunEnv(t, env, filepath.Join("..", "..", "testdata", "check_bucket.py"), ep, "s3://bkt/ep", filepath.Join(t.TempDir(), "caches"))
		if !strings.Contains(string(got), "ok: bucket") || (os.Getenv("CI") != "" && strings.Contains(string(got), "no torch")) {
			t.Fatalf("check_bucket: %s", got)
		}
		t.Logf("%s", got)
	})
	t.Run("train_ddp", func(t *testing.T) {
		t.Parallel()
		numpytest.Module(t, "torch", "python3-torch")
		got := numpytest.RunEnv(t, env, filepath.Join("..", "..", "testdata", "check_ddp.py"), ep, "s3://bkt/ep", filepath.Join(t.TempDir(), "ddp-cache"))
		if !strings.Contains(string(got), "ok: ddp") || !strings.Contains(string(got), "from s3://bkt/ep") {
			t.Fatalf("check_ddp from the bucket: %s", got)
		}
		t.Logf("%s", got)
	})
}

// TestBucketEgress (#34.3, egress): epochs of wide rows (8 KiB a sample,
// batches of 2 MiB a rank, shards of 300 samples) pushed, then read by 2 and 4 ranks a node each
// (a cache each) and by 4 ranks on 2 nodes (LOCAL_WORLD_SIZE=2, a cache a
// node), each cache bounded far below the epoch: every rank's batches are
// the folder's, the bytes fetched over all ranks at most 1.1x the epoch's
// (not R x: each rank fetches the blocks of its own slices), du of every
// cache never above its limit, and a resume on 3 nodes with another batch
// size reads exactly the rest (testdata/check_egress.py).
func TestBucketEgress(t *testing.T) {
	numpytest.Module(t, "boto3", "python3-boto3")
	s := s3test.Start(t, "bkt")
	ds := wideDataset(t, false)
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "8", "--sampling", "tile", "--epochs", "1", "--shard-samples", "300", "--seed", "3"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := pushRun(t, s, nil, ep, "s3://bkt/ep"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	s.Setenv(t)
	got := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_egress.py"), ep, "s3://bkt/ep", filepath.Join(t.TempDir(), "caches"), "256")
	if !strings.Contains(string(got), "ok: egress") {
		t.Fatalf("check_egress: %s", got)
	}
	t.Logf("%s", got)
}

// TestBucketFaults (#34.4): a fault-injecting proxy (loopback, bounded)
// between the readers and versitygw: 503 SlowDown, a connection reset in
// the middle of a body, a body cut short, a stalled body (each on the
// first two GETs of every shard object) are retried and deliver the right
// bytes; an object replaced between two ranged reads raises, naming it;
// none delivers wrong bytes; a fetcher killed with SIGKILL in the middle
// of an object is taken over by another reader of the same cache, whose
// bytes are right, and its temporary file is removed
// (testdata/check_faults.py).
func TestBucketFaults(t *testing.T) {
	// The three cases at once, each in a goroutine of its own (each mostly
	// waits out stalls and backoffs; t.Parallel would run two at a time
	// on 2 cores).
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, c := range []struct {
		name  string
		world string
		sums  bool
	}{{"blocks, 2 ranks (ranged)", "2", true}, {"blocks, 1 rank (whole files)", "1", true}, {"no BLOCKSUMS (whole files, SHA256SUMS)", "1", false}} {
		wg.Add(1)
		go func() { defer wg.Done(); t.Run(c.name, func(t *testing.T) { faultCase(t, c.world, c.sums) }) }()
	}
}

// faultCase is one case of TestBucketFaults: world ranks, with or without
// BLOCKSUMS.
func faultCase(t *testing.T, world string, sums bool) {
	s, ep := pushedEpochs(t, "1", "16")
	if !sums {
		// As uploaded by another tool: no BLOCKSUMS.
		os.Remove(filepath.Join(s.Root, "bkt", "ep", "epoch-0000", "BLOCKSUMS"))
	}
	env := append(s.Env(), "CLIPSHARD_S3_READ_TIMEOUT=1", // shorter than the stall
		"CLIPSHARD_S3_PIECE=8192", // several ranged GETs an object
		"CLIPSHARD_TEST_DIRECT_ENDPOINT="+s.Endpoint, "CHECK_WORLD="+world, "AWS_PROFILE=")
	args := []string{filepath.Join("..", "..", "testdata", "check_faults.py"), ep, "s3://bkt/ep", filepath.Join(t.TempDir(), "caches")}
	var proxies []*s3test.Proxy
	faults := []s3test.Fault{s3test.SlowDown, s3test.Reset, s3test.Truncate, s3test.Stall, s3test.Overwrite}
	if sums {
		faults = append(faults, s3test.OverwriteSums)
	}
	for _, f := range faults {
		times := 2 // (twice in a row an object: the retry's retry)
		if f == s3test.SlowDown || f == s3test.Stall {
			times = 1 // (botocore's adaptive rate limit and a stall take seconds each)
		}
		p := s3test.StartProxy(t, s, f, times)
		proxies = append(proxies, p)
		args = append(args, string(f)+"="+p.URL)
	}
	kill := s3test.StartProxy(t, s, s3test.Stall, 1)
	args = append(args, "kill="+kill.URL)
	got := numpytest.RunEnv(t, env, args...)
	if !strings.Contains(string(got), "ok: faults") || !strings.Contains(string(got), "a fetcher killed mid-object") {
		t.Fatalf("check_faults: %s", got)
	}
	for i, p := range proxies {
		if p.Faults == 0 {
			t.Fatalf("proxy %d (%s) injected no fault: the check proved nothing", i, faults[i])
		}
	}
	t.Logf("%s", got)
}

// pushedEpochs is a server holding, at s3://bkt/ep, epochs of the demo
// set (window 3, seed 5) cut into shards of the size given, and the
// folder pushed (s.Env() points a client at the server).
func pushedEpochs(t *testing.T, epochs, shardSamples string) (*s3test.Server, string) {
	t.Helper()
	numpytest.Module(t, "boto3", "python3-boto3")
	s := s3test.Start(t, "bkt")
	ds, _ := demo(t)
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "3", "--epochs", epochs, "--shard-samples", shardSamples, "--seed", "5"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := pushRun(t, s, nil, ep, "s3://bkt/ep"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return s, ep
}

// TestDrawnFromBucket (#38): epochs drawn at read time from a dataset
// pushed to a bucket: 2 nodes' batches byte-equal to the folder's, one
// epoch's egress over both about the dataset's bytes once (each rank
// fetches the blocks of its own stretch), a cache too small for the
// dataset refused, a resume with another batch size
// (testdata/check_drawn_bucket.py).
func TestDrawnFromBucket(t *testing.T) {
	numpytest.Module(t, "boto3", "python3-boto3")
	s := s3test.Start(t, "bkt")
	ds := wideDataset(t, true)
	if r := pushRun(t, s, nil, ds, "s3://bkt/ds"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	s.Setenv(t)
	got := numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_drawn_bucket.py"), ds, "s3://bkt/ds", filepath.Join(t.TempDir(), "caches"))
	if !strings.Contains(string(got), "ok: drawn bucket") {
		t.Fatalf("check_drawn_bucket: %s", got)
	}
	t.Logf("%s", got)
}

// wideDataset converts 20 clips of 900-1033 frames of wide rows (x:
// 512 float32 a frame; with y, also a narrow modality of 4) into a
// dataset, and returns its folder.
func wideDataset(t *testing.T, y bool) string {
	t.Helper()
	return synthDataset(t, "w", 20, 512, func(i int) int { return 900 + 7*i },
		func(i, r, c int) float32 { return float32((r*13+c*5+i)%2048) / 256 }, y)
}

// TestBenchS3Runs: bench/bench_s3.py's rows of clipshard and the floors
// (the peers' rows need their packages: bench-peers' venv) run end to end
// on the demo epoch in versitygw, each printing its figures, so that the
// script behind the "Epochs in a bucket" table cannot rot.
func TestBenchS3Runs(t *testing.T) {
	clitest.LongOnly(t, "bench_s3.sh end to end")
	s, ep := pushedEpochs(t, "1", "16")
	env := append(s.Env(), "AWS_PROFILE=", "BENCH_BATCH=32")
	script := filepath.Join("..", "..", "bench", "bench_s3.py")
	dir := t.TempDir()
	for _, c := range [][]string{
		{"floor-2", ep, "s3://bkt/ep", "-"},
		{"checked-2", ep, "s3://bkt/ep", filepath.Join(dir, "checked")},
		{"loader", ep, "s3://bkt/ep", filepath.Join(dir, "cache")},
		{"loader", ep, "s3://bkt/ep", filepath.Join(dir, "cache"), "1"},
		{"ranks-2", ep, "s3://bkt/ep", filepath.Join(dir, "rank-cache")},
		{"local", ep, "s3://bkt/ep", "-"},
		{"upload", ep, "s3://bkt/plain", "-"},
	} {
		got := numpytest.RunEnv(t, env, append([]string{script}, c...)...)
		var row map[string]any
		if err := json.Unmarshal(got, &row); err != nil || row["row"] != c[0] || !(row["MiB_per_s"].(float64) > 0) {
			t.Fatalf("bench_s3.py %v: %s (%v)", c, got, err)
		}
		if c[0] == "loader" || c[0] == "ranks-2" || c[0] == "local" {
			if n, _ := row["samples"].(float64); n <= 0 {
				t.Fatalf("bench_s3.py %v read no samples: %s", c, got)
			}
		}
	}
}

// TestBenchLinkRuns: bench/bench_link.sh (bench-s3's BENCH_LINKS leg)
// serves a bucket from a network namespace over a veth pair shaped to a
// rate: bench_s3.py's floor and cold Loader rows read the epoch through
// it, no faster than the link (so the shaping is in force), and
// link_down leaves no namespace nor interface behind. Needs root, ip and
// tc (iproute2; .ci/run installs it); without the privilege to make a
// namespace (a container without CAP_NET_ADMIN) it is skipped, saying so.
func TestBenchLinkRuns(t *testing.T) {
	clitest.LongOnly(t, "bench_link.sh end to end")
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing in CI (iproute2): .ci/run installs it", tool)
			}
			t.Skipf("no %s: the link leg needs iproute2 (apt-get install iproute2)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the link leg makes a network namespace: run as root")
	}
	s, ep := pushedEpochs(t, "1", "16")
	dir := t.TempDir()
	const rate = 4 // Mbit/s each way (0.48 MiB/s: the demo epoch's 0.47 MB in about a second; unshaped, 6 MiB/s)
	sh := `set -euo pipefail
. "$1"
trap link_down EXIT
link_up
link_rate ` + strconv.Itoa(rate) + `mbit 8kb
ROOT_ACCESS_KEY="$ACCESS" ROOT_SECRET_KEY="$SECRET" link_serve "$VGW" "$ROOT" "$DIR/vgw-link.log"
export AWS_ENDPOINT_URL="$LINK_ENDPOINT" BENCH_SERVER_PID="$LINK_PID"
echo "ns $LINK_NS $LINK_HOST"
"$PY" "$2" floor-2 "$EP" s3://bkt/ep -
"$PY" "$2" loader "$EP" s3://bkt/ep "$DIR/cache"
`
	cmd := exec.Command("bash", "-c", sh, "bash", filepath.Join("..", "..", "bench", "bench_link.sh"), filepath.Join("..", "..", "bench", "bench_s3.py"))
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_PROFILE=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, append(s.Env(), "BENCH_BATCH=32", "ACCESS="+s3test.AccessKey, "SECRET="+s3test.SecretKey,
		"VGW="+s3test.Binary(), "ROOT="+s.Root, "DIR="+dir, "EP="+ep, "PY="+numpytest.Python(t))...)
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "Operation not permitted") && os.Getenv("CI") == "" {
		t.Skipf("no privilege to make a network namespace here: %s", out)
	}
	if err != nil {
		t.Fatalf("the link leg: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var ns, host string
	rows := 0
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "ns" {
			ns, host = f[1], f[2]
			continue
		}
		var row map[string]any
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			continue
		}
		rows++
		t.Logf("%v: %.1f MiB/s through %d Mbit/s (%v bytes)", row["row"], row["MiB_per_s"], rate, row["epoch_bytes"])
		v, _ := row["MiB_per_s"].(float64)
		// (tbf's bucket of 8 KB lets a little more through at first)
		if !(v > 0) || v > 2*rate/8.0*1e6/(1<<20)+1 {
			t.Fatalf("%v through a %d Mbit/s link: %v MiB/s\n%s", row["row"], rate, v, out)
		}
	}
	if rows != 2 || ns == "" {
		t.Fatalf("the link leg printed %d rows:\n%s", rows, out)
	}
	if l, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(l), ns) {
		t.Fatalf("namespace %s left behind: %s", ns, l)
	}
	if exec.Command("ip", "link", "show", host).Run() == nil {
		t.Fatalf("interface %s left behind", host)
	}
}

// TestBucketMirrorKilled: verify s3://... killed (SIGKILL) at each object
// it mirrors or hashes leaves its mirror's folder in $TMPDIR; the next
// verify (or inspect) removes it, and an empty one (a process killed
// before it marked its folder), and says ok. A live mirror's folder (its
// lock held) and a folder of the user's of the same prefix are left as
// they are.
func TestBucketMirrorKilled(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds, _ := demo(t)
	if r := pushRun(t, s, nil, ds, "s3://bkt/ds"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	tmp := t.TempDir()
	env := append(s.Env(), "TMPDIR="+tmp)
	run := func(extra []string, args ...string) clitest.Result {
		return clitest.Run(t, bin, append(append([]string{}, env...), extra...), args...)
	}
	mine := filepath.Join(tmp, "clipshard-bucket-mine")
	os.Mkdir(mine, 0o755)
	os.WriteFile(filepath.Join(mine, "notes.txt"), []byte("the user's"), 0o644)
	left := func() []string {
		var out []string
		ents, _ := os.ReadDir(tmp)
		for _, e := range ents {
			if e.Name() != filepath.Base(mine) {
				out = append(out, e.Name())
			}
		}
		return out
	}
	log := filepath.Join(t.TempDir(), "points")
	if r := run([]string{"CLIPSHARD_FAULT_LOG=" + log}, "verify", "s3://bkt/ds"); r.Code != 0 {
		t.Fatal(r.Stdout, r.Stderr)
	}
	b, _ := os.ReadFile(log)
	names := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(names) < 8 || len(left()) != 0 {
		t.Fatalf("a verify: %d points (%v), left %v", len(names), names, left())
	}
	var live *os.File
	os.Mkdir(filepath.Join(tmp, "clipshard-bucket-empty"), 0o755)
	for at := 1; at <= len(names); at++ {
		r := run([]string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", at)}, "verify", "s3://bkt/ds")
		if r.Code != -1 {
			t.Fatalf("point %d (%s): not killed: %d %s", at, names[at-1], r.Code, r.Stderr)
		}
		killed := slices.DeleteFunc(left(), func(n string) bool { return n == "clipshard-bucket-empty" || n == "clipshard-bucket-live" })
		if len(killed) != 1 || !strings.HasPrefix(killed[0], "clipshard-bucket-") {
			t.Fatalf("killed at point %d (%s): %v in $TMPDIR", at, names[at-1], killed)
		}
		if live == nil {
			// A live mirror's folder: a copy of the one left, locked.
			p := filepath.Join(tmp, "clipshard-bucket-live")
			if err := os.CopyFS(p, os.DirFS(filepath.Join(tmp, killed[0]))); err != nil {
				t.Fatal(err)
			}
			var err error
			if live, err = os.Open(p); err != nil || syscall.Flock(int(live.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				t.Fatal(err)
			}
			defer live.Close()
		}
		args := []string{"verify", "s3://bkt/ds"}
		if at%2 == 0 {
			args = []string{"inspect", "s3://bkt/ds"}
		}
		if r := run(nil, args...); r.Code != 0 {
			t.Fatalf("%v after a kill at point %d: %d %s %s", args, at, r.Code, r.Stdout, r.Stderr)
		}
		if got := left(); len(got) != 1 || got[0] != "clipshard-bucket-live" {
			t.Fatalf("%v after a kill at point %d: %v left in $TMPDIR", args, at, got)
		}
	}
	if b, err := os.ReadFile(filepath.Join(mine, "notes.txt")); err != nil || string(b) != "the user's" {
		t.Fatalf("the user's folder: %q %v", b, err)
	}
	live.Close()
	if r := run(nil, "verify", "s3://bkt/ds"); r.Code != 0 || len(left()) != 0 {
		t.Fatalf("a verify once the live one's process is gone: %d %s; %v left", r.Code, r.Stderr, left())
	}
}

// TestBucketCredentialsNamed (#64.3): a bucket read without keys, with a
// key the server refuses, and with no server at AWS_ENDPOINT_URL fails,
// from Go (verify) and from Python (Loader, testdata/check_bucket_hint.py),
// with one line naming what to set: AWS_ACCESS_KEY_ID and AWS_PROFILE,
// or AWS_ENDPOINT_URL.
func TestBucketCredentialsNamed(t *testing.T) {
	s, _ := pushedEpochs(t, "1", "16")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	for _, c := range []struct {
		what string
		env  []string
		want []string
	}{
		{"no keys", []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY="}, []string{"no credentials were found", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"}},
		{"a refused key", []string{"AWS_SECRET_ACCESS_KEY=not-the-secret"}, []string{"refused", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"}},
		{"no server", []string{"AWS_ENDPOINT_URL=" + closed}, []string{"cannot reach", "AWS_ENDPOINT_URL", closed}},
	} {
		env := overridden(s.Env(), append([]string{"AWS_PROFILE="}, c.env...)...)
		r := clitest.Run(t, bin, env, "verify", "s3://bkt/ep")
		if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Fatalf("%s: verify: exit %d, not one line: %s", c.what, r.Code, r.Stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.Stderr, w) {
				t.Fatalf("%s: verify says %q, not %q", c.what, r.Stderr, w)
			}
		}
		got := numpytest.RunEnv(t, env, append([]string{filepath.Join("..", "..", "testdata", "check_bucket_hint.py"),
			"s3://bkt/ep", filepath.Join(t.TempDir(), "cache")}, c.want...)...)
		if !strings.HasPrefix(string(got), "ok: ") {
			t.Fatalf("%s: python: %s", c.what, got)
		}
	}
}

// overridden is env with each "K=V" of over in place of env's K (the
// last one given wins; "K=" unsets K for numpytest.RunEnv).
func overridden(env []string, over ...string) []string {
	out := []string{}
	for _, kv := range append(append([]string{}, env...), over...) {
		k, _, _ := strings.Cut(kv, "=")
		out = slices.DeleteFunc(out, func(x string) bool { return strings.HasPrefix(x, k+"=") })
		out = append(out, kv)
	}
	return out
}
