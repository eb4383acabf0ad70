package manifests_test

import (
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

func writeTemp(t *testing.T, name string, data []byte) string {
	dir := t.TempDir()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// FuzzLoadDataset: any dataset.json either loads with every path inside the
// directory, or fails; never a panic.
func FuzzLoadDataset(f *testing.F) {
	f.Add([]byte(`{"format":"clipshard.dataset","version":1,"files":{"clips":"clips.parquet","index":"index.npy","sha256sums":"SHA256SUMS"},"modalities":[{"name":"m","file":"m.npy"}]}`))
	f.Add([]byte(`{"format":"clipshard.dataset","version":1,"modalities":[{"name":"m","file":"../m.npy"}]}`))
	f.Add([]byte(`{"format":"clipshard.dataset","version":2,"dataset_version":2,"files":{"clips":"versions/2/clips.parquet","index":"versions/2/index.npy","where":"versions/2/where.npy","sha256sums":"versions/2/SHA256SUMS"},"modalities":[{"name":"m","blobs":[{"file":"m.npy","rows":3},{"file":"segments/0123456789abcdef/m.npy","rows":2}]}]}`))
	f.Add([]byte(`{"format":"clipshard.dataset","version":2,"dataset_version":2,"files":{"where":"w.npy"},"modalities":[{"name":"m","blobs":[{"file":"/etc/m.npy"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := manifests.LoadDataset(writeTemp(t, "dataset.json", data))
		if err != nil {
			return
		}
		for _, f := range append(d.BlobFiles(), d.Files.Where) {
			if (f != "" || d.Segmented()) && manifests.CheckRelPath(f) != nil {
				t.Fatalf("accepted %q", f)
			}
		}
		if d.Segmented() != (d.Files.Where != "") {
			t.Fatalf("format %d with where %q", d.Version, d.Files.Where)
		}
	})
}

// FuzzReadWhere: any where.npy of a dataset of format 2 (2 clips, 2
// modalities of 2 and 1 blobs) is read, with every clip's rows inside the
// blob it names, or refused; never a panic.
func FuzzReadWhere(f *testing.F) {
	d := &manifests.Dataset{Format: manifests.DatasetFormat, Version: 2, DatasetVersion: 2, Clips: 2, Frames: 5, Modalities: []manifests.Modality{
		{Name: "a", Rate: 2, Blobs: []manifests.Blob{{File: "a.npy", Rows: 6}, {File: "s/a.npy", Rows: 4}}},
		{Name: "c", PerClip: true, Blobs: []manifests.Blob{{File: "c.npy", Rows: 2}}},
	}}
	starts, lengths := []int64{0, 3}, []int64{3, 2}
	ok := manifests.NewWhere(2, 2)
	ok.Set(0, 0, 0, 0)
	ok.Set(1, 0, 1, 0)
	ok.Set(1, 1, 0, 1)
	dir := f.TempDir()
	if err := manifests.WriteWhere(filepath.Join(dir, "w.npy"), ok); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "w.npy"))
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := manifests.ReadWhere(filepath.Join(writeTemp(t, "w.npy", data), "w.npy"), d, starts, lengths)
		if err != nil {
			return
		}
		for i := range 2 {
			for k := range 2 {
				blob, first, n := d.Locate(w, k, i, starts[i], lengths[i])
				bl := d.Modalities[k].BlobList()
				if blob < 0 || blob >= len(bl) || first < 0 || first+n > bl[blob].Rows {
					t.Fatalf("clip %d modality %d: blob %d rows %d..%d accepted", i, k, blob, first, first+n)
				}
			}
		}
	})
}

// FuzzReadClips: any clips.parquet is read or refused; never a panic.
func FuzzReadClips(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "c.parquet")
	if err := manifests.WriteClips(p, []string{"m"}, sampleRows()); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		manifests.ReadClips(filepath.Join(writeTemp(t, "c.parquet", data), "c.parquet"), []string{"m"})
		manifests.ReadClipList(filepath.Join(writeTemp(t, "c.parquet", data), "c.parquet"))
		manifests.ReadClipLabels(filepath.Join(writeTemp(t, "c.parquet", data), "c.parquet"), []string{"clip", "m_source"})
	})
}

// FuzzReadSums: any SHA256SUMS is read (names inside the directory) or
// refused; never a panic.
func FuzzReadSums(f *testing.F) {
	f.Add([]byte("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a.npy\n"))
	f.Add([]byte("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  ../a.npy\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sums, err := manifests.ReadSums(filepath.Join(writeTemp(t, "SHA256SUMS", data), "SHA256SUMS"))
		if err != nil {
			return
		}
		for name := range sums {
			if manifests.CheckRelPath(name) != nil {
				t.Fatalf("accepted %q", name)
			}
		}
	})
}

// FuzzLoadEpochs: any epochs.json (version 2 or 3) either loads, with
// every path inside the directory and, for version 3, named sources whose
// counts add up to each epoch's samples, or fails; never a panic. A
// loaded one's mixed epochs can be checked (verify's checks) without one.
func FuzzLoadEpochs(f *testing.F) {
	f.Add([]byte(`{"format":"clipshard.epochs","version":2,"dataset":{"dir":"/d"},"files":{"shards":"shards.parquet","sha256sums":"SHA256SUMS"},"epochs":[{"epoch":0,"dir":"epoch-0000","samples":1,"shards":[{"shard":0,"first":0,"samples":1,"files":{"samples":"epoch-0000/s.npy"}}]}]}`))
	f.Add([]byte(`{"format":"clipshard.epochs","version":3,"sources":[{"name":"a","dir":"/a","clips":2},{"name":"b","dir":"/b","clips":1}],"mix":{"epoch_samples":3,"weights":[{"from":0,"weights":{"a":1,"b":2}}]},"files":{"shards":"shards.parquet","sha256sums":"SHA256SUMS"},"epochs":[{"epoch":0,"dir":"epoch-0000","samples":3,"weights":{"a":1,"b":2},"counts":{"a":1,"b":2},"shards":[]}]}`))
	f.Add([]byte(`{"format":"clipshard.epochs","version":3,"sources":[{"name":"a"},{"name":"a"}],"mix":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := writeTemp(t, "epochs.json", data)
		m, err := manifests.LoadEpochs(dir)
		if err != nil {
			return
		}
		if m.Version == manifests.EpochsVersionMix {
			names := m.SourceNames()
			for _, e := range m.Epochs {
				var sum int64
				for _, n := range names {
					sum += e.Counts[n]
				}
				if sum != e.Samples {
					t.Fatalf("epoch %d: counts %v add up to %d, samples %d", e.Epoch, e.Counts, sum, e.Samples)
				}
				m.Mix.At(e.Epoch, names)
			}
			m.Mix.Key()
		}
		// verify's structure pass over a folder holding only this manifest.
		if _, err := manifests.VerifyEpochs(dir, manifests.VerifyOptions{}); err != nil {
			t.Fatalf("loaded, but verify cannot use it: %v", err)
		}
	})
}

// FuzzWeights: a --weights value either parses, with every source given a
// decimal weight, or is refused; the counts of a parsed one add up to the
// epoch's samples, each within one sample of its exact share.
func FuzzWeights(f *testing.F) {
	f.Add("a=0.3,b=0.7", int64(1000))
	f.Add("0:4@a=1,b=0", int64(7))
	f.Add("3:@a=1e-3,b=2.5E+2", int64(999_999_999))
	f.Add("a=00.5,b=1", int64(3))
	f.Fuzz(func(t *testing.T, spec string, n int64) {
		r, err := manifests.ParseWeights(spec, []string{"a", "b"})
		if err != nil {
			return
		}
		n = max(0, n%(1<<40))
		w := []json.Number{r.Weights["a"], r.Weights["b"]}
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("%q parsed, but does not make JSON: %v", spec, err)
		}
		c := manifests.MixCounts([]int64{0, 0}, w, n)
		if c[0]+c[1] != n || c[0] < 0 || c[1] < 0 {
			t.Fatalf("%q, %d samples: counts %v", spec, n, c)
		}
		wa, _ := new(big.Rat).SetString(string(w[0]))
		wb, _ := new(big.Rat).SetString(string(w[1]))
		share := new(big.Rat).Quo(new(big.Rat).Mul(wa, new(big.Rat).SetInt64(n)), new(big.Rat).Add(wa, wb))
		d := new(big.Rat).Sub(share, new(big.Rat).SetInt64(c[0]))
		if d.Abs(d).Cmp(big.NewRat(1, 1)) >= 0 {
			t.Fatalf("%q, %d samples: a gets %d, its share is %s", spec, n, c[0], share.FloatString(3))
		}
	})
}

// FuzzParseBlockSums: any BLOCKSUMS is parsed (names inside the folder,
// digests as many as the sizes make, and what Marshal writes of it parsed
// again) or refused; never a panic.
func FuzzParseBlockSums(f *testing.F) {
	bh := manifests.NewBlockHasher(manifests.MinBlock)
	bh.Write(make([]byte, 100000))
	good, err := (&manifests.BlockSums{Block: manifests.MinBlock, Files: []manifests.BlockFile{
		{Name: "epoch-0000/shard-00000.x.npy", Size: 100000, SHA256: strings.Repeat("a", 64), Head: bh.Head(), Digests: bh.Digests()},
		{Name: "epoch-0000/shard-00001.x.npy", Size: 0, SHA256: strings.Repeat("b", 64), Head: strings.Repeat("c", 64)},
	}}).Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"format":"clipshard.blocksums","version":1,"block":65536,"digests_sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","files":[]}` + "\n"))
	f.Add([]byte(`{"format":"clipshard.blocksums","version":1,"block":65536,"files":[{"name":"../x","size":1}]}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := manifests.ParseBlockSums(data, "BLOCKSUMS")
		if err != nil {
			return
		}
		for _, file := range s.Files {
			if manifests.CheckRelPath(file.Name) != nil || int64(len(file.Digests)) != s.Blocks(file.Size)*32 {
				t.Fatalf("accepted %q (%d bytes, %d digest bytes)", file.Name, file.Size, len(file.Digests))
			}
		}
		again, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := manifests.ParseBlockSums(again, "again"); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzParseClaim: any CLAIM is parsed (format, version 1, kind, a sha256
// identity; Marshal of it parsed again to the same) or refused; never a
// panic.
func FuzzParseClaim(f *testing.F) {
	f.Add(manifests.DatasetClaim([]byte("{}")).Marshal())
	f.Add([]byte(`{"format":"clipshard.claim","version":1,"kind":"epochs","identity":"x"}`))
	f.Add([]byte(`{"format":"clipshard.claim","version":1}{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := manifests.ParseClaim(data, "CLAIM")
		if err != nil {
			return
		}
		if c.Format != manifests.ClaimFormat || c.Version != 1 || (c.Kind != "dataset" && c.Kind != "epochs") || len(c.Identity) != 64 {
			t.Fatalf("accepted %+v", c)
		}
		back, err := manifests.ParseClaim(c.Marshal(), "again")
		if err != nil || back != c {
			t.Fatalf("%+v: %v %+v", c, err, back)
		}
		_ = c.Describe()
	})
}
