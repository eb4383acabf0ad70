// The epochs directory's manifests (shuffle --out EDIR): epochs.json,
// shards.parquet and SHA256SUMS, and the names of its files and locks
// (docs/FORMAT.md).

package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/regfile"
)

// EpochsFormat is the value of epochs.json's "format" key, and
// EpochsVersion its "version": 2 since an epoch is one global order that
// any world size reads (version 1 had a folder per rank); 3
// (EpochsVersionMix) for epochs mixed from several sources, whose samples
// files have a fourth column, the source. A --dataset run still writes
// version 2.
const (
	EpochsFormat     = "clipshard.epochs"
	EpochsVersion    = 2
	EpochsVersionMix = 3
)

// Names of the files in an epochs directory.
const (
	EpochsFile = "epochs.json"
	ShardsFile = "shards.parquet"
)

// Epochs is epochs.json.
type Epochs struct {
	Format       string          `json:"format"`
	Version      int             `json:"version"`
	Dataset      DatasetRef      `json:"dataset,omitzero"`  // version 2
	Sources      []SourceRef     `json:"sources,omitempty"` // version 3, in the order of the samples' source column
	Mix          *MixWeights     `json:"mix,omitempty"`     // version 3
	Seed         uint64          `json:"seed"`
	Window       int             `json:"window"`
	Sampling     string          `json:"sampling"`
	PerClip      int             `json:"per_clip"`
	Short        string          `json:"short"`
	ShardSamples int             `json:"shard_samples"`
	Modalities   []EpochModality `json:"modalities"`
	Epochs       []EpochEntry    `json:"epochs"`
	Files        EpochFiles      `json:"files"`
	Created      string          `json:"created"`
	Tool         string          `json:"tool"`
}

// DatasetRef names the dataset the shards were cut from. Dir is where it
// was (absolute: it lies outside the epochs directory).
type DatasetRef struct {
	Dir         string `json:"dir"`
	Fingerprint string `json:"fingerprint"`
	SHA256      string `json:"manifest_sha256"` // of its dataset.json
	// Clips is the dataset's clip count: a sample's clip is below it.
	// Folders written before it was recorded (0) leave it out.
	Clips int64 `json:"clips,omitempty"`
}

// SourceRef is one source of a mixed run (version 3): its name, and the
// dataset it is, as DatasetRef, with its clip count.
type SourceRef struct {
	Name        string `json:"name"`
	Dir         string `json:"dir"`
	Fingerprint string `json:"fingerprint"`
	SHA256      string `json:"manifest_sha256"`
	Clips       int64  `json:"clips"`
}

// SampleCols is the int64 columns of a samples file: clip, start, valid
// (version 2), and source (version 3).
func (m *Epochs) SampleCols() int {
	if m.Version == EpochsVersionMix {
		return 4
	}
	return 3
}

// SourceNames lists the sources' names (version 3), in order.
func (m *Epochs) SourceNames() []string {
	var out []string
	for _, s := range m.Sources {
		out = append(out, s.Name)
	}
	return out
}

// CheckSourceName refuses a source name that would not survive a file
// name, a flag or a JSON key unchanged.
func CheckSourceName(n string) error {
	if n == "" || len(n) > 64 {
		return fmt.Errorf("source name %q: want 1 to 64 characters", n)
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("source name %q: want letters, digits, _ - . only", n)
		}
	}
	return nil
}

// EpochModality describes the shard files of one modality.
type EpochModality struct {
	Name       string `json:"name"`
	DType      string `json:"dtype"`
	Rate       int    `json:"rate"`
	FrameShape []int  `json:"frame_shape"`
	WindowRows int    `json:"window_rows"` // W * rate (0 for a per-clip modality)
	// PerClip marks a per-clip modality of the dataset: a sample holds its
	// clip's row, shape FrameShape, rather than a window.
	PerClip bool `json:"per_clip,omitempty"`
}

// SampleShape is the shape of one sample's value in a shard file:
// [WindowRows, *FrameShape], or FrameShape for a per-clip modality.
func (m *EpochModality) SampleShape() []int {
	if m.PerClip {
		return append([]int{}, m.FrameShape...)
	}
	return append([]int{m.WindowRows}, m.FrameShape...)
}

// SampleBytes is the bytes one sample takes in a shard file, or an error
// for a dtype or shape that makes no sense.
func (m *EpochModality) SampleBytes() (int64, error) {
	dt, _, err := array.ParseDescr(m.DType)
	if err != nil {
		return 0, err
	}
	return array.ByteSize(m.SampleShape(), dt.Size)
}

// EpochFiles names the other manifests.
type EpochFiles struct {
	Shards string `json:"shards"`
	Sums   string `json:"sha256sums"`
}

// EpochEntry is one committed epoch.
type EpochEntry struct {
	Epoch   int          `json:"epoch"`
	Dir     string       `json:"dir"`
	Samples int64        `json:"samples"` // over all ranks
	Shards  []ShardEntry `json:"shards"`
	// Version 3: the epoch's weight per source (natural: its own sample
	// count) and the samples each source gave (adding up to Samples).
	Weights map[string]json.Number `json:"weights,omitempty"`
	Counts  map[string]int64       `json:"counts,omitempty"`
}

// ShardEntry is one shard file group.
type ShardEntry struct {
	Shard   int               `json:"shard"`
	First   int64             `json:"first"` // index of its first sample in the epoch
	Samples int               `json:"samples"`
	Files   map[string]string `json:"files"` // modality name (and "samples") -> path
}

// Entry returns epoch e's entry, or nil.
func (m *Epochs) Entry(e int) *EpochEntry {
	for i := range m.Epochs {
		if m.Epochs[i].Epoch == e {
			return &m.Epochs[i]
		}
	}
	return nil
}

// Listed returns the files of epoch entry e, relative to its folder.
func (e EpochEntry) Listed() map[string]bool {
	l := map[string]bool{}
	for _, s := range e.Shards {
		for _, f := range s.Files {
			l[strings.TrimPrefix(f, e.Dir+"/")] = true
		}
	}
	return l
}

// LoadEpochs reads and checks EDIR/epochs.json (every path relative and
// inside EDIR).
func LoadEpochs(dir string) (*Epochs, error) {
	p := filepath.Join(dir, EpochsFile)
	b, err := regfile.ReadFile(p, MaxManifest)
	if err != nil {
		if _, serr := os.Lstat(filepath.Join(dir, DatasetFile)); errors.Is(err, fs.ErrNotExist) && serr == nil {
			return nil, fmt.Errorf("%w: %s is a dataset (it holds %s), not an epochs folder (no %s): cut epochs from it with clipshard shuffle --dataset %s --out EDIR --window W --epochs N",
				ErrWrongKind, dir, DatasetFile, EpochsFile, dir)
		}
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	return ParseEpochs(b, p)
}

// ParseEpochs parses and checks the bytes of an epochs.json read from
// elsewhere (a bucket), named p in errors, as LoadEpochs does a folder's.
func ParseEpochs(b []byte, p string) (*Epochs, error) {
	if len(b) > MaxManifest {
		return nil, fmt.Errorf("%w: %s: %d bytes, more than a manifest may have (%d)", ErrManifest, p, len(b), MaxManifest)
	}
	var m Epochs
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, p, err)
	}
	if m.Format == EpochsFormat && m.Version == 1 {
		return nil, fmt.Errorf("%w: %s: epochs of format version 1 (a folder per rank, cut for one world size); this clipshard reads version %d (one order per epoch that any world size reads): remove the folder, or choose another --out, and run shuffle again",
			ErrManifest, p, EpochsVersion)
	}
	if m.Format != EpochsFormat || (m.Version != EpochsVersion && m.Version != EpochsVersionMix) {
		return nil, fmt.Errorf("%w: %s: format %q version %d, want %q version %d or %d", ErrManifest, p, m.Format, m.Version, EpochsFormat, EpochsVersion, EpochsVersionMix)
	}
	if err := m.checkSources(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, p, err)
	}
	if err := checkWeightTypes(b); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, p, err)
	}
	paths := []string{m.Files.Shards, m.Files.Sums}
	for _, e := range m.Epochs {
		paths = append(paths, e.Dir)
		for _, s := range e.Shards {
			for _, f := range s.Files {
				paths = append(paths, f)
			}
		}
	}
	for _, f := range paths {
		if err := CheckRelPath(f); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	return &m, nil
}

// checkWeightTypes refuses a weight that is not a JSON number (json.Number
// would take the string "1" as the number 1): the weights of mix.weights
// and of each epoch.
func checkWeightTypes(b []byte) error {
	type ws = map[string]json.RawMessage
	var raw struct {
		Mix *struct {
			Ranges []struct {
				Weights ws `json:"weights"`
			} `json:"weights"`
		} `json:"mix"`
		Epochs []struct {
			Epoch   json.RawMessage `json:"epoch"`
			Weights ws              `json:"weights"`
		} `json:"epochs"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	check := func(where string, w ws) error {
		for n, v := range w {
			if len(v) == 0 || v[0] == '"' {
				return fmt.Errorf("%s: the weight of %s is %s, not a JSON number", where, n, v)
			}
		}
		return nil
	}
	if raw.Mix != nil {
		for i, r := range raw.Mix.Ranges {
			if err := check(fmt.Sprintf("mix.weights[%d]", i), r.Weights); err != nil {
				return err
			}
		}
	}
	for _, e := range raw.Epochs {
		if err := check("epoch "+string(e.Epoch), e.Weights); err != nil {
			return err
		}
	}
	return nil
}

// ClipCounts is the clip count of each source, in the order of the
// samples' source column (one for version 2; 0 where it was not
// recorded): a sample's clip must be below its source's.
func (m *Epochs) ClipCounts() []int64 {
	if m.Version != EpochsVersionMix {
		return []int64{m.Dataset.Clips}
	}
	out := make([]int64, len(m.Sources))
	for i, s := range m.Sources {
		out[i] = s.Clips
	}
	return out
}

// CheckSamples checks the rows of a samples file (int64, SampleCols()
// columns, row-major, rows of them) against what epochs.json says: each
// clip below its source's clip count (where recorded), its start >= 0,
// its valid frames 1..window (exactly the window unless short is "pad"),
// its source one of the sources. The error names the row and the column.
func (m *Epochs) CheckSamples(rows int, field func(i, c int) int64) error {
	cols, clips := m.SampleCols(), m.ClipCounts()
	for i := 0; i < rows; i++ {
		src := int64(0)
		if cols == 4 {
			if src = field(i, 3); src < 0 || src >= int64(len(clips)) {
				return fmt.Errorf("sample %d: source %d; epochs.json lists %d sources", i, src, len(clips))
			}
		}
		if c := field(i, 0); c < 0 || (clips[src] > 0 && c >= clips[src]) {
			return fmt.Errorf("sample %d: clip %d; its source has %d clips", i, c, clips[src])
		}
		if st := field(i, 1); st < 0 || st > 1<<48 {
			return fmt.Errorf("sample %d: start %d", i, st)
		}
		if v := field(i, 2); v < 1 || v > int64(m.Window) || (m.Short != "pad" && v != int64(m.Window)) {
			return fmt.Errorf("sample %d: valid %d frames; the window is %d (short %q)", i, v, m.Window, m.Short)
		}
	}
	return nil
}

// checkSources checks a version 3 manifest's sources and per-epoch
// counts (and that version 2 has none).
func (m *Epochs) checkSources() error {
	if m.Version == EpochsVersion {
		if m.Dataset.Clips < 0 {
			return fmt.Errorf("dataset: %d clips", m.Dataset.Clips)
		}
		if len(m.Sources) > 0 || m.Mix != nil {
			return fmt.Errorf("version 2 with sources (mixed epochs are version 3)")
		}
		return nil
	}
	if len(m.Sources) == 0 || m.Mix == nil || m.Dataset != (DatasetRef{}) {
		return fmt.Errorf("version 3 needs sources and mix, and no dataset")
	}
	seen := map[string]bool{}
	for _, s := range m.Sources {
		if err := CheckSourceName(s.Name); err != nil {
			return err
		}
		if seen[s.Name] {
			return fmt.Errorf("source %s is listed twice", s.Name)
		}
		if s.Clips < 0 {
			return fmt.Errorf("source %s: %d clips", s.Name, s.Clips)
		}
		seen[s.Name] = true
	}
	for _, e := range m.Epochs {
		var sum int64
		for n, c := range e.Counts {
			if !seen[n] || c < 0 {
				return fmt.Errorf("epoch %d: counts name %q (%d): not a source", e.Epoch, n, c)
			}
			sum += c
		}
		if len(e.Counts) != len(m.Sources) || sum != e.Samples {
			return fmt.Errorf("epoch %d: the counts per source add up to %d over %d sources, the epoch has %d samples and %d sources", e.Epoch, sum, len(e.Counts), e.Samples, len(m.Sources))
		}
		if len(e.Weights) != len(m.Sources) {
			return fmt.Errorf("epoch %d: %d weights for %d sources", e.Epoch, len(e.Weights), len(m.Sources))
		}
		for n, w := range e.Weights {
			if !seen[n] {
				return fmt.Errorf("epoch %d: a weight for %q, not a source", e.Epoch, n)
			}
			if err := CheckWeight(w); err != nil {
				return fmt.Errorf("epoch %d: weight %s=%.80s: %w", e.Epoch, n, w, err)
			}
		}
	}
	for i, r := range m.Mix.Ranges {
		if r.From < 0 || (r.To != 0 && r.To <= r.From) {
			return fmt.Errorf("mix.weights[%d]: epochs %d:%d", i, r.From, r.To)
		}
		if len(r.Weights) != len(m.Sources) {
			return fmt.Errorf("mix.weights[%d]: %d weights for %d sources", i, len(r.Weights), len(m.Sources))
		}
		for n, w := range r.Weights {
			if !seen[n] {
				return fmt.Errorf("mix.weights[%d]: a weight for %q, not a source", i, n)
			}
			if err := CheckWeight(w); err != nil {
				return fmt.Errorf("mix.weights[%d]: weight %s=%.80s: %w", i, n, w, err)
			}
		}
	}
	if err := m.Mix.CheckRanges(); err != nil {
		return err
	}
	if m.Mix.EpochSamples < 0 || m.Mix.EpochSamples > 1<<40 {
		return fmt.Errorf("mix.epoch_samples %d: want 0..2^40", m.Mix.EpochSamples)
	}
	return nil
}

// LockPrefix starts the names of the per-epoch lock files in an epochs
// directory; they exist only while a run writes those epochs (or after it
// was killed) and are not part of the output.
const LockPrefix = ".lock-epoch-"

// LockName names the claim lock file of epoch e (see docs/FORMAT.md).
func LockName(e int) string { return fmt.Sprintf("%s%04d", LockPrefix, e) }

// EpochDir names the folder of epoch e.
func EpochDir(e int) string { return fmt.Sprintf("epoch-%04d", e) }

// ShardName names file what ("samples" or a modality) of shard number shard.
func ShardName(shard int, what string) string {
	return fmt.Sprintf("shard-%05d.%s.npy", shard, what)
}

// EpochInProgress reports whether a live run holds epoch e's claim in the
// epochs directory dir.
func EpochInProgress(dir string, e int) bool {
	return atomicfile.Held(filepath.Join(dir, LockName(e)))
}

// ShardsTable is the bytes of the shards.parquet of man (as WriteEpochs
// writes it).
func ShardsTable(man *Epochs) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "clipshard-shards-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := writeShardsTable(filepath.Join(tmp, ShardsFile), man); err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(tmp, ShardsFile))
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
	return WriteTable(path, table)
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
