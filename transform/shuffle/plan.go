// Plan: the job from the options and the dataset (checked against its
// blobs), the epochs to write, their samples, and what they will take in
// memory and on disk.

package shuffle

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/manifests"
)

type epochPlan struct {
	epoch   int
	samples []manifests.Sample // shuffled; global clip numbers
	base    int64              // global position of the first sample
	counts  []int64            // samples per source (a mixed run)
	weights []json.Number      // the epoch's weights, as recorded (natural: the sources' own counts)
}

type job struct {
	o       Options
	srcs    []srcInfo
	runs    []runInfo // the sources' clips in runs the readers cut from
	mixed   bool      // several sources (or --source): epochs format version 3
	starts  []int64   // per global clip, its first global frame
	lengths []int64
	mods    []modInfo
	rec     int64  // bytes of one sample across modalities
	zeros   []byte // the largest window's worth of zeros (read only)
	epochs  []epochPlan
	total   int64 // samples to write
	man     *manifests.Epochs
	// stale: the epochs in Out are of another dataset or (with --force)
	// other options, and are replaced (setup); replaced counts them.
	stale    bool
	replaced int
	ext      bool // the external (two-pass) path
}

func newJob(o Options) (*job, error) {
	mixed := len(o.Sources) > 0
	switch {
	case o.Out == "":
		return nil, fmt.Errorf("%w: --out is required", ErrUsage)
	case mixed && o.Dataset != "":
		return nil, fmt.Errorf("%w: give --dataset DIR or --source NAME=DIR ..., not both", ErrUsage)
	case !mixed && o.Dataset == "":
		return nil, fmt.Errorf("%w: --dataset DIR (or --source NAME=DIR ...) is required", ErrUsage)
	case mixed && o.Version != 0:
		return nil, fmt.Errorf("%w: --version N cuts epochs from one --dataset's kept version, not from --source datasets", ErrUsage)
	case o.Version < 0:
		return nil, fmt.Errorf("%w: --version %d: want a version number (1 or more; 0: the current one)", ErrUsage, o.Version)
	case !mixed && (len(o.Mix.Ranges) > 0 || o.Mix.EpochSamples != 0):
		return nil, fmt.Errorf("%w: --weights and --epoch-samples mix --source datasets; with one --dataset, give it as --source NAME=DIR", ErrUsage)
	}
	if err := o.Sampling.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if o.EpochEnd <= o.EpochStart || o.EpochStart < 0 || o.EpochEnd > 9999 {
		return nil, fmt.Errorf("%w: epochs [%d, %d): want 0 <= A < B <= 9999", ErrUsage, o.EpochStart, o.EpochEnd)
	}
	if o.ShardSize == 0 {
		o.ShardSize = 1024
	}
	if o.Mem == 0 {
		o.Mem = 2 << 30
	}
	if o.ShardSize < 1 || o.Mem < 64<<10 {
		return nil, fmt.Errorf("%w: --shard-samples %d, --mem %d: want >= 1, >= 64KiB", ErrUsage, o.ShardSize, o.Mem)
	}
	if o.Workers < 0 || o.Workers > 256 {
		return nil, fmt.Errorf("%w: --workers %d: want 1..256 (0: the CPUs)", ErrUsage, o.Workers)
	}
	if o.Mix.EpochSamples < 0 {
		return nil, fmt.Errorf("%w: --epoch-samples %d: want >= 1 (0: the sources' own counts)", ErrUsage, o.Mix.EpochSamples)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var err error
	if o.Out, err = filepath.Abs(o.Out); err != nil {
		return nil, err
	}
	list := o.Sources
	if !mixed {
		list = []Source{{Dir: o.Dataset}}
	}
	seen := map[string]bool{}
	j := &job{o: o, mixed: mixed}
	for _, src := range list {
		if mixed {
			if err := manifests.CheckSourceName(src.Name); err != nil {
				return nil, fmt.Errorf("%w: --source %s=%s: %w", ErrUsage, src.Name, src.Dir, err)
			}
			if seen[src.Name] {
				return nil, fmt.Errorf("%w: --source %s is given twice", ErrUsage, src.Name)
			}
			seen[src.Name] = true
		}
		dir, err := filepath.Abs(src.Dir)
		if err != nil {
			return nil, err
		}
		if !mixed {
			j.o.Dataset = dir
		}
		if err := j.addSource(src.Name, dir); err != nil {
			return nil, err
		}
	}
	if mixed {
		if err := j.o.Mix.CheckRanges(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		names := j.sourceNames()
		for e := o.EpochStart; e < o.EpochEnd; e++ {
			if _, ok := j.o.Mix.At(e, names); !ok {
				return nil, fmt.Errorf("%w: epoch %d has no weights: no --weights range holds it", ErrUsage, e)
			}
		}
	}
	for _, m := range j.mods {
		j.rec += m.winBytes
		if int64(len(j.zeros)) < m.winBytes {
			j.zeros = make([]byte, m.winBytes)
		}
	}
	if j.man, err = openManifest(j); err != nil {
		return nil, err
	}
	return j, nil
}

// toDo splits the requested epochs into those to write and those already
// whole in the manifest (skipped, unless --force). An epoch the manifest
// lists whose files are gone or cut short is written again.
func (j *job) toDo() (todo, skipped []int) {
	for e := j.o.EpochStart; e < j.o.EpochEnd; e++ {
		if x := j.man.Entry(e); x != nil && !j.o.Force && !j.stale && j.whole(*x) {
			skipped = append(skipped, e)
			continue
		}
		todo = append(todo, e)
	}
	return todo, skipped
}

// whole reports whether every file of epoch entry x is in the epochs
// directory, a regular file of the size its shape makes (a folder removed
// by hand, or a file cut short, makes the epoch one to write again).
func (j *job) whole(x manifests.EpochEntry) bool {
	for _, sh := range x.Shards {
		for what, rel := range sh.Files {
			want := int64(npy.DataAlign) + int64(sh.Samples)*j.sampleRec()
			if what != "samples" {
				var m *manifests.EpochModality
				for i := range j.man.Modalities {
					if j.man.Modalities[i].Name == what {
						m = &j.man.Modalities[i]
					}
				}
				if m == nil {
					return false
				}
				sb, err := m.SampleBytes()
				if err != nil {
					return false
				}
				want = int64(npy.DataAlign) + int64(sh.Samples)*sb
			}
			st, err := os.Lstat(filepath.Join(j.o.Out, filepath.FromSlash(rel)))
			if err != nil || !st.Mode().IsRegular() || st.Size() != want {
				return false
			}
		}
	}
	return true
}

// shortClips is the number of clips (of every source) shorter than the
// window.
func (j *job) shortClips() int {
	n := 0
	for _, l := range j.lengths {
		if l < int64(j.o.Sampling.Window) {
			n++
		}
	}
	return n
}

// emptyErr words the refusal of an epoch that would have no samples,
// saying which option to change.
func (j *job) emptyErr(e int) error {
	var longest int64
	for _, l := range j.lengths {
		longest = max(longest, l)
	}
	hint := "lower --window"
	if j.o.Sampling.Short != "pad" {
		hint += " or use --short pad"
	}
	return fmt.Errorf("%w: epoch %d would have no samples: every clip is shorter than --window %d (the longest has %d frames); %s (--allow-empty writes empty epochs)",
		ErrEmpty, e, j.o.Sampling.Window, longest, hint)
}

// ErrEmpty marks a run that would write an epoch without samples.
var ErrEmpty = errors.New("shuffle: nothing to write")

// plan derives the samples of every epoch to write.
func (j *job) plan(epochs []int) {
	j.epochs = nil
	var base int64
	for _, e := range epochs {
		ep := epochPlan{epoch: e, base: base}
		if j.mixed {
			w, _ := j.o.Mix.At(e, j.sourceNames())
			m := manifests.MixEpoch(j.mixSources(), j.o.Sampling, j.o.Seed, e, w, j.o.Mix.EpochSamples)
			ep.samples, ep.counts, ep.weights = m.Samples, m.Counts, m.Weights
		} else {
			ep.samples = manifests.Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		}
		base += int64(len(ep.samples))
		j.epochs = append(j.epochs, ep)
	}
	j.total = base
}

// epochMix is the weights and counts per source that a mixed epoch's
// entry records.
func (j *job) epochMix(ep *epochPlan) (map[string]json.Number, map[string]int64) {
	w, c := map[string]json.Number{}, map[string]int64{}
	for s, src := range j.srcs {
		c[src.name], w[src.name] = ep.counts[s], ep.weights[s]
	}
	return w, c
}

// mixSources is the sources' clip lengths.
func (j *job) mixSources() []manifests.MixSource {
	out := make([]manifests.MixSource, len(j.srcs))
	for s, src := range j.srcs {
		out[s].Lengths = j.lengths[src.clip0 : src.clip0+src.ds.Clips]
	}
	return out
}

// count returns the samples epoch e will have (without making the list),
// or refuses a mixed epoch in which a source with a share has no samples.
func (j *job) count(e int) (int64, error) {
	if j.o.Mix.EpochSamples > MaxEpochSamples {
		return 0, fmt.Errorf("%w: --epoch-samples %d: at most %d (2^40) samples an epoch", ErrUsage, j.o.Mix.EpochSamples, int64(MaxEpochSamples))
	}
	if !j.mixed {
		n := manifests.CountSamples(j.lengths, j.o.Sampling, j.o.Seed, e)
		if n > MaxEpochSamples || n < 0 {
			return 0, fmt.Errorf("%w: epoch %d would have %d samples: at most %d (2^40) an epoch (a smaller --per-clip)", ErrUsage, e, n, int64(MaxEpochSamples))
		}
		return n, nil
	}
	natural := manifests.MixNatural(j.mixSources(), j.o.Sampling, j.o.Seed, e)
	n := j.o.Mix.EpochSamples
	if n == 0 {
		for _, c := range natural {
			n += c
		}
	}
	w, _ := j.o.Mix.At(e, j.sourceNames())
	for s, c := range manifests.MixCounts(natural, w, n) {
		if c > 0 && natural[s] == 0 {
			return 0, fmt.Errorf("%w: epoch %d: %s is to give %d of the epoch's %d samples, but has none (every clip shorter than --window %d, or no clips); give it weight 0 there, or lower --window",
				ErrUsage, e, j.srcWords(s), c, n, j.o.Sampling.Window)
		}
	}
	return n, nil
}

// position maps a global output position to its epoch plan and index.
func (j *job) position(pos int64) (*epochPlan, int) {
	i := sort.Search(len(j.epochs), func(i int) bool { return j.epochs[i].base > pos }) - 1
	ep := &j.epochs[i]
	return ep, int(pos - ep.base)
}

// epochMeta is the memory that planning an epoch of n samples takes: its
// samples and the entries of its shards (in the plan and the manifest).
func (j *job) epochMeta(n int64) int64 {
	shards := 1 + n/int64(j.o.ShardSize)
	meta := satAdd(satMul(n, sampleMeta), satMul(shards, int64(shardMeta+64*len(j.mods))))
	if j.mixed {
		meta = satAdd(meta, satMul(n, 24)) // the sources' own lists, before they are merged
	}
	return meta
}
