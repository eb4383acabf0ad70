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
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/convert"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// TestReaderAgainstDataset shuffles the demo set and reads every rank back
// with Reader: each window equals the dataset rows of its sample.
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
	o := shuffle.Options{Dataset: ds, Out: edir, EpochStart: 0, EpochEnd: 2, Seed: 3, WorldSize: 2, ShardSize: 4,
		Sampling: shuffle.Sampling{Window: 30, Mode: "tile", Short: "pad"}}
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
	for epoch := 0; epoch < 2; epoch++ {
		seen := 0
		for rank := 0; rank < 2; rank++ {
			r, err := shuffle.OpenRank(edir, epoch, rank)
			if err != nil {
				t.Fatal(err)
			}
			var wins [][]byte
			for {
				var s shuffle.Sample
				s, wins, err = r.Next(wins)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				seen++
				for k, m := range d.Modalities {
					row := int64(2 * m.FrameShape[0])
					first := (starts[s.Clip] + s.Start) * int64(m.Rate) * row
					want := blobs[m.Name][first : first+s.Valid*int64(m.Rate)*row]
					if !bytes.Equal(wins[k][:len(want)], want) || bytes.ContainsFunc(wins[k][len(want):], func(r rune) bool { return r != 0 }) {
						t.Fatalf("epoch %d rank %d sample %+v: %s window differs", epoch, rank, s, m.Name)
					}
				}
			}
			r.Close()
		}
		if seen == 0 {
			t.Fatalf("epoch %d: no samples", epoch)
		}
	}
}

func ExampleSamples() {
	lengths := []int64{10, 3, 7} // clip lengths in frames
	s := shuffle.Sampling{Window: 4, Mode: "tile", Short: "pad"}
	for _, x := range shuffle.Samples(lengths, s, 42, 0) {
		fmt.Printf("clip %d frames [%d, %d) valid %d\n", x.Clip, x.Start, x.Start+4, x.Valid)
	}
	// Output:
	// clip 2 frames [0, 4) valid 4
	// clip 1 frames [0, 4) valid 3
	// clip 0 frames [3, 7) valid 4
}
