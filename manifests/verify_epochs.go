// Verification of an epochs directory (shuffle --out EDIR; verify EDIR).

package manifests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
)

// VerifyEpochs checks the epochs directory dir. Default: every file
// present and no others, shard headers against epochs.json, the shards
// tiling each epoch in order, and the sha256 of every file. o.Deep also re-derives every epoch's sample
// list from the seed and compares it with the samples files, and checks
// every sample's windows against the dataset. The error is non-nil only
// when epochs.json cannot be used.
func VerifyEpochs(dir string, o VerifyOptions) (*Report, error) {
	// The manifest and the listing are taken while no run commits (a
	// commit renames an epoch folder and rewrites the manifests under the
	// directory's lock); the hashing below runs without the lock.
	unlock, err := atomicfile.LockDir(dir, true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	man, err := LoadEpochs(dir)
	if err != nil {
		return nil, err
	}
	level := "structure+sha256"
	if o.Deep {
		level += "+deep"
	}
	r := NewReport("epochs", dir, level)

	want := map[string]bool{EpochsFile: true, man.Files.Shards: true, man.Files.Sums: true}
	for _, e := range man.Epochs {
		for _, s := range e.Shards {
			for _, f := range s.Files {
				want[f] = true
			}
		}
	}
	present := map[string]bool{}
	werr := WalkRel(dir, func(rel string, d fs.DirEntry) error {
		if d.IsDir() {
			var e int
			if n, _ := fmt.Sscanf(rel, ".partial-epoch-%04d", &e); n == 1 && rel == ".partial-"+EpochDir(e) {
				if EpochInProgress(dir, e) {
					r.InProgress = append(r.InProgress, rel)
				} else {
					r.Add(Problem{File: rel, What: fmt.Sprintf("left by a killed shuffle: a re-run of epoch %d, or shuffle --drop %d:%d, removes it", e, e, e+1)})
				}
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(rel, LockPrefix) {
			return nil // a run's epoch claim, not output
		}
		if strings.HasPrefix(rel, atomicfile.TempPrefix) {
			r.Add(Problem{File: rel, What: "temporary file of a manifest write that a killed shuffle left; the next shuffle into this directory removes it"})
			return nil
		}
		present[rel] = true
		if !want[rel] {
			r.Add(Problem{File: rel, What: "unexpected file (not in epochs.json)"})
		}
		return nil
	})
	if werr != nil {
		r.Add(Problem{File: ".", What: "listing the directory: " + werr.Error()})
	}
	for f := range want {
		if !present[f] {
			r.Add(Problem{File: f, What: "missing"})
		}
	}
	sums, err := ReadSums(filepath.Join(dir, man.Files.Sums))
	unlock()
	locked = false
	if err != nil {
		r.Add(Problem{File: man.Files.Sums, What: err.Error()})
	} else {
		for f := range want {
			if _, ok := sums[f]; !ok && f != man.Files.Sums {
				r.Add(Problem{File: man.Files.Sums, What: "does not list " + f})
			}
		}
		CheckSums(dir, sums, present, o, r)
	}
	// shards.parquet against epochs.json, row by row (parsed only if its
	// sha256 holds: a corrupt footer can declare what it likes).
	if p := filepath.Join(dir, man.Files.Shards); present[man.Files.Shards] && sums != nil && sums[man.Files.Shards] != "" {
		if got, err := HashFile(p); err == nil && got == sums[man.Files.Shards] {
			checkShardsTable(p, man, r)
		}
	}

	for _, e := range man.Epochs {
		r.Samples += e.Samples
		// The shards hold the epoch's samples in order, each from where
		// the last one ends, in shards of shard_samples (the last fewer).
		var next int64
		for i, s := range e.Shards {
			checkShardHeaders(dir, man, s, present, r)
			last := i == len(e.Shards)-1
			if s.First != next || s.Samples < 1 || s.Samples > man.ShardSamples || (!last && s.Samples != man.ShardSamples) {
				r.Add(Problem{File: e.Dir, What: fmt.Sprintf("shard %d holds samples %d..%d; want them from %d, %d a shard", s.Shard, s.First, s.First+int64(s.Samples), next, man.ShardSamples)})
			}
			next = s.First + int64(s.Samples)
		}
		if next != e.Samples {
			r.Add(Problem{File: e.Dir, What: fmt.Sprintf("the shards hold %d samples, epochs.json says %d", next, e.Samples)})
		}
	}
	if o.Deep {
		deepEpochs(dir, man, r)
	}
	r.Sort()
	return r, nil
}

func checkShardHeaders(dir string, man *Epochs, s ShardEntry, present map[string]bool, r *Report) {
	check := func(name string, descr string, shape []int) {
		rel := s.Files[name]
		if !present[rel] {
			return
		}
		f, st, err := regfile.Open(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			r.Add(Problem{File: rel, What: err.Error()})
			return
		}
		defer f.Close()
		h, err := npy.ReadHeader(f, st.Size())
		if err != nil {
			r.Add(Problem{File: rel, What: err.Error()})
			return
		}
		if h.Descr != descr || !slices.Equal(h.Shape, shape) || h.DataOffset%npy.DataAlign != 0 {
			r.Add(Problem{File: rel, What: fmt.Sprintf("header %s %s at offset %d, epochs.json says %s %s (4096-aligned)",
				h.Descr, array.FormatShape(h.Shape), h.DataOffset, descr, array.FormatShape(shape))})
		}
	}
	for _, m := range man.Modalities {
		check(m.Name, m.DType, append([]int{s.Samples}, m.SampleShape()...))
	}
	check("samples", "<i8", []int{s.Samples, 3})
}

// deepEpochs re-derives every epoch's samples from the seed and checks
// them, and every window, against the dataset.
func deepEpochs(dir string, man *Epochs, r *Report) {
	ds := man.Dataset.Dir
	sum, err := HashFile(filepath.Join(ds, DatasetFile))
	if err != nil || sum != man.Dataset.SHA256 {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("dataset %s is gone or changed since shuffling (dataset.json sha256)", ds)})
		return
	}
	d, err := LoadDataset(ds)
	if err != nil {
		r.Add(Problem{File: EpochsFile, What: err.Error()})
		return
	}
	starts, lengths, err := ReadIndex(filepath.Join(ds, d.Files.Index))
	if err != nil {
		r.Add(Problem{File: EpochsFile, What: err.Error()})
		return
	}
	names := make([]string, len(d.Modalities))
	for i, m := range d.Modalities {
		names[i] = m.Name
	}
	clipID := func(i int64) string { return fmt.Sprint(i) }
	if rows, err := ReadClips(filepath.Join(ds, d.Files.Clips), names); err == nil {
		clipID = func(i int64) string {
			if i >= 0 && i < int64(len(rows)) {
				return rows[i].Clip
			}
			return fmt.Sprint(i)
		}
	}
	blobs := make([]*os.File, len(man.Modalities))
	rowBytes := make([]int64, len(man.Modalities))
	for k, m := range man.Modalities {
		dm := d.Modality(m.Name)
		if dm == nil {
			r.Add(Problem{File: EpochsFile, What: "modality " + m.Name + " is not in the dataset"})
			return
		}
		f, _, err := regfile.Open(filepath.Join(ds, dm.File))
		if err != nil {
			r.Add(Problem{File: EpochsFile, What: err.Error()})
			return
		}
		defer f.Close()
		blobs[k] = f
		rowBytes[k], _ = array.ByteSize(m.FrameShape, dtypeSize(m.DType))
	}
	s := Sampling{Window: man.Window, Mode: man.Sampling, PerClip: man.PerClip, Short: man.Short}
	for _, e := range man.Epochs {
		all := Samples(lengths, s, man.Seed, e.Epoch)
		if int64(len(all)) != e.Samples {
			r.Add(Problem{File: e.Dir, What: fmt.Sprintf("seed %d gives %d samples, epochs.json says %d (another seed or sampling?)", man.Seed, len(all), e.Samples)})
			continue
		}
		for _, sh := range e.Shards {
			rel := sh.Files["samples"]
			a, err := npy.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
			if err != nil || len(a.Data) != 24*sh.Samples {
				continue // reported by the structure checks
			}
			// Shard files are read window by window: a shard of a large
			// dataset is hundreds of MB.
			wins := make([]*os.File, len(man.Modalities))
			offs := make([]int64, len(man.Modalities))
			for k, m := range man.Modalities {
				f, st, err := regfile.Open(filepath.Join(dir, filepath.FromSlash(sh.Files[m.Name])))
				if err != nil {
					continue
				}
				h, err := npy.ReadHeader(f, st.Size())
				if err != nil {
					f.Close()
					continue
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
				got := Sample{
					Clip:  int64(binary.LittleEndian.Uint64(a.Data[24*i:])),
					Start: int64(binary.LittleEndian.Uint64(a.Data[24*i+8:])),
					Valid: int64(binary.LittleEndian.Uint64(a.Data[24*i+16:])),
				}
				at := sh.First + int64(i)
				if sh.First < 0 || at >= int64(len(all)) {
					r.Add(Problem{File: rel, What: fmt.Sprintf("shard claims sample %d, beyond the epoch's %d", at, len(all))})
					break
				}
				if want := all[at]; got != want {
					r.Add(Problem{File: rel, Clip: clipID(got.Clip), What: fmt.Sprintf("sample %d is (clip %d, start %d, valid %d); seed %d says (clip %d, start %d, valid %d)",
						i, got.Clip, got.Start, got.Valid, man.Seed, want.Clip, want.Start, want.Valid)})
					break
				}
				for k, m := range man.Modalities {
					if wins[k] == nil {
						continue
					}
					wb, _ := m.SampleBytes()
					if got.Clip < 0 || got.Clip >= int64(len(starts)) {
						continue // the sample list check reports it
					}
					dm := d.Modality(m.Name)
					first, rows := dm.ClipRows(int(got.Clip), starts[got.Clip]+got.Start, got.Valid)
					n := rows * rowBytes[k]
					if n > wb || dm.PerClip != m.PerClip {
						continue // the sample list check reports it
					}
					want := make([]byte, n)
					blobs[k].ReadAt(want, dm.DataOffset+first*rowBytes[k])
					w := make([]byte, wb)
					if _, err := wins[k].ReadAt(w, offs[k]+int64(i)*wb); err != nil {
						r.Add(Problem{File: sh.Files[m.Name], What: fmt.Sprintf("sample %d: %v", i, err)})
						continue
					}
					if !bytes.Equal(w[:n], want) || bytes.ContainsFunc(w[n:], func(r rune) bool { return r != 0 }) {
						r.Add(Problem{File: sh.Files[m.Name], Clip: clipID(got.Clip), What: fmt.Sprintf("sample %d (clip %d, start %d) differs from the dataset", i, got.Clip, got.Start)})
					}
				}
			}
			closeAll()
		}
	}
}

// checkShardsTable checks shards.parquet: a row per shard of every epoch
// of epochs.json, in its order, with the same epoch, shard, first sample,
// sample count and files.
func checkShardsTable(path string, man *Epochs, r *Report) {
	name := filepath.Base(path)
	names := []string{"samples"}
	for _, m := range man.Modalities {
		names = append(names, m.Name)
	}
	var fileCols []string
	for _, n := range names {
		fileCols = append(fileCols, n+"_file")
	}
	iv, sv, err := ReadTable(path, []string{"epoch", "shard", "first", "samples"}, fileCols)
	if err != nil {
		r.Add(Problem{File: name, What: oneLine(err)})
		return
	}
	var want int
	for _, e := range man.Epochs {
		want += len(e.Shards)
	}
	if got := len(iv["epoch"]); got != want {
		r.Add(Problem{File: name, What: fmt.Sprintf("%d rows, epochs.json lists %d shards", got, want)})
		return
	}
	i := 0
	for _, e := range man.Epochs {
		for _, s := range e.Shards {
			row := fmt.Sprintf("epoch %d shard %d first %d samples %d", iv["epoch"][i], iv["shard"][i], iv["first"][i], iv["samples"][i])
			if exp := fmt.Sprintf("epoch %d shard %d first %d samples %d", e.Epoch, s.Shard, s.First, s.Samples); row != exp {
				r.Add(Problem{File: name, What: fmt.Sprintf("row %d: %s; epochs.json says %s", i, row, exp)})
				return
			}
			for k, n := range names {
				if got := sv[fileCols[k]][i]; got != s.Files[n] {
					r.Add(Problem{File: name, What: fmt.Sprintf("row %d (epoch %d shard %d): %s %q; epochs.json says %q", i, e.Epoch, s.Shard, fileCols[k], got, s.Files[n])})
					return
				}
			}
			i++
		}
	}
}
