package push_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/internal/s3test"
	"github.com/clipshard/clipshard/manifests"
)

// client is a bucket client of s (for the tests' own writes: another
// writer, as the user or another tool would be).
func client(t *testing.T, s *s3test.Server) *bucket.Client {
	t.Helper()
	s.Setenv(t)
	c, err := bucket.New()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cutEpochs cuts epochs of ds (window 2, shards of 16) with this seed.
func cutEpochs(t *testing.T, ds, seed, epochs string) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", d, "--window", "2", "--shard-samples", "16", "--epochs", epochs, "--seed", seed); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	return d
}

// uploadsLeft is the multipart uploads the server holds unfinished (its
// posix backend keeps each under .sgwtmp/multipart).
func uploadsLeft(t *testing.T, s *s3test.Server) []string {
	t.Helper()
	var left []string
	filepath.Walk(filepath.Join(s.Root, "bkt", ".sgwtmp", "multipart"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	return left
}

// TestPushProvesWhatItSkips (#60.1): an object at one of the folder's
// names with the recorded size and x-amz-meta-sha256 but other bytes
// (another writer kept the metadata: a server-side copy, another tool) is
// not "intact": its bytes are not proven (no BLOCKSUMS lists that
// version's ETag, and the folder's file does not make that ETag), so it
// is sent again, before the commit and after it, and the bucket ends
// byte-identical to a clean push. (Before: skipped on its metadata, and
// dataset.json committed over it; verify then failed.)
func TestPushProvesWhatItSkips(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds := bigDataset(t, 0)
	c := client(t, s)
	ctx := context.Background()
	sums, err := manifests.ReadSums(filepath.Join(ds, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	blob, _ := os.ReadFile(filepath.Join(ds, "x.npy"))
	wrong := bytes.Repeat([]byte{0x5a}, len(blob))
	plant := func(prefix string) {
		u := bucket.URL{Bucket: "bkt", Prefix: prefix}
		if _, err := c.PutBytes(ctx, u, "x.npy", wrong, sums["x.npy"], ""); err != nil {
			t.Fatal(err)
		}
	}
	if r := pushRun(t, s, nil, ds, "s3://bkt/clean"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := bucketTree(t, filepath.Join(s.Root, "bkt", "clean"))
	// Before the first push: planted into an empty prefix.
	plant("before")
	if r := pushRun(t, s, nil, ds, "s3://bkt/before"); r.Code != 0 {
		t.Fatalf("push: %d %s", r.Code, r.Stderr)
	}
	clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", "before")), want, "a push over a planted object with the recorded metadata")
	// After the commit: replaced keeping the metadata; a push again is
	// not "up to date" and sends it.
	plant("clean")
	r := pushRun(t, s, nil, ds, "s3://bkt/clean")
	if r.Code != 0 || strings.HasPrefix(r.Stdout, "up to date") {
		t.Fatalf("push again over a replaced object: %d %q %s", r.Code, r.Stdout, r.Stderr)
	}
	clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", "clean")), want, "a push again over a replaced object")
	if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/clean"); r.Code != 0 {
		t.Fatalf("verify: %s %s", r.Stdout, r.Stderr)
	}
}

// TestPushAbortsBadBytes (#60.1): a file whose bytes are not those its
// SHA256SUMS records (damaged, or changed while pushed) never becomes an
// object: its upload is aborted before it completes (none is left behind),
// the push fails naming it, nothing is committed; when the abort itself
// fails (500 on every try: the fault proxy), the push says so, and still
// no object was made; a kill -9 at the abort leaves no object either; a
// push of the mended folder then aborts the parts left and ends
// byte-identical to a clean push. (Before: the object was completed with
// the recorded sha256, then deleted, the DELETE's error ignored.)
func TestPushAbortsBadBytes(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds := bigDataset(t, 0)
	if r := pushRun(t, s, nil, ds, "s3://bkt/clean"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := bucketTree(t, filepath.Join(s.Root, "bkt", "clean"))
	bad := filepath.Join(t.TempDir(), "ds")
	clitest.CopyTree(t, ds, bad)
	f, _ := os.OpenFile(filepath.Join(bad, "x.npy"), os.O_WRONLY, 0)
	f.WriteAt([]byte{0xff, 0xff}, 6<<20)
	f.Close()
	noObject := func(prefix, what string) {
		t.Helper()
		for _, name := range []string{"x.npy", "dataset.json"} {
			if _, err := os.Stat(filepath.Join(s.Root, "bkt", prefix, name)); err == nil {
				t.Fatalf("%s: %s was made", what, name)
			}
		}
	}
	// Aborted.
	r := pushRun(t, s, nil, bad, "s3://bkt/bad")
	oneLine(t, r, 1, "clipshard push: ")
	if !strings.Contains(r.Stderr, filepath.Join(bad, "x.npy")) || !strings.Contains(r.Stderr, "not those SHA256SUMS records") || !strings.Contains(r.Stderr, "no object was made") {
		t.Fatal(r.Stderr)
	}
	noObject("bad", "a damaged file")
	if left := uploadsLeft(t, s); len(left) > 0 {
		t.Fatalf("an aborted upload left parts: %v", left)
	}
	// The abort fails (every DELETE of an upload answered 500).
	p := s3test.StartProxy(t, s, s3test.AbortFails, 0)
	r = clitest.Run(t, bin, append(s.Env(), "AWS_ENDPOINT_URL="+p.URL), "push", "--quiet", "--part-size", "5MiB", bad, "s3://bkt/bad")
	oneLine(t, r, 1, "clipshard push: ")
	if p.Faults == 0 || !strings.Contains(r.Stderr, "aborting its multipart upload failed too") || !strings.Contains(r.Stderr, "not those SHA256SUMS records") {
		t.Fatalf("%d faults: %s", p.Faults, r.Stderr)
	}
	noObject("bad", "a failed abort")
	if len(uploadsLeft(t, s)) == 0 {
		t.Fatal("the failed abort left no parts: the proxy proved nothing")
	}
	// Killed at the abort.
	log := filepath.Join(t.TempDir(), "points")
	pushRun(t, s, []string{"CLIPSHARD_FAULT_LOG=" + log}, bad, "s3://bkt/probe")
	b, _ := os.ReadFile(log)
	at := 0
	for i, n := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if n == "push.abort" {
			at = i + 1
		}
	}
	if at == 0 {
		t.Fatalf("no push.abort point: %s", b)
	}
	if r := pushRun(t, s, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", at)}, bad, "s3://bkt/bad"); r.Code != -1 {
		t.Fatalf("not killed at the abort: %d %s", r.Code, r.Stderr)
	}
	noObject("bad", "a kill at the abort")
	// Mended: the parts left are aborted, the bucket is a clean push's.
	if r := pushRun(t, s, nil, ds, "s3://bkt/bad"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", "bad")), want, "the mended folder's push")
	if left := uploadsLeft(t, s); len(left) > 0 {
		t.Fatalf("parts left after the mended push: %v", left)
	}
}

// TestPushesCollide (#60.2): two pushes at once into one empty prefix, of
// epochs cut with other options (seed 3 and 9) and of two different
// datasets: the one that claims the prefix first pushes and commits, the
// other is refused (exit 2) before it writes anything; the committed
// prefix verifies and is, object for object, the winner's folder. Rounds
// of each (more with CLIPSHARD_EXHAUSTIVE), the points slowed so that the
// two overlap. (Before: the loser was refused only at its commit, after
// overwriting the winner's objects: 10 of 10 prefixes failed verify.)
func TestPushesCollide(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds, _ := demo(t)
	ds2 := bigDataset(t, 1)
	pairs := [][2]string{{cutEpochs(t, ds, "3", "2"), cutEpochs(t, ds, "9", "2")}, {ds, ds2}}
	rounds := clitest.Exhaustive(2, 5)
	for k, pair := range pairs {
		for round := range rounds {
			prefix := fmt.Sprintf("c%d-%d", k, round)
			codes := make([]int, 2)
			outs := make([]string, 2)
			var wg sync.WaitGroup
			for i, d := range pair {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cmd := exec.Command(bin, "push", "--quiet", "--part-size", "5MiB", d, "s3://bkt/"+prefix)
					cmd.Env = append(append(os.Environ(), s.Env()...), "CLIPSHARD_FAULT_DELAY=2ms")
					var stderr bytes.Buffer
					cmd.Stderr = &stderr
					err := cmd.Run()
					codes[i], outs[i] = cmd.ProcessState.ExitCode(), stderr.String()
					if err != nil && cmd.ProcessState == nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			won := -1
			for i := range 2 {
				switch codes[i] {
				case 0:
					if won >= 0 {
						t.Fatalf("%s: both pushes of different content succeeded", prefix)
					}
					won = i
				case 2:
					t.Logf("%s: push %d refused: %s", prefix, i, strings.TrimSpace(outs[i])[:min(120, len(strings.TrimSpace(outs[i])))])
					// (the claim's refusal; or, when the winner's objects were
					// already there as the loser listed the prefix, its survey's,
					// which also comes before any write)
					if !strings.Contains(outs[i], "claimed by") && !strings.Contains(outs[i], "holds another dataset") && !strings.Contains(outs[i], "other options") &&
						!strings.Contains(outs[i], "left by a push of another") {
						t.Fatalf("%s: the loser's refusal: %s", prefix, outs[i])
					}
				default:
					t.Fatalf("%s: push %d: exit %d: %s", prefix, i, codes[i], outs[i])
				}
			}
			if won < 0 {
				t.Fatalf("%s: neither push succeeded: %v", prefix, outs)
			}
			if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/"+prefix); r.Code != 0 {
				t.Fatalf("%s: the winner's prefix does not verify: %s %s", prefix, r.Stdout, r.Stderr)
			}
			got := bucketTree(t, filepath.Join(s.Root, "bkt", prefix))
			clitest.SameTree(t, got, pushedTree(t, pair[won], got), prefix+": the winner's folder")
		}
	}
}

// TestPushForeignObjects (#60.7): a prefix holding an object at a name no
// push of the folder writes is refused by push (exit 2, naming it,
// nothing written) exactly when verify refuses it: the user's own object
// (no x-amz-meta-sha256) always, even with --force (push never removes
// what it did not write); an object another push left (a dataset's blob
// of a modality the new one lacks) unless --force, which removes it. A
// prefix claimed by a push of other content that did not commit is
// refused (exit 2) unless --force; verify names the claim.
func TestPushForeignObjects(t *testing.T) {
	s := s3test.Start(t, "bkt")
	c := client(t, s)
	ctx := context.Background()
	ds, _ := demo(t)
	ds2 := bigDataset(t, 0)
	run := func(args ...string) clitest.Result { return clitest.Run(t, bin, s.Env(), args...) }
	if r := pushRun(t, s, nil, ds, "s3://bkt/ds"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := bucketTree(t, filepath.Join(s.Root, "bkt", "ds"))
	u := bucket.URL{Bucket: "bkt", Prefix: "ds"}
	if _, err := c.PutBytes(ctx, u, "notes.txt", []byte("the user's own notes\n"), "", ""); err != nil {
		t.Fatal(err)
	}
	r := run("verify", "s3://bkt/ds")
	if r.Code != 1 || !strings.Contains(r.Stdout, "notes.txt") {
		t.Fatalf("verify of a prefix with the user's object: %d %s", r.Code, r.Stdout)
	}
	for _, force := range []bool{false, true} {
		args := []string{"push", "--quiet", ds, "s3://bkt/ds"}
		if force {
			args = []string{"push", "--quiet", "--force", ds, "s3://bkt/ds"}
		}
		r = run(args...)
		oneLine(t, r, 2, "clipshard push: ")
		if !strings.Contains(r.Stderr, "s3://bkt/ds/notes.txt") || !strings.Contains(r.Stderr, "no clipshard push wrote") {
			t.Fatalf("push --force=%v: %s", force, r.Stderr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(s.Root, "bkt", "ds", "notes.txt")); string(b) != "the user's own notes\n" {
		t.Fatal("the user's object was changed")
	}
	c.Remove(ctx, u, "notes.txt")
	clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", "ds")), want, "the refused pushes left the prefix")
	// Another dataset over it with --force: the old one's objects that the
	// new one lacks are removed; verify then passes.
	if r := run("push", "--quiet", "--part-size", "5MiB", "--force", ds2, "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("--force: %s", r.Stderr)
	}
	got := bucketTree(t, filepath.Join(s.Root, "bkt", "ds"))
	clitest.SameTree(t, got, pushedTree(t, ds2, got), "another dataset pushed over one with more files")
	if r := run("verify", "s3://bkt/ds"); r.Code != 0 {
		t.Fatalf("verify after --force: %s", r.Stdout)
	}
	// Left by a push of another dataset (put back as that push wrote it):
	// refused without --force, as verify refuses it.
	old := want["whisper.npy"]
	if _, err := c.PutBytes(ctx, u, "whisper.npy", old, hashHex(old), ""); err != nil {
		t.Fatal(err)
	}
	if r := run("verify", "s3://bkt/ds"); r.Code != 1 || !strings.Contains(r.Stdout, "whisper.npy") {
		t.Fatalf("verify of a prefix with another push's object: %d %s", r.Code, r.Stdout)
	}
	r = run("push", "--quiet", "--part-size", "5MiB", ds2, "s3://bkt/ds")
	oneLine(t, r, 2, "clipshard push: ")
	if !strings.Contains(r.Stderr, "s3://bkt/ds/whisper.npy") || !strings.Contains(r.Stderr, "--force removes") {
		t.Fatal(r.Stderr)
	}
	c.Remove(ctx, u, "whisper.npy")
	// A claim of other content, not committed (a push killed after its
	// claim): push refused, verify names it; --force takes the prefix.
	other := bucket.URL{Bucket: "bkt", Prefix: "claimed"}
	if r := pushRun(t, s, nil, ds, "s3://bkt/claimed"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	body := manifests.DatasetClaim([]byte("another dataset.json")).Marshal()
	if _, err := c.PutBytes(ctx, other, manifests.ClaimFile, body, hashHex(body), ""); err != nil {
		t.Fatal(err)
	}
	r = run("verify", "s3://bkt/claimed")
	if r.Code != 1 || !strings.Contains(r.Stdout, "CLAIM") || !strings.Contains(r.Stdout, "has not committed") {
		t.Fatalf("verify of a prefix claimed for other content: %d %s", r.Code, r.Stdout)
	}
	r = run("push", "--quiet", ds, "s3://bkt/claimed")
	oneLine(t, r, 2, "clipshard push: ")
	if !strings.Contains(r.Stderr, "is claimed by a push of a dataset") || !strings.Contains(r.Stderr, "--force") {
		t.Fatal(r.Stderr)
	}
	if r := run("push", "--quiet", "--force", ds, "s3://bkt/claimed"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", "claimed")), want, "--force over another content's claim")
	// --force removes another push's objects only if their heads still
	// say a push wrote them: epochs 0 and 1 committed, the claim then
	// taken by other content, one of epoch 1's shard files replaced by the
	// user's own; a forced push of epoch 0 alone refuses to remove it,
	// naming it, and leaves it as it is.
	two := cutEpochs(t, ds, "3", "2")
	if r := pushRun(t, s, nil, two, "s3://bkt/ep-claimed"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	one := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", one, "--window", "2", "--shard-samples", "16", "--epoch-range", "0:1", "--seed", "3"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	eu := bucket.URL{Bucket: "bkt", Prefix: "ep-claimed"}
	if _, err := c.PutBytes(ctx, eu, manifests.ClaimFile, body, hashHex(body), ""); err != nil {
		t.Fatal(err)
	}
	users := "epoch-0001/shard-00000.samples.npy"
	if _, err := c.PutBytes(ctx, eu, users, []byte("the user's own"), "", ""); err != nil {
		t.Fatal(err)
	}
	r = run("push", "--quiet", "--force", one, "s3://bkt/ep-claimed")
	oneLine(t, r, 2, "clipshard push: ")
	if !strings.Contains(r.Stderr, "s3://bkt/ep-claimed/"+users) || !strings.Contains(r.Stderr, "not removed") {
		t.Fatal(r.Stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(s.Root, "bkt", "ep-claimed", filepath.FromSlash(users))); string(b) != "the user's own" {
		t.Fatal("the user's object was removed or changed")
	}
}

func hashHex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestPushForceKilled (#60): push --force of other content over a
// committed prefix (a dataset over a dataset with more files, epochs of
// seed 9 over seed 3's), killed with SIGKILL at each point it adds (the
// claim taken, the old manifest removed, each removal of the old
// objects), then run again: the prefix ends byte-identical to a push into
// an empty one, and verifies.
func TestPushForceKilled(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds, _ := demo(t)
	ds2 := bigDataset(t, 0)
	// (the old epochs one more than the new: its third is removed)
	for j, pair := range [][2]string{{ds, ds2}, {cutEpochs(t, ds, "3", "3"), cutEpochs(t, ds, "9", "2")}} {
		old, replacement := pair[0], pair[1]
		clean := fmt.Sprintf("clean%d", j)
		if r := pushRun(t, s, nil, replacement, "s3://bkt/"+clean); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		want := bucketTree(t, filepath.Join(s.Root, "bkt", clean))
		setup := func(prefix string) {
			if r := pushRun(t, s, nil, old, "s3://bkt/"+prefix); r.Code != 0 {
				t.Fatal(r.Stderr)
			}
		}
		probe := fmt.Sprintf("probe%d", j)
		setup(probe)
		log := filepath.Join(t.TempDir(), "points")
		if r := pushRun(t, s, []string{"CLIPSHARD_FAULT_LOG=" + log}, "--force", replacement, "s3://bkt/"+probe); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		b, _ := os.ReadFile(log)
		names := strings.Split(strings.TrimSpace(string(b)), "\n")
		// The claim taken, the manifest removed, the first, a middle and
		// the last removal of the old objects (3 of them, spread, outside
		// CLIPSHARD_EXHAUSTIVE).
		var points, removals []int
		for i, n := range names {
			switch n {
			case "push.claim", "push.uncommit":
				points = append(points, i+1)
			case "push.stale":
				removals = append(removals, i+1)
			}
		}
		if len(points) < 2 || len(removals) < 2 {
			t.Fatalf("the forced push reached %v", names)
		}
		points = append(points, removals[0], removals[len(removals)/2], removals[len(removals)-1])
		for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(3, len(points))) {
			at := points[k-1] // (Spread counts from 1)
			prefix := fmt.Sprintf("f%d-%d", j, k)
			setup(prefix)
			if r := pushRun(t, s, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", at)}, "--force", replacement, "s3://bkt/"+prefix); r.Code != -1 {
				t.Fatalf("point %d (%s): not killed: %d %s", at, names[at-1], r.Code, r.Stderr)
			}
			if r := pushRun(t, s, nil, "--force", replacement, "s3://bkt/"+prefix); r.Code != 0 {
				t.Fatalf("resume after point %d (%s): %s", at, names[at-1], r.Stderr)
			}
			clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", prefix)), want, fmt.Sprintf("resumed after a kill at point %d (%s)", at, names[at-1]))
			if r := clitest.Run(t, bin, s.Env(), "verify", "s3://bkt/"+prefix); r.Code != 0 {
				t.Fatalf("after point %d: verify: %s", at, r.Stdout)
			}
		}
	}
}

// TestCacheHostile (#60.3, .4, .6): the readers' node-local cache against
// a hostile folder (testdata/check_cache_hostile.py): a symlinked entry or
// epoch folder (the user's files behind it untouched), a FIFO at each file
// the cache opens, a regular file as cache_dir, bad cache_limits, and (in
// a mount namespace of its own: tmpfs mounts, gone with it) a read-only
// and a full cache disk: each refused with one ValueError naming it, no
// hang. The mounts need root (CI has it: there the test fails without).
func TestCacheHostile(t *testing.T) {
	s, _ := pushedEpochs(t, "1", "16")
	work := t.TempDir()
	py := numpytest.Python(t)
	script := filepath.Join("..", "..", "testdata", "check_cache_hostile.py")
	args := []string{script, "s3://bkt/ep", work}
	cmd := exec.Command(py, args...)
	if _, err := exec.LookPath("unshare"); err == nil && os.Geteuid() == 0 {
		ro, full := filepath.Join(t.TempDir(), "ro"), filepath.Join(t.TempDir(), "full")
		os.Mkdir(ro, 0o755)
		os.Mkdir(full, 0o755)
		cmd = exec.Command("unshare", append([]string{"-m", "--propagation", "private", "--", "sh", "-c",
			`mount -t tmpfs -o ro,size=64k tmpfs "$1" && mount -t tmpfs -o size=48k tmpfs "$2" && shift 2 && exec "$@"`, "sh", ro, full, py},
			append(args, ro, full)...)...)
	} else if os.Getenv("CI") != "" {
		t.Fatal("the read-only and full cache cases need root and unshare (mount namespaces): CI runs them")
	} else {
		t.Log("not root, or no unshare: the read-only and full cache disks are not tried (CI tries them)")
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, s.Env()...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok: cache_hostile") {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestPushUnderFaults (#60.1): the checked upload against a flaky server
// (the fault proxy in front of versitygw): each part and each object of
// one PUT of a dataset's blobs and of an epochs folder's shard files
// answered 503 SlowDown twice, or cut off half-way through its body
// (the connection dropped) twice, is sent again; the push succeeds and the
// bucket is byte-identical to a clean push's.
func TestPushUnderFaults(t *testing.T) {
	s := s3test.Start(t, "bkt")
	ds := bigDataset(t, 0)
	ep := filepath.Join(t.TempDir(), "ep")
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "1", "--shard-samples", "4096"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, dir := range []string{ds, ep} {
		clean := "clean-" + filepath.Base(dir)
		if r := pushRun(t, s, nil, dir, "s3://bkt/"+clean); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		want := bucketTree(t, filepath.Join(s.Root, "bkt", clean))
		for _, f := range []s3test.Fault{s3test.PutSlowDown, s3test.PutReset} {
			p := s3test.StartProxy(t, s, f, 2)
			prefix := fmt.Sprintf("%s-%s", filepath.Base(dir), f)
			r := clitest.Run(t, bin, append(s.Env(), "AWS_ENDPOINT_URL="+p.URL), "push", "--quiet", "--part-size", "5MiB", dir, "s3://bkt/"+prefix)
			if r.Code != 0 {
				t.Fatalf("%s under %s: %d %s", dir, f, r.Code, r.Stderr)
			}
			if p.Faults == 0 {
				t.Fatalf("%s: the proxy injected no fault: the case proved nothing", f)
			}
			clitest.SameTree(t, bucketTree(t, filepath.Join(s.Root, "bkt", prefix)), want, fmt.Sprintf("%s pushed under %s (%d faults)", dir, f, p.Faults))
		}
	}
}
