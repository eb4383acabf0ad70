package manifests_test

import (
	"os"
	"path/filepath"
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
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := manifests.LoadDataset(writeTemp(t, "dataset.json", data))
		if err != nil {
			return
		}
		for _, m := range d.Modalities {
			if manifests.CheckRelPath(m.File) != nil {
				t.Fatalf("accepted %q", m.File)
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
