package shuffle_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/convert"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// TestReaderAgainstDataset shuffles the demo set and reads every epoch
// back with Reader: the samples are the seed's, in order, and each window
// equals the dataset rows of its sample.
func TestReaderAgainstDataset(t *testing.T) {
	ds := filepath.Join(t.TempDir(), "ds")
	var mods []convert.Modality
	for _, s := range []string{"motion=motion/{clip}.pkl:exp+pose", "whisper@2=whisper/{clip}.npy"} {
		m, _ := convert.ParseModality(s)
		mods = append(mods, m)
	}
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: "../../testdata/demo/clips.txt", Out: ds, Modalities: mods}); err != nil {
		t.Fatal(err)
	}
	edir := filepath.Join(t.TempDir(), "ep")
	o := shuffle.Options{Dataset: ds, Out: edir, EpochStart: 0, EpochEnd: 2, Seed: 3, ShardSize: 4,
		Sampling: manifests.Sampling{Window: 30, Mode: "tile", Short: "pad"}}
	if _, err := shuffle.Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	d, _ := manifests.LoadDataset(ds)
	starts, _, _ := manifests.ReadIndex(filepath.Join(ds, "index.npy"))
	blobs := map[string][]byte{}
	for _, m := range d.Modalities {
		a, err := npy.ReadFile(filepath.Join(ds, m.File))
		if err != nil {
			t.Fatal(err)
		}
		blobs[m.Name] = a.Data
	}
	_, lengths, _ := manifests.ReadIndex(filepath.Join(ds, "index.npy"))
	for epoch := 0; epoch < 2; epoch++ {
		seen := 0
		all := manifests.Samples(lengths, o.Sampling, o.Seed, epoch)
		{
			r, err := shuffle.Open(edir, epoch)
			if err != nil {
				t.Fatal(err)
			}
			var wins [][]byte
			for {
				var s manifests.Sample
				s, wins, err = r.Next(wins)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if s != all[seen] {
					t.Fatalf("epoch %d sample %d is %+v, the seed says %+v", epoch, seen, s, all[seen])
				}
				seen++
				for k, m := range d.Modalities {
					row := int64(2 * m.FrameShape[0])
					first := (starts[s.Clip] + s.Start) * int64(m.Rate) * row
					want := blobs[m.Name][first : first+s.Valid*int64(m.Rate)*row]
					if !bytes.Equal(wins[k][:len(want)], want) || bytes.ContainsFunc(wins[k][len(want):], func(r rune) bool { return r != 0 }) {
						t.Fatalf("epoch %d sample %+v: %s window differs", epoch, s, m.Name)
					}
				}
			}
			r.Close()
		}
		if seen == 0 || seen != len(all) {
			t.Fatalf("epoch %d: %d samples read, the seed makes %d", epoch, seen, len(all))
		}
	}
}

// TestReaderMixed reads a mixed folder's epochs (samples files of four
// columns) with Reader: the samples in the files' order, as many as the
// epoch holds, each with its window of the dataset's rows.
func TestReaderMixed(t *testing.T) {
	ds := filepath.Join(t.TempDir(), "ds")
	m, _ := convert.ParseModality("motion=motion/{clip}.pkl:exp+pose")
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: "../../testdata/demo/clips.txt", Out: ds, Modalities: []convert.Modality{m}}); err != nil {
		t.Fatal(err)
	}
	edir := filepath.Join(t.TempDir(), "mix")
	o := shuffle.Options{Sources: []shuffle.Source{{Name: "a", Dir: ds}, {Name: "b", Dir: ds}}, Out: edir, EpochEnd: 1, Seed: 5, ShardSize: 7,
		Sampling: manifests.Sampling{Window: 10, Mode: "tile", Short: "pad"}}
	if _, err := shuffle.Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	man, err := manifests.LoadEpochs(edir)
	if err != nil {
		t.Fatal(err)
	}
	var want []manifests.Sample
	for _, sh := range man.Entry(0).Shards {
		got, srcs, err := man.ReadShardSamples(edir, sh)
		if err != nil || len(srcs) != len(got) {
			t.Fatalf("shard %d: %d sources for %d samples, %v", sh.Shard, len(srcs), len(got), err)
		}
		want = append(want, got...)
	}
	a, err := npy.ReadFile(filepath.Join(ds, "motion.npy"))
	if err != nil {
		t.Fatal(err)
	}
	starts, _, _ := manifests.ReadIndex(filepath.Join(ds, "index.npy"))
	row := int64(len(a.Data) / a.Shape[0])
	r, err := shuffle.Open(edir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wins [][]byte
	n := 0
	for ; ; n++ {
		var s manifests.Sample
		s, wins, err = r.Next(wins)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if n >= len(want) || s != want[n] {
			t.Fatalf("sample %d is %+v, the samples files say %v", n, s, want[min(n, len(want)-1)])
		}
		first := (starts[s.Clip] + s.Start) * row
		if w := a.Data[first : first+s.Valid*row]; !bytes.Equal(wins[0][:len(w)], w) {
			t.Fatalf("sample %d %+v: its window differs from the dataset's rows", n, s)
		}
	}
	if n == 0 || n != len(want) || int64(n) != man.Entry(0).Samples {
		t.Fatalf("read %d samples; the shards hold %d, epochs.json says %d", n, len(want), man.Entry(0).Samples)
	}
}

func ExampleSamples() {
	lengths := []int64{10, 3, 7} // clip lengths in frames
	s := manifests.Sampling{Window: 4, Mode: "tile", Short: "pad"}
	for _, x := range manifests.Samples(lengths, s, 42, 0) {
		fmt.Printf("clip %d frames [%d, %d) valid %d\n", x.Clip, x.Start, x.Start+4, x.Valid)
	}
	// Output:
	// clip 2 frames [0, 4) valid 4
	// clip 1 frames [0, 4) valid 3
	// clip 0 frames [3, 7) valid 4
}

// TestExternalSmallLimits: the external path, reading the dataset a few
// clips at a time with writers that keep 3 shard files open (so they close
// and reopen files between reads), writes what the in-memory path writes.
func TestExternalSmallLimits(t *testing.T) {
	ds := filepath.Join(t.TempDir(), "ds")
	var mods []convert.Modality
	for _, s := range []string{"motion=motion/{clip}.pkl:exp+pose", "whisper@2=whisper/{clip}.npy", "emotion=emotion/{clip}.npy"} {
		m, _ := convert.ParseModality(s)
		mods = append(mods, m)
	}
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: "../../testdata/demo/clips.txt", Out: ds, Modalities: mods}); err != nil {
		t.Fatal(err)
	}
	run := func(mem int64, noFsync bool) map[string][]byte {
		out := filepath.Join(t.TempDir(), "ep")
		o := shuffle.Options{Dataset: ds, Out: out, EpochStart: 0, EpochEnd: 2, Seed: 5, ShardSize: 7, Mem: mem,
			NoFsync: noFsync, Sampling: manifests.Sampling{Window: 9, Mode: "tile", Short: "pad"}}
		res, err := shuffle.Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if res.External != (mem < 1<<20) {
			t.Fatalf("--mem %d: external %v", mem, res.External)
		}
		tr := clitest.Tree(t, out)
		delete(tr, "epochs.json") // holds the time of the run
		delete(tr, "SHA256SUMS")
		return tr
	}
	want := run(1<<30, false)
	defer shuffle.SetPass1Limits(8<<10, 3)()
	clitest.SameTree(t, want, run(64<<10, false), "in-memory vs external")
	clitest.SameTree(t, want, run(64<<10, true), "in-memory vs external --no-fsync")
}
