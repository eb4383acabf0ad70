// The samples of an epoch read back: ranges of its samples files, and one
// sample with its windows.
package inspect

import (
	"encoding/binary"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/manifests"
)

// readRange reads samples [lo, hi) of an epoch from its shards' samples
// files (of cols columns; a mixed folder's source, below sources, in
// Clip's bits from sourceShift up).
func readRange(dir string, man *manifests.Epochs, shards []manifests.ShardEntry, lo, hi int64, cols, sources int) ([]manifests.Sample, error) {
	var out []manifests.Sample
	for _, s := range shards {
		a, b := max(lo, s.First), min(hi, s.First+int64(s.Samples))
		if a >= b {
			continue
		}
		got, err := readSamples(dir, man, s, cols, sources)
		if err != nil {
			return nil, err
		}
		out = append(out, got[a-s.First:b-s.First]...)
	}
	return out, nil
}

// readSamples reads a shard's samples file (int64 [S, cols]).
func readSamples(dir string, man *manifests.Epochs, s manifests.ShardEntry, cols, sources int) ([]manifests.Sample, error) {
	p, err := manifests.Join(dir, s.Files["samples"])
	if err != nil {
		return nil, err
	}
	off, err := shardData(p, "<i8", []int{s.Samples, cols})
	if err != nil {
		return nil, err
	}
	f, _, err := regfile.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rec := 8 * cols
	buf := make([]byte, s.Samples*rec)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	out := make([]manifests.Sample, s.Samples)
	field := func(i, c int) int64 { return int64(binary.LittleEndian.Uint64(buf[i*rec+8*c:])) }
	if err := man.CheckSamples(s.Samples, field); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	for i := range out {
		out[i] = manifests.Sample{Clip: field(i, 0), Start: field(i, 1), Valid: field(i, 2)}
		if cols == 4 {
			src := field(i, 3)
			if src < 0 || src >= int64(sources) || out[i].Clip < 0 || out[i].Clip >= 1<<sourceShift {
				return nil, fmt.Errorf("%s: sample %d: clip %d of source %d; epochs.json lists %d sources", p, i, out[i].Clip, src, sources)
			}
			out[i].Clip |= src << sourceShift
		}
	}
	return out, nil
}

// shardData checks a shard file's .npy header against the manifest and
// returns where its data starts.
func shardData(p, descr string, shape []int) (int64, error) {
	f, fi, err := regfile.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	head := make([]byte, min(fi.Size(), 1<<16))
	if _, err := io.ReadFull(f, head); err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	h, err := npy.ParseHeader(head, fi.Size())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	if h.Descr != descr || h.Fortran || !slices.Equal(h.Shape, shape) {
		return 0, fmt.Errorf("%s: holds %s %v, epochs.json says %s %v", p, h.Descr, h.Shape, descr, shape)
	}
	if fi.Size() != h.DataOffset+h.DataSize {
		return 0, fmt.Errorf("%s: %d bytes, its header makes %d", p, fi.Size(), h.DataOffset+h.DataSize)
	}
	return h.DataOffset, nil
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
		got, err := readSamples(dir, man, s, man.SampleCols(), len(man.Sources))
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
		if ids, err := readIDs(filepath.Join(dsDir, "clips.txt")); err == nil && rep.Clip >= 0 && rep.Clip < int64(len(ids)) {
			rep.ClipID = ids[rep.Clip]
		}
		for _, m := range man.Modalities {
			p, err := manifests.Join(dir, s.Files[m.Name])
			if err != nil {
				return nil, err
			}
			shape := append([]int{s.Samples}, m.SampleShape()...)
			off, err := shardData(p, m.DType, shape)
			if err != nil {
				return nil, err
			}
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
