// Verification of an epochs directory (shuffle --out EDIR; verify EDIR).

package manifests

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/clipshard/clipshard/formats/atomicfile"
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
	blockSums[ClaimFile] = true                             // (a bucket's: checked below)
	present, linked := map[string]bool{}, map[string]bool{} // (linked: links out of dir, not followed)
	werr := WalkRel(dir, func(rel string, d fs.DirEntry) error {
		if what := LinkOut(dir, rel, d); what != "" {
			r.Add(Problem{File: rel, What: what})
			linked[rel] = true
			return nil
		}
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
			r.Add(Problem{File: rel, What: "unexpected file (not in epochs.json: a file of yours? move it out of the epochs' folder)"})
		}
		return nil
	})
	if werr != nil {
		r.Add(Problem{File: ".", What: "listing the directory: " + werr.Error()})
	}
	for f := range want {
		if !present[f] && !linked[f] && !linked[path.Dir(f)] {
			r.Add(Problem{File: f, What: "missing"})
		}
	}
	if present[ClaimFile] {
		checkClaim(dir, EpochsClaim(man), r)
	}
	if !o.Deep { // (--deep checks each dataset whole)
		checkDatasetsHere(man, r)
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
	problem := func(rel string, err error) {
		var fe *FileError
		if errors.As(err, &fe) {
			err = fe.Err
		}
		r.Add(Problem{File: rel, What: err.Error()})
	}
	for _, m := range man.Modalities {
		if rel := s.Files[m.Name]; present[rel] {
			f, _, err := man.ShardFile(dir, s, m.Name)
			if err != nil {
				problem(rel, err)
				continue
			}
			f.Close()
		}
	}
	// Every column of the samples in range (it costs nothing next to the
	// hashing).
	if rel := s.Files["samples"]; present[rel] {
		if _, _, err := man.ReadShardSamples(dir, s); err != nil {
			problem(rel, err)
		}
	}
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
