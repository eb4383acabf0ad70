// verify --deep of an epochs directory: every sample's windows re-read from
// its source datasets and compared with the shards.

package manifests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/regfile"
)

// deepSource is one dataset an epochs folder was cut from, opened for
// --deep.
type deepSource struct {
	d       *Dataset
	starts  []int64
	lengths []int64
	clipID  func(int64) string
	where   *Where       // format 2's where.npy
	blobs   [][]*os.File // per epochs.json modality: its blobs
	mods    []int        // per epochs.json modality: its index in d
	rowB    []int64
}

// openDeepSource loads and opens the dataset in dir for the modalities
// of man, or reports why it cannot (named as what).
func openDeepSource(dir, sha, fingerprint, what string, man *Epochs, r *Report) *deepSource {
	// The version the epochs were cut from: the current one, or one kept
	// (a dataset grown by convert --segments).
	d, err := FindVersion(dir, sha)
	if err != nil || d == nil {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("%s %s is gone or changed since shuffling (no version of it has the dataset.json sha256 recorded)", what, dir)})
		return nil
	}
	if d.Fingerprint != fingerprint {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("%s: fingerprint %q, the dataset's (%s) is %q", what, fingerprint, dir, d.Fingerprint)})
		return nil
	}
	src := &deepSource{d: d}
	src.starts, src.lengths, err = ReadIndex(filepath.Join(dir, d.Files.Index))
	if err == nil && int64(len(src.starts)) != d.Clips {
		err = fmt.Errorf("%w: %s: %d clips, dataset.json says %d", ErrManifest, d.Files.Index, len(src.starts), d.Clips)
	}
	if err == nil {
		src.where, err = LoadWhere(dir, d, src.starts, src.lengths)
	}
	if err != nil {
		r.Add(Problem{File: EpochsFile, What: err.Error()})
		return nil
	}
	names := make([]string, len(d.Modalities))
	for i, m := range d.Modalities {
		names[i] = m.Name
	}
	src.clipID = func(i int64) string { return fmt.Sprint(i) }
	if rows, err := ReadClips(filepath.Join(dir, d.Files.Clips), names); err == nil {
		src.clipID = func(i int64) string {
			if i >= 0 && i < int64(len(rows)) {
				return rows[i].Clip
			}
			return fmt.Sprint(i)
		}
	}
	for _, m := range man.Modalities {
		dm := d.Modality(m.Name)
		if dm == nil {
			r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("modality %s is not in %s %s", m.Name, what, dir)})
			src.close()
			return nil
		}
		rows := man.Window * dm.Rate
		if dm.PerClip {
			rows = 0
		}
		if m.DType != dm.DType || m.Rate != dm.Rate || m.PerClip != dm.PerClip || !slices.Equal(m.FrameShape, dm.FrameShape) || m.WindowRows != rows {
			r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("modality %s: %s rate %d per_clip %v frame_shape %v window_rows %d; %s %s has %s rate %d per_clip %v frame_shape %v (window_rows %d at window %d)",
				m.Name, m.DType, m.Rate, m.PerClip, m.FrameShape, m.WindowRows, what, dir, dm.DType, dm.Rate, dm.PerClip, dm.FrameShape, rows, man.Window)})
			src.close()
			return nil
		}
		var files []*os.File
		for _, b := range dm.BlobList() {
			f, _, err := regfile.Open(filepath.Join(dir, b.File))
			if err != nil {
				r.Add(Problem{File: EpochsFile, What: err.Error()})
				src.blobs = append(src.blobs, files)
				src.close()
				return nil
			}
			files = append(files, f)
		}
		src.blobs = append(src.blobs, files)
		src.mods = append(src.mods, slices.IndexFunc(d.Modalities, func(x Modality) bool { return x.Name == m.Name }))
		rb, _ := array.ByteSize(m.FrameShape, dtypeSize(m.DType))
		src.rowB = append(src.rowB, rb)
	}
	return src
}

func (s *deepSource) close() {
	for _, fs := range s.blobs {
		for _, f := range fs {
			f.Close()
		}
	}
}

// deepEpochs re-derives every epoch's samples from the seed and checks
// them, and every window, against the dataset (a mixed folder: against
// each sample's own source, with the counts per source).
func deepEpochs(dir string, man *Epochs, r *Report) {
	var srcs []*deepSource
	if man.Version == EpochsVersionMix {
		for _, ref := range man.Sources {
			src := openDeepSource(ref.Dir, ref.SHA256, ref.Fingerprint, "source "+ref.Name, man, r)
			if src == nil {
				return
			}
			defer src.close()
			if src.d.Clips != ref.Clips {
				r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("source %s: %d clips, epochs.json says %d", ref.Name, src.d.Clips, ref.Clips)})
				return
			}
			srcs = append(srcs, src)
		}
	} else {
		src := openDeepSource(man.Dataset.Dir, man.Dataset.SHA256, man.Dataset.Fingerprint, "dataset", man, r)
		if src == nil {
			return
		}
		defer src.close()
		if man.Dataset.Clips != 0 && src.d.Clips != man.Dataset.Clips {
			r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("dataset: %d clips, epochs.json says %d", src.d.Clips, man.Dataset.Clips)})
			return
		}
		srcs = append(srcs, src)
	}
	clip0 := make([]int64, len(srcs)+1)
	for i, src := range srcs {
		clip0[i+1] = clip0[i] + int64(len(src.starts))
	}
	cols := man.SampleCols()
	s := Sampling{Window: man.Window, Mode: man.Sampling, PerClip: man.PerClip, Short: man.Short}
	for _, e := range man.Epochs {
		var all []Sample
		if man.Version == EpochsVersionMix {
			mix := make([]MixSource, len(srcs))
			for i, src := range srcs {
				mix[i].Lengths = src.lengths
			}
			names := man.SourceNames()
			w, ok := man.Mix.At(e.Epoch, names)
			if !ok {
				continue // reported by checkMixEntry
			}
			m := MixEpoch(mix, s, man.Seed, e.Epoch, w, man.Mix.EpochSamples)
			if m.Empty >= 0 {
				r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: source %s is to give %d samples but has none", e.Epoch, names[m.Empty], m.Counts[m.Empty])})
				continue
			}
			for i, n := range names {
				switch {
				case w == nil && e.Weights[n] != m.Weights[i]: // natural: the sources' own counts are the weights
					r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: source %s's weight is %s, but it has %s samples of its own (mix.weights is natural)", e.Epoch, n, e.Weights[n], m.Weights[i])})
				case e.Counts[n] != m.Counts[i]:
					r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: source %s gave %d samples, the seed and weights make %d", e.Epoch, n, e.Counts[n], m.Counts[i])})
				}
			}
			all = m.Samples
		} else {
			all = Samples(srcs[0].lengths, s, man.Seed, e.Epoch)
		}
		if int64(len(all)) != e.Samples {
			r.Add(Problem{File: e.Dir, What: fmt.Sprintf("seed %d gives %d samples, epochs.json says %d (another seed or sampling?)", man.Seed, len(all), e.Samples)})
			continue
		}
		got := make([]int64, len(srcs)) // samples per source, from the samples files
		before := len(r.Problems)
		for _, sh := range e.Shards {
			rel := sh.Files["samples"]
			rows, err := man.ReadShardRows(dir, sh)
			if err != nil {
				continue // reported by the structure checks
			}
			// Shard files are read window by window: a shard of a large
			// dataset is hundreds of MB.
			wins := make([]*os.File, len(man.Modalities))
			offs := make([]int64, len(man.Modalities))
			for k, m := range man.Modalities {
				f, h, err := man.ShardFile(dir, sh, m.Name)
				if err != nil {
					continue // reported by the structure checks
				}
				wins[k], offs[k] = f, h.DataOffset
			}
			closeAll := func() {
				for _, f := range wins {
					if f != nil {
						f.Close()
					}
				}
			}
			for i := 0; i < sh.Samples; i++ {
				field := func(c int) int64 { return rows[cols*i+c] }
				smp := Sample{Clip: field(0), Start: field(1), Valid: field(2)}
				srcN := int64(0)
				if cols == 4 {
					srcN = field(3)
				}
				at := sh.First + int64(i)
				if sh.First < 0 || at >= int64(len(all)) {
					r.Add(Problem{File: rel, What: fmt.Sprintf("shard claims sample %d, beyond the epoch's %d", at, len(all))})
					break
				}
				want := all[at]
				wantSrc := sort.Search(len(srcs), func(k int) bool { return clip0[k+1] > want.Clip })
				want.Clip -= clip0[wantSrc]
				if smp != want || srcN != int64(wantSrc) {
					what := fmt.Sprintf("sample %d is (clip %d, start %d, valid %d); seed %d says (clip %d, start %d, valid %d)",
						i, smp.Clip, smp.Start, smp.Valid, man.Seed, want.Clip, want.Start, want.Valid)
					if cols == 4 {
						what = fmt.Sprintf("sample %d is (clip %d, start %d, valid %d, source %d); seed %d says (clip %d, start %d, valid %d, source %d %s)",
							i, smp.Clip, smp.Start, smp.Valid, srcN, man.Seed, want.Clip, want.Start, want.Valid, wantSrc, man.Sources[wantSrc].Name)
					}
					id := fmt.Sprint(smp.Clip)
					if srcN >= 0 && srcN < int64(len(srcs)) {
						id = srcs[srcN].clipID(smp.Clip)
					}
					r.Add(Problem{File: rel, Clip: id, What: what})
					break
				}
				got[wantSrc]++
				src := srcs[wantSrc]
				for k, m := range man.Modalities {
					if wins[k] == nil {
						continue
					}
					wb, _ := m.SampleBytes()
					if smp.Clip < 0 || smp.Clip >= int64(len(src.starts)) {
						continue // the sample list check reports it
					}
					dm := src.d.Modality(m.Name)
					b, first, rows := src.d.SampleRows(src.where, src.mods[k], int(smp.Clip), src.starts[smp.Clip], smp.Start, smp.Valid)
					n := rows * src.rowB[k]
					if n > wb || dm.PerClip != m.PerClip {
						continue // the sample list check reports it
					}
					wantB := make([]byte, n)
					src.blobs[k][b].ReadAt(wantB, dm.BlobList()[b].DataOffset+first*src.rowB[k])
					w := make([]byte, wb)
					if _, err := wins[k].ReadAt(w, offs[k]+int64(i)*wb); err != nil {
						r.Add(Problem{File: sh.Files[m.Name], What: fmt.Sprintf("sample %d: %v", i, err)})
						continue
					}
					if !bytes.Equal(w[:n], wantB) || bytes.ContainsFunc(w[n:], func(r rune) bool { return r != 0 }) {
						what := fmt.Sprintf("sample %d (clip %d, start %d) differs from the dataset", i, smp.Clip, smp.Start)
						if cols == 4 {
							what = fmt.Sprintf("sample %d (source %s, clip %d, start %d) differs from its source", i, man.Sources[wantSrc].Name, smp.Clip, smp.Start)
						}
						r.Add(Problem{File: sh.Files[m.Name], Clip: src.clipID(smp.Clip), What: what})
					}
				}
			}
			closeAll()
		}
		if cols == 4 {
			for i, n := range man.SourceNames() {
				if got[i] != e.Counts[n] && len(r.Problems) == before {
					r.Add(Problem{File: e.Dir, What: fmt.Sprintf("the samples files hold %d samples of source %s, epochs.json's counts %d", got[i], n, e.Counts[n])})
				}
			}
		}
	}
}
