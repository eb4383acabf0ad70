package main_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/manifests"
)

// labelCSV writes a CSV clip list of the demo's clips (the first n) with
// a speaker and an emo column: speakers from the list, one holding a comma
// and one a non-ASCII letter.
func labelCSV(t *testing.T, path string, n int, speaker func(i int) string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("clip,speaker,emo\n")
	for i := range n {
		fmt.Fprintf(&b, "clip%03d,%q,e%d\n", i, speaker(i), i%2)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

var speakers = []string{"alice", "bob", "Smith, J", "Zoë"}

func speakerOf(i int) string { return speakers[(i*7)%len(speakers)] }

func labelArgs(src, list, out string, extra ...string) []string {
	return append([]string{"--clips", list, "--root", src, "--out", out, "--quiet", "--workers", "2",
		"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy", "--label", "speaker", "--label", "mood=emo"}, extra...)
}

// codes reads a label modality's codes in clip order (format 1).
func codes(t *testing.T, ds, name string) ([]int32, []string) {
	t.Helper()
	d, err := manifests.LoadDataset(ds)
	if err != nil {
		t.Fatal(err)
	}
	m := d.Modality(name)
	if m == nil || !m.IsLabel() || len(m.Blobs) > 0 {
		t.Fatalf("%s: modality %s: %+v", ds, name, m)
	}
	b := must(os.ReadFile(filepath.Join(ds, m.File)))[m.DataOffset:]
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, m.Labels
}

// TestLabels (#64.1): convert --label NAME[=COLUMN] stores a clip list
// column as int32 codes into a vocabulary in first-seen order, recorded in
// dataset.json; an edited label is a change (not up to date; only that
// clip's label row is written again, nothing decoded), and the same list
// again is up to date; a --part/--merge run and a Parquet list (integer
// column) give the same labels.
func TestLabels(t *testing.T) {
	src := copyDemo(t)
	list := filepath.Join(src, "clips.csv")
	labelCSV(t, list, 12, speakerOf)
	ds := filepath.Join(t.TempDir(), "ds")
	r := runConvert(t, nil, labelArgs(src, list, ds)...)
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if !strings.Contains(r.Stdout, `speaker      <i4 x12 rows  labels from column "speaker": 4 labels: alice, Zoë, "Smith, J", bob`) {
		t.Errorf("summary: %s", r.Stdout)
	}
	got, voc := codes(t, ds, "speaker")
	var want []string
	for i := range 12 {
		if !slices.Contains(want, speakerOf(i)) {
			want = append(want, speakerOf(i))
		}
	}
	if !slices.Equal(voc, want) {
		t.Fatalf("vocabulary %q, want %q (first seen)", voc, want)
	}
	for i, c := range got {
		if voc[c] != speakerOf(i) {
			t.Fatalf("clip %d: code %d (%s), want %s", i, c, voc[c], speakerOf(i))
		}
	}
	if _, moods := codes(t, ds, "mood"); !slices.Equal(moods, []string{"e0", "e1"}) {
		t.Fatalf("mood labels %q", moods)
	}
	verifyOK(t, ds)

	// The same list again: up to date. An edited label: one label row.
	if r := runConvert(t, nil, labelArgs(src, list, ds)...); r.Code != 0 || !strings.HasPrefix(r.Stdout, "up to date") {
		t.Fatalf("re-run: exit %d %s", r.Code, r.Stdout)
	}
	labelCSV(t, list, 12, func(i int) string {
		if i == 3 {
			return "erin"
		}
		return speakerOf(i)
	})
	r = runConvert(t, nil, labelArgs(src, list, ds, "--json")...)
	if r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	var res struct {
		Reused  int   `json:"reused"`
		BytesIn int64 `json:"bytes_in"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatal(err, r.Stdout)
	}
	before := got
	got, voc = codes(t, ds, "speaker")
	if !slices.Equal(voc, append(want, "erin")) || voc[got[3]] != "erin" || res.Reused != 11 {
		t.Fatalf("after editing clip003's label: %q %v, %d clips reused whole: %s", voc, got, res.Reused, r.Stdout)
	}
	for i := range got {
		if i != 3 && got[i] != before[i] {
			t.Fatalf("clip %d's code changed from %d to %d: a label keeps its code", i, before[i], got[i])
		}
	}
	verifyOK(t, ds)
	// --force numbers the labels afresh, in first-seen order (bob, whose
	// first clip is now erin's, comes last).
	if r := runConvert(t, nil, labelArgs(src, list, ds, "--force")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if got, voc = codes(t, ds, "speaker"); !slices.Equal(voc, []string{"alice", "Zoë", "Smith, J", "erin", "bob"}) {
		t.Fatalf("after --force: %q", voc)
	}

	// --part 0/2, 1/2 and --merge: the labels of one run.
	parts := t.TempDir()
	var dirs []string
	for i := range 2 {
		p := filepath.Join(parts, fmt.Sprint(i))
		if r := runConvert(t, nil, labelArgs(src, list, p, "--part", fmt.Sprintf("%d/2", i))...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		dirs = append(dirs, p)
	}
	merged := filepath.Join(parts, "merged")
	if r := runConvert(t, nil, append([]string{"--merge"}, append(dirs, "--out", merged, "--quiet")...)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	mg, mv := codes(t, merged, "speaker")
	if !slices.Equal(mg, got) || !slices.Equal(mv, voc) {
		t.Fatalf("merged parts: %v %q, one run: %v %q", mg, mv, got, voc)
	}
	verifyOK(t, merged)

	// A Parquet list with an integer column: its values in decimal.
	pq := filepath.Join(src, "clips.parquet")
	ids, spk := []string{}, []int64{}
	for i := range 12 {
		ids = append(ids, fmt.Sprintf("clip%03d", i))
		spk = append(spk, int64(100+i%3))
	}
	if err := manifests.WriteTable(pq, []manifests.Column{{Name: "clip", Strings: ids}, {Name: "spk_id", Ints: spk}}); err != nil {
		t.Fatal(err)
	}
	pds := filepath.Join(t.TempDir(), "pds")
	if r := runConvert(t, nil, "--clips", pq, "--root", src, "--out", pds, "--quiet", "-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker=spk_id"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if pc, pv := codes(t, pds, "speaker"); !slices.Equal(pv, []string{"100", "101", "102"}) || pc[4] != 1 {
		t.Fatalf("parquet labels %q %v", pv, pc)
	}
	r = runConvert(t, nil, "--clips", pq, "--root", src, "--out", filepath.Join(t.TempDir(), "x"), "--quiet", "-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker=spkid")
	if r.Code != 1 || !strings.Contains(r.Stderr, `no "spkid" column for --label (it has clip, spk_id); did you mean "spk_id"?`) {
		t.Fatalf("a misspelt Parquet column: %d %s", r.Code, r.Stderr)
	}
}

// TestLabelsBadInput (#64.1): each bad --label or label column is one
// line naming the list, the row and column, and the fix; nothing is
// written.
func TestLabelsBadInput(t *testing.T) {
	src := copyDemo(t)
	csvList := func(body string) string {
		p := filepath.Join(t.TempDir(), "clips.csv")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "clip,speaker\nclip000,a\nclip001,b\n"
	cases := []struct {
		list  string
		label string
		code  int
		want  string
	}{
		{filepath.Join(src, "clips.txt"), "speaker", 2, "labels come from a column of a .csv or .parquet clip list"},
		{csvList(good), "speaker=spk", 1, `no "spk" column for --label in header ["clip" "speaker"]`},
		{csvList(good), "speaker=spaeker", 1, `no "spaeker" column for --label in header ["clip" "speaker"]; did you mean "speaker"?`},
		{csvList("clip,speaker\nclip000,a\nclip001,\n"), "speaker", 1, `row 2: column "speaker": the label is empty: every clip needs one`},
		{csvList("clip,speaker\nclip000,a\x1b[31m\nclip001,b\n"), "speaker", 1, `row 1: column "speaker": label "a\x1b[31m" holds U+001B`},
		{csvList("clip,speaker\nclip000,a\nclip001," + strings.Repeat("x", 1025) + "\n"), "speaker", 1, "holds 1025 bytes: a label is at most 1024"},
		{csvList(good), "clip", 2, "the clip column holds the ids"},
		{csvList(good), "motion=speaker", 2, `modality "motion" given twice`},
		{csvList(good), "bad/name=speaker", 2, `modality name "bad/name"`},
		{csvList(good), "speaker=", 2, "want NAME or NAME=COLUMN"},
	}
	for _, c := range cases {
		out := filepath.Join(t.TempDir(), "ds")
		r := runConvert(t, nil, "--clips", c.list, "--root", src, "--out", out, "--quiet", "-m", "motion=motion/{clip}.pkl:exp+pose", "--label", c.label)
		if r.Code != c.code || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Errorf("--label %s over %s: exit %d, want %d and %q: %q", c.label, filepath.Base(c.list), r.Code, c.code, c.want, r.Stderr)
		}
		if _, err := os.Lstat(out); err == nil {
			t.Errorf("--label %s: %s written", c.label, out)
		}
	}
	// --labels-like without --label, or naming a dataset without that label.
	plain := filepath.Join(t.TempDir(), "plain")
	if r := runConvert(t, nil, demoArgs(src, plain)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{nil, "--labels-like " + plain + " without --label"},
		{[]string{"--label", "speaker"}, `--labels-like ` + plain + `: it has no label modality "speaker"`},
	} {
		args := append([]string{"--clips", csvList(good), "--root", src, "--out", filepath.Join(t.TempDir(), "ds"), "--quiet", "-m", "motion=motion/{clip}.pkl:exp+pose", "--labels-like", plain}, c.extra...)
		if r := runConvert(t, nil, args...); r.Code != 2 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%v: exit %d %q, want %q", c.extra, r.Code, r.Stderr, c.want)
		}
	}
}

// TestLabelsKilled (#64.1): kill -9 at points spread over a run with
// labels (12; 20 with CLIPSHARD_EXHAUSTIVE=1), every clip journaled: the
// re-run resumes and gives the bytes of an uninterrupted run.
func TestLabelsKilled(t *testing.T) {
	src := copyDemo(t)
	list := filepath.Join(src, "clips.csv")
	labelCSV(t, list, 12, speakerOf)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := runConvert(t, nil, labelArgs(src, list, ref, "--checkpoint", "0")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := clitest.Tree(t, ref)
	points := faultPoints(t, func(env []string) clitest.Result {
		return runConvert(t, env, labelArgs(src, list, filepath.Join(t.TempDir(), "ds"), "--checkpoint", "0")...)
	})
	for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(12, 20)) {
		out := filepath.Join(t.TempDir(), "ds")
		if r := runConvert(t, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, labelArgs(src, list, out, "--checkpoint", "0")...); r.Code != -1 {
			t.Fatalf("point %d (%s): not killed: exit %d %s", k, points[k-1], r.Code, r.Stderr)
		}
		r := runConvert(t, nil, labelArgs(src, list, out, "--checkpoint", "0")...)
		if r.Code != 0 {
			t.Fatalf("point %d (%s): re-run: %s", k, points[k-1], r.Stderr)
		}
		clitest.SameTree(t, want, clitest.Tree(t, out), fmt.Sprintf("after a kill at %d (%s) and a re-run", k, points[k-1]))
	}
}

// pickleLabels adds to the demo's motion pickles in src a "speaker" key
// (a str, a numpy str_ for clip005) and an "spk" key (a Python int, a
// numpy int64 for odd clips), from speakerOf.
func pickleLabels(t *testing.T, src string) {
	t.Helper()
	script := `import glob, pickle, sys
import numpy as np
spk = sys.argv[2].split("|")
for i, f in enumerate(sorted(glob.glob(sys.argv[1] + "/motion/clip*.pkl"))):
    d = pickle.load(open(f, "rb"))
    d["speaker"] = np.str_(spk[i]) if i == 5 else spk[i]
    d["spk"] = np.int64(7 + i % 2) if i % 2 else 7 + i % 2
    pickle.dump(d, open(f, "wb"))
`
	var spk []string
	for i := range 12 {
		spk = append(spk, speakerOf(i))
	}
	numpytest.Run(t, "-c", script, src, strings.Join(spk, "|"))
}

func pickleLabelArgs(src, out string, extra ...string) []string {
	return append([]string{"--clips", filepath.Join(src, "clips.txt"), "--out", out, "--quiet", "--workers", "3",
		"-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker=motion/{clip}.pkl:speaker", "--label", "spk=motion/{clip}.pkl:spk"}, extra...)
}

// TestLabelsFromPickle (#64.1): --label NAME=TEMPLATE.pkl:KEY codes the
// str (a numpy str_ too) or int at KEY of each clip's pickle, in clip
// order whatever the workers' order; a changed label is a changed source
// (verify --sources names the drift; a re-run gives it a new code and
// keeps the others'); a key holding an array, --part, and a .npy
// template are refused in one line.
func TestLabelsFromPickle(t *testing.T) {
	src := copyDemo(t)
	pickleLabels(t, src)
	ds := filepath.Join(t.TempDir(), "ds")
	if r := runConvert(t, nil, pickleLabelArgs(src, ds)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got, voc := codes(t, ds, "speaker")
	if !slices.Equal(voc, []string{"alice", "Zoë", "Smith, J", "bob"}) {
		t.Fatalf("vocabulary %q", voc)
	}
	for i, c := range got {
		if voc[c] != speakerOf(i) {
			t.Fatalf("clip %d: %s, want %s", i, voc[c], speakerOf(i))
		}
	}
	if _, sv := codes(t, ds, "spk"); !slices.Equal(sv, []string{"7", "8"}) {
		t.Fatalf("int labels %q", sv)
	}
	verifyOK(t, ds)
	if r := runConvert(t, nil, pickleLabelArgs(src, ds)...); !strings.HasPrefix(r.Stdout, "up to date") {
		t.Fatalf("re-run: %s %s", r.Stdout, r.Stderr)
	}
	// clip002 now "erin": verify --sources names it; a re-run codes it 4.
	numpytest.Run(t, "-c", `import pickle, sys
f = sys.argv[1]; d = pickle.load(open(f, "rb")); d["speaker"] = "erin"; pickle.dump(d, open(f, "wb"))`, filepath.Join(src, "motion", "clip002.pkl"))
	r, err := manifests.VerifyDataset(ds, manifests.VerifyOptions{Sources: true})
	if err != nil || r.OK() || !strings.Contains(fmt.Sprint(r.Problems), `the source's label "erin" at key "speaker" differs from "Smith, J"`) {
		t.Fatalf("verify --sources after the label changed: %v %v", err, r.Problems)
	}
	if r := runConvert(t, nil, pickleLabelArgs(src, ds, "--segments")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	d, err := manifests.LoadDataset(ds)
	if err != nil {
		t.Fatal(err)
	}
	if m := d.Modality("speaker"); !slices.Equal(m.Labels, append(voc, "erin")) || m.Blobs[1].Rows != 1 {
		t.Fatalf("after the change: %+v", m)
	}
	verifyOK(t, ds)

	bad := []struct {
		args []string
		want string
	}{
		{pickleLabelArgs(src, filepath.Join(t.TempDir(), "x"), "--label", "shape2=motion/{clip}.pkl:shape"), `key "shape" holds a ndarray: a label is a str or an int`},
		{pickleLabelArgs(src, filepath.Join(t.TempDir(), "x"), "--part", "0/2"), "--part with a label from a pickle key"},
		{pickleLabelArgs(src, filepath.Join(t.TempDir(), "x"), "-m", "s2@clip=motion/{clip}.pkl:speaker"), `key "speaker" holds a str, not a numpy array; a string per clip (a speaker, a class) is a label: convert --label NAME=TEMPLATE.pkl:KEY codes it`},
		{pickleLabelArgs(src, filepath.Join(t.TempDir(), "x"), "--label", "e=emotion/{clip}.npy"), "a label from a file is a str or an int at one key of a pickle"},
		{pickleLabelArgs(src, filepath.Join(t.TempDir(), "x"), "--label", "e=motion/{clip}.pkl:exp+pose"), "a label from a file is a str or an int at one key of a pickle"},
	}
	for _, c := range bad {
		r := runConvert(t, nil, c.args...)
		if r.Code == 0 || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Errorf("%v: exit %d %q, want %q", c.args[len(c.args)-2:], r.Code, r.Stderr, c.want)
		}
	}
}

// TestLabelsFromPickleKilled (#64.1): kill -9 at points spread over a
// run coding pickle labels (12; 20 with CLIPSHARD_EXHAUSTIVE=1): the
// re-run replays the journal's labels in order and gives the bytes of an
// uninterrupted run.
func TestLabelsFromPickleKilled(t *testing.T) {
	src := copyDemo(t)
	pickleLabels(t, src)
	ref := filepath.Join(t.TempDir(), "ref")
	if r := runConvert(t, nil, pickleLabelArgs(src, ref, "--checkpoint", "0")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	want := clitest.Tree(t, ref)
	points := faultPoints(t, func(env []string) clitest.Result {
		return runConvert(t, env, pickleLabelArgs(src, filepath.Join(t.TempDir(), "ds"), "--checkpoint", "0")...)
	})
	for _, k := range clitest.Spread(t, len(points), clitest.Exhaustive(12, 20)) {
		out := filepath.Join(t.TempDir(), "ds")
		if r := runConvert(t, []string{fmt.Sprintf("CLIPSHARD_KILL_POINT=%d", k)}, pickleLabelArgs(src, out, "--checkpoint", "0")...); r.Code != -1 {
			t.Fatalf("point %d (%s): not killed: exit %d %s", k, points[k-1], r.Code, r.Stderr)
		}
		r := runConvert(t, nil, pickleLabelArgs(src, out, "--checkpoint", "0")...)
		if r.Code != 0 || strings.Contains(r.Stdout, "resumed 0") {
			t.Fatalf("point %d (%s): re-run: %s", k, points[k-1], r.Stderr)
		}
		clitest.SameTree(t, want, clitest.Tree(t, out), fmt.Sprintf("after a kill at %d (%s) and a re-run", k, points[k-1]))
	}
}

// TestClipListFIFO: a clip list that is a FIFO (text, CSV for --label,
// Parquet) is refused in one line naming it, never waited on (it hung
// until killed: SIGTERM is caught for a clean stop).
func TestClipListFIFO(t *testing.T) {
	src := copyDemo(t)
	for _, name := range []string{"clips.txt", "clips.csv", "clips.parquet"} {
		p := filepath.Join(t.TempDir(), name)
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, "--clips", p, "--root", src, "--out", filepath.Join(t.TempDir(), "ds"), "--quiet", "-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker")
		out, err := cmd.CombinedOutput()
		hung := ctx.Err()
		cancel()
		if hung != nil || err == nil || !strings.Contains(string(out), p+": not a regular file (a FIFO)") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("%s as a FIFO: %v %v %q", name, hung, err, out)
		}
	}
}

// TestLabelsLikeFromPickle: --labels-like over a dataset of pickle labels
// in --out whose vocabulary it does not begin: no label row is reused
// (their codes mean other labels there), every clip's label is right.
func TestLabelsLikeFromPickle(t *testing.T) {
	src := copyDemo(t)
	pickleLabels(t, src)
	ds := filepath.Join(t.TempDir(), "ds")
	if r := runConvert(t, nil, pickleLabelArgs(src, ds)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	like := filepath.Join(t.TempDir(), "like")
	list := filepath.Join(src, "like.csv")
	labelCSV(t, list, 12, func(i int) string { return []string{"bob", "carol", "alice", "Zoë", "x", "y"}[i%6] })
	if r := runConvert(t, nil, "--clips", list, "--root", src, "--out", like, "--quiet", "-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker", "--label", "spk=emo"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := runConvert(t, nil, pickleLabelArgs(src, ds, "--labels-like", like)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got, voc := codes(t, ds, "speaker")
	if !slices.Equal(voc[:6], []string{"bob", "carol", "alice", "Zoë", "x", "y"}) || !slices.Equal(voc[6:], []string{"Smith, J"}) {
		t.Fatalf("vocabulary %q", voc)
	}
	for i, c := range got {
		if voc[c] != speakerOf(i) {
			t.Fatalf("clip %d: %s, want %s", i, voc[c], speakerOf(i))
		}
	}
	verifyOK(t, ds)
}

// TestLabelSourceFIFO: a label's pickle (its own file, not a modality's)
// that is a FIFO, or a link to one, is refused in one line naming the
// clip and the file, never waited on; with --on-error skip the clip is
// skipped with that reason and the others keep their labels.
func TestLabelSourceFIFO(t *testing.T) {
	src := copyDemo(t)
	pickleLabels(t, src)
	must(t, os.MkdirAll(filepath.Join(src, "meta"), 0o755))
	for i := range 12 {
		b, err := os.ReadFile(filepath.Join(src, "motion", fmt.Sprintf("clip%03d.pkl", i)))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(src, "meta", fmt.Sprintf("clip%03d.pkl", i)), b, 0o644))
	}
	fifo := filepath.Join(src, "meta", "clip003.pkl")
	must(t, os.Remove(fifo))
	must(t, syscall.Mkfifo(fifo, 0o644))
	link := filepath.Join(src, "meta", "clip007.pkl")
	must(t, os.Remove(link))
	must(t, os.Symlink(fifo, link))
	run := func(extra ...string) (string, string, error, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out := filepath.Join(t.TempDir(), "ds")
		cmd := exec.CommandContext(ctx, bin, append([]string{"--clips", filepath.Join(src, "clips.txt"), "--root", src, "--out", out, "--quiet",
			"-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker=meta/{clip}.pkl:speaker"}, extra...)...)
		b, err := cmd.CombinedOutput()
		return out, string(b), err, ctx.Err()
	}
	_, got, err, hung := run()
	if hung != nil || err == nil || strings.Count(strings.TrimSpace(got), "\n") != 0 || !strings.Contains(got, `clip "clip003"`) || !strings.Contains(got, "meta/clip003.pkl: not a regular file (a FIFO)") {
		t.Fatalf("a label pickle that is a FIFO: %v %v %q", hung, err, got)
	}
	out, got, err, hung := run("--on-error", "skip")
	if hung != nil || err != nil {
		t.Fatalf("--on-error skip: %v %v %q", hung, err, got)
	}
	tsv, _ := os.ReadFile(filepath.Join(out, "skipped.tsv"))
	if !strings.Contains(string(tsv), "clip003") || !strings.Contains(string(tsv), "clip007") || !strings.Contains(string(tsv), "not a regular file (a FIFO)") {
		t.Fatalf("skipped.tsv: %s", tsv)
	}
	got2, voc := codes(t, out, "speaker")
	ids := []int{0, 1, 2, 4, 5, 6, 8, 9, 10, 11}
	if len(got2) != len(ids) {
		t.Fatalf("%d clips, want %d", len(got2), len(ids))
	}
	for i, c := range got2 {
		if voc[c] != speakerOf(ids[i]) {
			t.Fatalf("clip %d: %s, want %s", ids[i], voc[c], speakerOf(ids[i]))
		}
	}
}

// TestLabelsRace: a convert (B) that read the labels' vocabulary of the
// dataset in --out, then found it replaced by another convert (A) that
// finished meanwhile, stops before writing, saying to run it again (it
// went on with the old vocabulary, and A's new label lost its code); run
// again, it keeps A's codes and adds its own. The same when B names --out
// as its --labels-like.
func TestLabelsRace(t *testing.T) {
	for _, extra := range [][]string{nil, {"--labels-like", "OUT"}} {
		t.Run(fmt.Sprint(len(extra)), func(t *testing.T) { labelsRace(t, extra) })
	}
}

func labelsRace(t *testing.T, extraB []string) {
	src := copyDemo(t)
	ds := filepath.Join(t.TempDir(), "ds")
	for i := range extraB {
		if extraB[i] == "OUT" {
			extraB[i] = ds
		}
	}
	base, listA, listB := filepath.Join(src, "base.csv"), filepath.Join(src, "a.csv"), filepath.Join(src, "b.csv")
	labelCSV(t, base, 9, speakerOf)
	labelCSV(t, listA, 11, func(i int) string { return map[bool]string{true: "from-a", false: speakerOf(i)}[i >= 9] })
	labelCSV(t, listB, 12, func(i int) string { return map[bool]string{true: "from-b", false: speakerOf(i)}[i >= 9] })
	if r := runConvert(t, nil, labelArgs(src, base, ds)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	_, v0 := codes(t, ds, "speaker")

	// B pauses at each fault point (the first once its labels are read);
	// A runs whole while B waits there.
	log := filepath.Join(t.TempDir(), "points")
	b := exec.Command(bin, labelArgs(src, listB, ds, extraB...)...)
	b.Env = append(os.Environ(), "CLIPSHARD_FAULT_DELAY=1500ms", "CLIPSHARD_FAULT_LOG="+log)
	var stderr strings.Builder
	b.Stderr = &stderr
	must(t, b.Start())
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := os.ReadFile(log); strings.Contains(string(got), "convert.labels-read") {
			break
		}
		if time.Now().After(deadline) {
			b.Process.Kill()
			t.Fatal("B never read its labels")
		}
	}
	if r := runConvert(t, nil, labelArgs(src, listA, ds)...); r.Code != 0 {
		b.Process.Kill()
		t.Fatal(r.Stderr)
	}
	_, va := codes(t, ds, "speaker")
	err := b.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "changed after this convert read its labels (another convert finished meanwhile): run it again") {
		t.Fatalf("B after A: %v %s", err, stderr.String())
	}
	if _, vb := codes(t, ds, "speaker"); !slices.Equal(vb, va) {
		t.Fatalf("B wrote: %q, A's %q", vb, va)
	}
	if r := runConvert(t, nil, labelArgs(src, listB, ds, extraB...)...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	got, vb := codes(t, ds, "speaker")
	if !slices.Equal(vb, append(slices.Clone(va), "from-b")) || !slices.Equal(va[:len(v0)], v0) || !slices.Contains(va, "from-a") {
		t.Fatalf("vocabularies: base %q, A %q, B again %q", v0, va, vb)
	}
	for i, c := range got {
		want := speakerOf(i)
		if i >= 9 {
			want = "from-b"
		}
		if vb[c] != want {
			t.Fatalf("clip %d: %s, want %s", i, vb[c], want)
		}
	}
}
