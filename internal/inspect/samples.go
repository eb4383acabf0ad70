// The samples of an epoch read back: ranges of its samples files, and one
// sample with its windows.

package inspect

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/manifests"
)

// readRange reads samples [lo, hi) of an epoch from its shards' samples
// files (a mixed folder's source, below sources, in Clip's bits from
// sourceShift up).
func readRange(dir string, man *manifests.Epochs, shards []manifests.ShardEntry, lo, hi int64, sources int) ([]manifests.Sample, error) {
	var out []manifests.Sample
	for _, s := range shards {
		a, b := max(lo, s.First), min(hi, s.First+int64(s.Samples))
		if a >= b {
			continue
		}
		got, err := readSamples(dir, man, s, sources)
		if err != nil {
			return nil, err
		}
		out = append(out, got[a-s.First:b-s.First]...)
	}
	return out, nil
}

// readSamples reads a shard's samples file, checked (a mixed folder's
// source, below sources, in Clip's bits from sourceShift up).
func readSamples(dir string, man *manifests.Epochs, s manifests.ShardEntry, sources int) ([]manifests.Sample, error) {
	out, srcs, err := man.ReadShardSamples(dir, s)
	if err != nil {
		return nil, err
	}
	for i, src := range srcs {
		if src < 0 || src >= sources || out[i].Clip < 0 || out[i].Clip >= 1<<sourceShift {
			p, _ := manifests.Join(dir, s.Files["samples"])
			return nil, fmt.Errorf("%s: sample %d: clip %d of source %d; epochs.json lists %d sources", p, i, out[i].Clip, src, sources)
		}
		out[i].Clip |= int64(src) << sourceShift
	}
	return out, nil
}

// SampleReport is one sample of an epoch.
type SampleReport struct {
	Epoch      int             `json:"epoch"`
	Index      int64           `json:"index"`
	Source     string          `json:"source,omitempty"` // a mixed folder's: the sample's source
	Clip       int64           `json:"clip_row"`
	ClipID     string          `json:"clip"`
	Start      int64           `json:"start"`
	Valid      int64           `json:"valid"`
	Shard      string          `json:"shard"`
	Modalities []FeatureReport `json:"modalities"`
}

func sampleReport(dir string, man *manifests.Epochs, spec string, open Opener) (*SampleReport, error) {
	es, is, ok := strings.Cut(spec, ":")
	e, err1 := strconv.Atoi(es)
	i, err2 := strconv.ParseInt(is, 10, 64)
	if !ok || err1 != nil || err2 != nil || i < 0 {
		return nil, UsageError{Msg: fmt.Sprintf("--sample %q: want EPOCH:INDEX (e.g. 0:17)", spec)}
	}
	entry := man.Entry(e)
	if entry == nil {
		return nil, UsageError{Msg: fmt.Sprintf("--sample %q: %s has no epoch %d", spec, dir, e)}
	}
	for _, s := range entry.Shards {
		if i < s.First || i >= s.First+int64(s.Samples) {
			continue
		}
		got, err := readSamples(dir, man, s, len(man.Sources))
		if err != nil {
			return nil, err
		}
		k := i - s.First
		smp := got[k]
		dsDir := man.Dataset.Dir
		rep := &SampleReport{Epoch: e, Index: i, Clip: smp.Clip, Start: smp.Start, Valid: smp.Valid, Shard: s.Files["samples"]}
		if man.SampleCols() == 4 {
			src := man.Sources[sourceOf(smp.Clip)]
			rep.Clip &= 1<<sourceShift - 1
			rep.Source, dsDir = src.Name, src.Dir
		}
		if ids, err := manifests.ReadIDs(filepath.Join(dsDir, manifests.IDsFile)); err == nil && rep.Clip >= 0 && rep.Clip < int64(len(ids)) {
			rep.ClipID = ids[rep.Clip]
		}
		for _, m := range man.Modalities {
			f, h, err := man.ShardFile(dir, s, m.Name)
			if err != nil {
				return nil, err
			}
			p, off := f.Name(), h.DataOffset
			f.Close()
			frame := m.FrameShape
			rows := int64(m.WindowRows)
			first := k * rows
			if m.PerClip {
				rows, first = 1, k
			}
			fr, err := featureStats(p, m.Name, m.DType, frame, off, first, rows, open)
			if err != nil {
				return nil, err
			}
			rep.Modalities = append(rep.Modalities, *fr)
		}
		return rep, nil
	}
	return nil, UsageError{Msg: fmt.Sprintf("--sample %q: epoch %d has %d samples", spec, e, entry.Samples)}
}
