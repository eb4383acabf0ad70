package clitest

import (
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

// EditDataset rewrites dir's dataset.json through edit and its line in
// SHA256SUMS (an edit consistent with the sums).
func EditDataset(t testing.TB, dir string, edit func(*manifests.Dataset)) {
	t.Helper()
	d, err := manifests.LoadDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	edit(d)
	if err := d.Write(dir); err != nil {
		t.Fatal(err)
	}
	Resum(t, dir, manifests.DatasetFile)
}

// EditClips rewrites dir's clips.parquet through edit and its line in
// SHA256SUMS.
func EditClips(t testing.TB, dir string, edit func([]manifests.ClipRow)) {
	t.Helper()
	d, err := manifests.LoadDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range d.Modalities {
		names = append(names, m.Name)
	}
	p := filepath.Join(dir, manifests.ClipsFile)
	rows, err := manifests.ReadClips(p, names)
	if err != nil {
		t.Fatal(err)
	}
	edit(rows)
	if err := manifests.WriteClips(p, names, rows); err != nil {
		t.Fatal(err)
	}
	Resum(t, dir, manifests.ClipsFile)
}

// Resum recomputes the lines of SHA256SUMS in dir for files (every line,
// if none are named), so that an edit is invisible to the sums.
func Resum(t testing.TB, dir string, files ...string) {
	t.Helper()
	p := filepath.Join(dir, manifests.SumsFile)
	sums, err := manifests.ReadSums(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		for f := range sums {
			files = append(files, f)
		}
	}
	for _, f := range files {
		if sums[f], err = manifests.HashFile(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := manifests.WriteSums(p, sums); err != nil {
		t.Fatal(err)
	}
}
