// The epochs directory's manifests (shuffle --out EDIR): epochs.json,
// shards.parquet and SHA256SUMS, and the names of its files and locks
// (docs/FORMAT.md).

package manifests

import (
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
	// Labels is a label modality's vocabulary, copied from the dataset:
	// a sample's int32 code c stands for Labels[c].
	Labels []string `json:"labels,omitempty"`
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
