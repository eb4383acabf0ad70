// Writing an epochs directory's manifests (shards.parquet, SHA256SUMS,
// epochs.json last) and repairing them from the files there.

package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"

	"github.com/clipshard/clipshard/formats/atomicfile"
)

// ShardsTable is the bytes of the shards.parquet of man (as WriteEpochs
// writes it).
func ShardsTable(man *Epochs) ([]byte, error) {
	return TableBytes(ShardsFile, shardsColumns(man))
}

// WriteEpochs rewrites shards.parquet, SHA256SUMS (adding newSums to the
// sums of files already listed) and epochs.json, in that order.
func WriteEpochs(out string, man *Epochs, newSums map[string]string) error {
	if err := writeShardsTable(filepath.Join(out, ShardsFile), man); err != nil {
		return err
	}
	return writeSumsAndEpochs(out, man, newSums)
}

func writeShardsTable(path string, man *Epochs) error {
	return WriteTable(path, shardsColumns(man))
}

// shardsColumns is the table of shards.parquet: a row per shard of every
// epoch.
func shardsColumns(man *Epochs) []Column {
	var cols struct {
		epoch, shard, first, samples []int64
		files                        map[string][]string
	}
	cols.files = map[string][]string{}
	names := []string{"samples"}
	for _, m := range man.Modalities {
		names = append(names, m.Name)
	}
	for _, e := range man.Epochs {
		for _, sh := range e.Shards {
			cols.epoch = append(cols.epoch, int64(e.Epoch))
			cols.shard = append(cols.shard, int64(sh.Shard))
			cols.first = append(cols.first, sh.First)
			cols.samples = append(cols.samples, int64(sh.Samples))
			for _, n := range names {
				cols.files[n] = append(cols.files[n], sh.Files[n])
			}
		}
	}
	table := []Column{
		{Name: "epoch", Ints: nz(cols.epoch)}, {Name: "shard", Ints: nz(cols.shard)},
		{Name: "first", Ints: nz(cols.first)}, {Name: "samples", Ints: nz(cols.samples)},
	}
	for _, n := range names {
		v := cols.files[n]
		if v == nil {
			v = []string{}
		}
		table = append(table, Column{Name: n + "_file", Strings: v})
	}
	return table
}

func writeSumsAndEpochs(out string, man *Epochs, newSums map[string]string) error {
	sums := map[string]string{}
	if old, err := ReadSums(filepath.Join(out, SumsFile)); err == nil {
		sums = old
	}
	live := map[string]bool{}
	for _, e := range man.Epochs {
		for _, sh := range e.Shards {
			for _, f := range sh.Files {
				live[f] = true
			}
		}
	}
	for f := range sums {
		if !live[f] {
			delete(sums, f)
		}
	}
	for f, h := range newSums {
		sums[f] = h
	}
	var err error
	if sums[ShardsFile], err = HashFile(filepath.Join(out, ShardsFile)); err != nil {
		return err
	}
	js, err := MarshalJSON(man)
	if err != nil {
		return err
	}
	h := sha256.Sum256(js)
	sums[EpochsFile] = hex.EncodeToString(h[:])
	if err := WriteSums(filepath.Join(out, SumsFile), sums); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(out, EpochsFile), js)
}

func nz(v []int64) []int64 {
	if v == nil {
		return []int64{}
	}
	return v
}

// RepairEpochs rewrites shards.parquet and SHA256SUMS from epochs.json
// if they do not agree with it: the three are written one after the other
// (epochs.json last), so a kill between two renames leaves them a step
// apart. The bytes are those an uninterrupted run writes. The caller holds
// out's lock.
func RepairEpochs(out string, man *Epochs) error {
	sums, err := ReadSums(filepath.Join(out, SumsFile))
	if err != nil {
		sums = map[string]string{}
	}
	live := map[string]bool{EpochsFile: true, ShardsFile: true}
	missing := map[string]string{}
	for _, e := range man.Epochs {
		for _, sh := range e.Shards {
			for _, f := range sh.Files {
				live[f] = true
				if sums[f] == "" {
					h, err := HashFile(filepath.Join(out, filepath.FromSlash(f)))
					if err != nil {
						return nil // damage for verify to report, not a half-done commit
					}
					missing[f] = h
				}
			}
		}
	}
	stale := len(missing) > 0
	for f := range sums {
		if !live[f] {
			stale = true
		}
	}
	for _, f := range []string{EpochsFile, ShardsFile} {
		if h, err := HashFile(filepath.Join(out, f)); err != nil || h != sums[f] {
			stale = true
		}
	}
	if !stale {
		return nil
	}
	return WriteEpochs(out, man, missing)
}
