// Verification of an epochs directory (shuffle --out EDIR; verify EDIR).

package manifests

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
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
	blockSums := map[string]bool{} // each epoch's, if a push wrote them (a bucket's, or one synced down)
	for _, e := range man.Epochs {
		for _, s := range e.Shards {
			for _, f := range s.Files {
				want[f] = true
			}
		}
		blockSums[e.Dir+"/"+BlockSumsFile] = true
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
		if !want[rel] && !blockSums[rel] {
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
		for _, e := range man.Epochs {
			if rel := e.Dir + "/" + BlockSumsFile; present[rel] {
				var group []string
				for _, s := range e.Shards {
					for _, f := range s.Files {
						group = append(group, f)
					}
				}
				checkBlockSums(dir, rel, group, sums, r)
			}
		}
		if o.manifestsOnly { // the samples files and shards.parquet, not the data
			small := map[string]string{}
			for f, h := range sums {
				if f == man.Files.Shards || strings.HasSuffix(f, ".samples.npy") {
					small[f] = h
				}
			}
			sums = small
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
		if man.Version == EpochsVersionMix {
			checkMixEntry(man, e, r)
		}
	}
	if o.Deep {
		deepEpochs(dir, man, r)
	}
	r.Sort()
	return r, nil
}

// VouchEpochs checks what can be checked of the epochs folder dir without
// reading its shards' data: verify's structure check (every file present
// and no other, SHA256SUMS listing them, shard headers against
// epochs.json, the shards tiling each epoch, a mixed epoch's counts and
// weights, shards.parquet against epochs.json) and the sha256 of
// shards.parquet and of every samples file. It returns the manifest, or
// an error naming the first problem found (and how many more).
func VouchEpochs(dir string) (*Epochs, error) {
	r, err := VerifyEpochs(dir, VerifyOptions{manifestsOnly: true})
	if err != nil {
		return nil, err
	}
	if n := len(r.Problems); n > 0 {
		more := ""
		if n > 1 {
			more = fmt.Sprintf(" (and %d more problems)", n-1)
		}
		return nil, fmt.Errorf("%w: %s: %s%s", ErrManifest, dir, r.Problems[0], more)
	}
	return LoadEpochs(dir)
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
			return
		}
		if name != "samples" {
			return
		}
		// Every column in range (it costs nothing next to the hashing).
		cols := man.SampleCols()
		buf := make([]byte, s.Samples*8*cols)
		if _, err := f.ReadAt(buf, h.DataOffset); err != nil {
			r.Add(Problem{File: rel, What: err.Error()})
			return
		}
		if err := man.CheckSamples(s.Samples, func(i, c int) int64 { return int64(binary.LittleEndian.Uint64(buf[8*(i*cols+c):])) }); err != nil {
			r.Add(Problem{File: rel, What: err.Error()})
		}
	}
	for _, m := range man.Modalities {
		check(m.Name, m.DType, append([]int{s.Samples}, m.SampleShape()...))
	}
	check("samples", "<i8", []int{s.Samples, man.SampleCols()})
}

// checkMixEntry checks a mixed epoch's weights against the schedule in
// epochs.json (natural weights are the sources' own counts, checked by
// --deep) and its counts against its weights: the largest-remainder
// split of its samples.
func checkMixEntry(man *Epochs, e EpochEntry, r *Report) {
	names := man.SourceNames()
	w := make([]json.Number, len(names))
	for i, n := range names {
		w[i] = e.Weights[n]
	}
	if sched, ok := man.Mix.At(e.Epoch, names); !ok {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: no range of mix.weights holds it", e.Epoch)})
		return
	} else if sched != nil && !SameWeights(sched, w) {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: weights %v, mix.weights says %v for it (sources %v)", e.Epoch, w, sched, names)})
		return
	}
	if man.Mix.EpochSamples != 0 && e.Samples != man.Mix.EpochSamples {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: %d samples, mix.epoch_samples says %d", e.Epoch, e.Samples, man.Mix.EpochSamples)})
	}
	want := MixCounts(make([]int64, len(names)), w, e.Samples)
	for i, n := range names {
		if e.Counts[n] != want[i] {
			r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("epoch %d: source %s gave %d samples; its weight %s of %d samples makes %d (counts %v, weights %v)",
				e.Epoch, n, e.Counts[n], w[i], e.Samples, want[i], e.Counts, e.Weights)})
			return
		}
	}
}

// deepSource is one dataset an epochs folder was cut from, opened for
// --deep.
type deepSource struct {
	d       *Dataset
	starts  []int64
	lengths []int64
	clipID  func(int64) string
	blobs   []*os.File // per epochs.json modality
	rowB    []int64
}

// openDeepSource loads and opens the dataset in dir for the modalities
// of man, or reports why it cannot (named as what).
func openDeepSource(dir, sha, fingerprint, what string, man *Epochs, r *Report) *deepSource {
	sum, err := HashFile(filepath.Join(dir, DatasetFile))
	if err != nil || sum != sha {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("%s %s is gone or changed since shuffling (dataset.json sha256)", what, dir)})
		return nil
	}
	d, err := LoadDataset(dir)
	if err != nil {
		r.Add(Problem{File: EpochsFile, What: err.Error()})
		return nil
	}
	if d.Fingerprint != fingerprint {
		r.Add(Problem{File: EpochsFile, What: fmt.Sprintf("%s: fingerprint %q, the dataset's (%s) is %q", what, fingerprint, dir, d.Fingerprint)})
		return nil
	}
	src := &deepSource{d: d}
	src.starts, src.lengths, err = ReadIndex(filepath.Join(dir, d.Files.Index))
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
		f, _, err := regfile.Open(filepath.Join(dir, dm.File))
		if err != nil {
			r.Add(Problem{File: EpochsFile, What: err.Error()})
			src.close()
			return nil
		}
		src.blobs = append(src.blobs, f)
		rb, _ := array.ByteSize(m.FrameShape, dtypeSize(m.DType))
		src.rowB = append(src.rowB, rb)
	}
	return src
}

func (s *deepSource) close() {
	for _, f := range s.blobs {
		f.Close()
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
	rec := 8 * cols
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
			a, err := npy.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
			if err != nil || len(a.Data) != rec*sh.Samples {
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
				field := func(c int) int64 { return int64(binary.LittleEndian.Uint64(a.Data[rec*i+8*c:])) }
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
					first, rows := dm.ClipRows(int(smp.Clip), src.starts[smp.Clip]+smp.Start, smp.Valid)
					n := rows * src.rowB[k]
					if n > wb || dm.PerClip != m.PerClip {
						continue // the sample list check reports it
					}
					wantB := make([]byte, n)
					src.blobs[k].ReadAt(wantB, dm.DataOffset+first*src.rowB[k])
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
