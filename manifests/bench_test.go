package manifests_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

// BenchmarkWriteClips writes the clips.parquet of a convert of 5000
// clips, two modalities (every column: stamps and audits), as convert does
// once at its end, with nothing else left to overlap it.
func BenchmarkWriteClips(b *testing.B) {
	rows := make([]manifests.ClipRow, 5000)
	for i := range rows {
		src := func(m string, k uint64) manifests.ClipSource {
			return manifests.ClipSource{XXH64: uint64(i) * k, Path: fmt.Sprintf("/data/clips/%s/clip%06d.npy", m, i),
				Size: 7808, MtimeNS: 1764000000000000000 + int64(i)*1000, CtimeNS: 1764000000000000000 + int64(i)*1000,
				Ino: uint64(1000000 + i), Stamped: true, Audited: true, Descr: "<f4", Stats: manifests.Stats{MaxAbs: float64(i) * 1.1e-3}}
		}
		rows[i] = manifests.ClipRow{Clip: fmt.Sprintf("clip%06d", i), Start: int64(i * 30), Length: 30,
			Sources: []manifests.ClipSource{src("feat", 0x9e3779b97f4a7c15), src("motion", 0x7e3779b97f4a7c15)}}
	}
	path := filepath.Join(b.TempDir(), manifests.ClipsFile)
	for b.Loop() {
		if err := manifests.WriteClips(path, []string{"feat", "motion"}, rows); err != nil {
			b.Fatal(err)
		}
	}
}
