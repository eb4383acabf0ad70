package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/internal/numpytest"
	"github.com/clipshard/clipshard/internal/s3test"
	"github.com/clipshard/clipshard/manifests"
)

// TestLabelsReachTheBatch (#64.1): labels from a CSV clip list (convert
// --label speaker --label mood=emo), the dataset grown by --segments (the
// new segment holds the new clips' label rows only), shuffled: epochs.json
// carries the vocabulary, inspect counts the clips per label (text and
// JSON), verify --deep --sources passes and names a code outside the
// vocabulary; every Python reader delivers each sample's code and maps it
// to its clip's label (testdata/check_labels.py, both numpy legs in CI);
// sources whose vocabularies differ are not mixed.
func TestLabelsReachTheBatch(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, clitest.DemoDir(), src)
	spk := []string{"alice", "bob", "Smith, J", "Zoë", "bob", "alice", "carol", "bob", "dave", "alice", "bob", "carol"}
	write := func(name string, n int) string {
		var b strings.Builder
		b.WriteString("clip,speaker,emo\n")
		for i := range n {
			fmt.Fprintf(&b, "clip%03d,%q,e%d\n", i, spk[i], i%3)
		}
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	l8, l12 := write("l8.csv", 8), write("l12.csv", 12)
	spk12 := slices.Clone(spk)
	dir := t.TempDir()
	ds, twin, ep := filepath.Join(dir, "ds"), filepath.Join(dir, "twin"), filepath.Join(dir, "ep")
	convert := func(list, out string, extra ...string) {
		t.Helper()
		if r := clip(t, append([]string{"convert", "--quiet", "--clips", list, "--root", src, "--out", out,
			"-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "whisper@2=whisper/{clip}.npy", "--label", "speaker", "--label", "mood=emo"}, extra...)...); r.Code != 0 {
			t.Fatal(r.Stderr)
		}
	}
	convert(l8, ds)
	convert(l12, ds, "--segments")
	convert(l12, twin)
	d, err := manifests.LoadDataset(ds)
	if err != nil {
		t.Fatal(err)
	}
	vocab := []string{"alice", "bob", "Smith, J", "Zoë", "carol", "dave"}
	if m := d.Modality("speaker"); m == nil || !slices.Equal(m.Labels, vocab) || len(m.Blobs) != 2 || m.Blobs[1].Rows != 4 {
		t.Fatalf("grown dataset's speaker: %+v", m)
	}
	if r := clip(t, "shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", "5", "--epochs", "1", "--shard-samples", "16"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	e, err := manifests.LoadEpochs(ep)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range e.Modalities {
		if (m.Name == "speaker") != slices.Equal(m.Labels, vocab) {
			t.Fatalf("epochs.json modality %s: labels %q", m.Name, m.Labels)
		}
	}
	for _, v := range [][]string{{"verify", "--deep", "--sources", ds}, {"verify", "--deep", ep}} {
		if r := clip(t, v...); r.Code != 0 {
			t.Fatalf("%v: exit %d %s %s", v, r.Code, r.Stdout, r.Stderr)
		}
	}
	r := clip(t, "inspect", ds)
	if !strings.Contains(r.Stdout, `speaker      <i4 label (column speaker), 12 rows`) || !strings.Contains(r.Stdout, `clips per label: 6 labels: alice 3, bob 4, "Smith, J" 1, Zoë 1, carol 2, dave 1`) {
		t.Fatalf("inspect: %s", r.Stdout)
	}
	var rep struct {
		Modalities []struct {
			Name       string   `json:"name"`
			Labels     []string `json:"labels"`
			LabelClips []int64  `json:"label_clips"`
		} `json:"modalities"`
	}
	if err := json.Unmarshal([]byte(clip(t, "inspect", "--json", ds).Stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if m := rep.Modalities[2]; m.Name != "speaker" || !slices.Equal(m.Labels, vocab) || !slices.Equal(m.LabelClips, []int64{3, 4, 1, 1, 2, 1}) {
		t.Fatalf("inspect --json: %+v", m)
	}

	// inspect of the epochs: each label's samples in the epoch, counted
	// here from the shards' clip rows and the clip list.
	want := map[string]int64{}
	for _, sh := range e.Epochs[0].Shards {
		smps, _, err := e.ReadShardSamples(ep, sh)
		if err != nil {
			t.Fatal(err)
		}
		for _, smp := range smps {
			want[spk12[smp.Clip]]++
		}
	}
	perLabel := func(out string) map[string]int64 {
		t.Helper()
		var er struct {
			Epochs []struct {
				Labels map[string][]struct {
					Label   string  `json:"label"`
					Samples int64   `json:"samples"`
					Share   float64 `json:"share"`
				} `json:"samples_per_label"`
			} `json:"epochs"`
		}
		if err := json.Unmarshal([]byte(out), &er); err != nil || len(er.Epochs) != 1 {
			t.Fatalf("inspect --json of the epochs: %v %s", err, out)
		}
		got := map[string]int64{}
		ls := er.Epochs[0].Labels["speaker"]
		for i, l := range ls {
			got[l.Label] = l.Samples
			if i > 0 && l.Samples > ls[i-1].Samples {
				t.Fatalf("samples per label not most first: %+v", ls)
			}
		}
		if len(ls) != len(vocab) || len(er.Epochs[0].Labels) != 2 {
			t.Fatalf("samples per label: %+v", er.Epochs[0].Labels)
		}
		return got
	}
	if got := perLabel(clip(t, "inspect", "--json", ep).Stdout); !maps.Equal(got, want) {
		t.Fatalf("inspect --json of the epochs: samples per speaker %v, the shards hold %v", got, want)
	}
	if r := clip(t, "inspect", ep); !strings.Contains(r.Stdout, "    samples per speaker: ") || !strings.Contains(r.Stdout, `"Smith, J" `) || !strings.Contains(r.Stdout, "    samples per mood: ") {
		t.Fatalf("inspect of the epochs: %s", r.Stdout)
	}

	// A vocabulary cut short under the codes (dataset.json edited):
	// verify names the clip and the code.
	bad := filepath.Join(dir, "bad")
	clitest.CopyTree(t, twin, bad)
	raw := string(mustRead(t, filepath.Join(bad, "dataset.json")))
	raw = strings.Replace(raw, "\"Zoë\",\n        \"carol\",\n        \"dave\"", "\"Zoë\"", 1)
	if err := os.WriteFile(filepath.Join(bad, "dataset.json"), []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := clip(t, "verify", "--deep", bad); r.Code != 1 || !strings.Contains(r.Stdout, `clip "clip006"`) || !strings.Contains(r.Stdout, `label "speaker": code 4 is outside its vocabulary of 4 labels`) {
		t.Fatalf("verify of a vocabulary cut short: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clip(t, "shuffle", "--quiet", "--dataset", bad, "--out", filepath.Join(dir, "bad-ep"), "--window", "5", "--epochs", "1"); r.Code == 0 ||
		!strings.Contains(r.Stderr, `speaker.npy: clip row 6: label "speaker" code 4 is outside its vocabulary of 4 labels`) {
		t.Fatalf("shuffle of a vocabulary cut short: exit %d %s", r.Code, r.Stderr)
	}

	// Sources whose codes mean other labels are not mixed; converted
	// with --labels-like, they are (the epochs take the longer
	// vocabulary).
	clash, other, mix := filepath.Join(dir, "clash"), filepath.Join(dir, "other"), filepath.Join(dir, "mix")
	spk[0], spk[1] = "zed", "yann"
	oList := write("o.csv", 12)
	convert(oList, clash)
	r = clip(t, "shuffle", "--quiet", "--source", "a="+twin, "--source", "b="+clash, "--out", mix, "--window", "5", "--epochs", "1")
	if r.Code != 2 || !strings.Contains(r.Stderr, "label speaker has 8 labels: zed, yann, \"Smith, J\", Zoë, bob") ||
		!strings.Contains(r.Stderr, "a code must mean one label in every source (convert "+clash+" with --labels-like "+twin) {
		t.Fatalf("mixing other vocabularies: exit %d %s", r.Code, r.Stderr)
	}
	convert(oList, other, "--labels-like", twin)
	if r := clip(t, "shuffle", "--quiet", "--source", "a="+twin, "--source", "b="+other, "--out", mix, "--window", "5", "--epochs", "1"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if e, err := manifests.LoadEpochs(mix); err != nil || !slices.Equal(e.Modalities[2].Labels, append(vocab, "zed", "yann")) {
		t.Fatalf("mixed epochs' labels: %v %+v", err, e)
	}
	if r := clip(t, "verify", "--deep", mix); r.Code != 0 {
		t.Fatalf("verify of the mixed epochs: %s %s", r.Stdout, r.Stderr)
	}
	// (every sample of the mixed epoch counted once, under the longer
	// vocabulary: zed and yann are source b's clips 0 and 1)
	if r := clip(t, "inspect", mix); r.Code != 0 || !strings.Contains(r.Stdout, "samples per speaker: ") || !strings.Contains(r.Stdout, " zed ") || !strings.Contains(r.Stdout, " yann ") {
		t.Fatalf("inspect of the mixed epochs: %s %s", r.Stdout, r.Stderr)
	}
	if r := clip(t, "convert", "--quiet", "--clips", oList, "--root", src, "--out", filepath.Join(dir, "x"), "-m", "motion=motion/{clip}.pkl:exp+pose", "--label", "speaker", "--labels-like", src); r.Code != 2 || !strings.Contains(r.Stderr, "--labels-like: ") || !strings.Contains(r.Stderr, "holds no dataset.json") {
		t.Fatalf("--labels-like a folder of sources: exit %d %s", r.Code, r.Stderr)
	}

	got := string(numpytest.Run(t, filepath.Join("..", "..", "testdata", "check_labels.py"), l12, ds, twin, ep, t.TempDir(), oList, other, mix, clash))
	if !strings.HasPrefix(got, "ok: labels of 12 clips") {
		t.Fatalf("check_labels: %s", got)
	}

	// From a bucket: the grown dataset and its epochs pushed, inspected
	// there, read by the bucket Loader (epochs, and drawn) with labels.
	s := s3test.Start(t, "bkt")
	numpytest.Module(t, "boto3", "python3-boto3")
	for _, p := range [][2]string{{ds, "s3://bkt/ds"}, {ep, "s3://bkt/ep"}} {
		if r := clitest.Run(t, bin, s.Env(), "push", p[0], p[1]); r.Code != 0 {
			t.Fatalf("push %s: %s", p[0], r.Stderr)
		}
	}
	if r := clitest.Run(t, bin, s.Env(), "inspect", "s3://bkt/ds"); r.Code != 0 || !strings.Contains(r.Stdout, `clips per label: 6 labels: alice 3, bob 4, "Smith, J" 1, Zoë 1, carol 2, dave 1`) {
		t.Fatalf("inspect of the bucket: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, bin, s.Env(), "inspect", "--json", "s3://bkt/ep"); r.Code != 0 || !maps.Equal(perLabel(r.Stdout), want) {
		t.Fatalf("inspect of the bucket's epochs: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	script := `import sys
sys.path.insert(0, sys.argv[1])
from clipshard import Loader
want, cache = sys.argv[2].split("|"), sys.argv[3]
for L in (Loader("s3://bkt/ep", batch_size=4, cache_dir=cache, cache_limit="1GiB"), Loader(dataset="s3://bkt/ds", epochs=[0], window=5, batch_size=4, cache_dir=cache, cache_limit="1GiB")):
    assert L.labels("speaker") == want, L.labels("speaker")
    n = 0
    for b in L:
        assert [want[c] for c in b["speaker"]] == [sys.argv[4 + int(c)] for c in b["samples"][:, 0]], b["samples"]
        n += len(b["speaker"])
    assert n, L
print("ok")
`
	args := append([]string{"-c", script, filepath.Join("..", "..", "python"), strings.Join(vocab, "|"), t.TempDir()}, spk12...)
	if got := string(numpytest.RunEnv(t, s.Env(), args...)); got != "ok\n" {
		t.Fatalf("the bucket's labels: %s", got)
	}
}
