// Out dir: which of an epochs directory's files are shuffle's, which
// options may share it, and the manifest a run starts from.

package shuffle

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/manifests"
)

// ErrConflict marks a run that disagrees with what another run has
// committed, or is committing, into the same epochs directory. It wraps
// ErrUsage (exit 2).
var ErrConflict = fmt.Errorf("%w: conflicting run", ErrUsage)

// optionsKey identifies the options that decide an epochs directory's
// bytes (manifests.Epochs.OptionsKey): runs with the same key may share a
// directory (each with its own epochs), runs with different keys may not.
func optionsKey(m *manifests.Epochs) string { return m.OptionsKey() }

// OptionsKey is optionsKey for other packages (push compares a bucket's
// epochs.json with a folder's by it).
func OptionsKey(m *manifests.Epochs) string { return m.OptionsKey() }

// scheduleWords words a weights token of an options key (MixWeights.Key:
// "N/A:B@name=w,.../...", B 0 when open-ended) as the flags that give it:
// "--weights 0:2@a=1,b=1 --weights 2:@a=1,b=2 --epoch-samples N".
func scheduleWords(key string) string {
	parts := strings.Split(key, "/")
	var words []string
	samples := parts[0]
	if parts[0] == "natural" {
		words = append(words, "no --weights (each source its own samples)")
		samples = parts[len(parts)-1]
		parts = nil
	} else {
		parts = parts[1:]
	}
	for _, r := range parts {
		rng, body, _ := strings.Cut(r, "@")
		if from, ok := strings.CutSuffix(rng, ":0"); ok {
			rng = from + ":"
		}
		words = append(words, "--weights "+rng+"@"+body)
	}
	if samples != "0" {
		words = append(words, "--epoch-samples "+samples)
	}
	return strings.Join(words, " ")
}

// keyDiff words how two options keys differ: "seed 8, this run's 7".
func keyDiff(theirs, ours string) string {
	a, b := strings.Fields(theirs), strings.Fields(ours)
	var d []string
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			name, x, _ := strings.Cut(a[i], "=")
			_, y, _ := strings.Cut(b[i], "=")
			if name == "dataset" {
				d = append(d, "another dataset (or other sources)")
				continue
			}
			if name == "weights" {
				d = append(d, fmt.Sprintf("weights and --epoch-samples: %s; this run's: %s", scheduleWords(x), scheduleWords(y)))
				continue
			}
			d = append(d, fmt.Sprintf("%s %s, this run's %s", strings.ReplaceAll(name, "_", "-"), x, y))
		}
	}
	if len(a) != len(b) {
		d = append(d, "a mix of sources, or one --dataset")
	}
	if len(d) == 0 {
		return theirs
	}
	return strings.Join(d, "; ")
}

// sameOptions reports whether a and b were cut with the same sampling
// options (whatever the dataset).
//
// For a mixed run the sources' names (not their builds) and the weights
// count as options.
func sameOptions(a, b *manifests.Epochs) bool {
	same := a.Seed == b.Seed && a.Window == b.Window && a.Sampling == b.Sampling && a.PerClip == b.PerClip &&
		a.Short == b.Short && a.ShardSamples == b.ShardSamples && a.Version == b.Version
	if !same || a.Version != manifests.EpochsVersionMix {
		return same
	}
	return slices.Equal(a.SourceNames(), b.SourceNames()) && a.Mix.Key() == b.Mix.Key()
}

// openManifest loads o.Out's epochs.json if it describes the same dataset
// and options (then its epochs are kept), or starts a new one. It changes
// nothing on disk: a manifest of other options is refused without
// --force, one of another dataset (or any, with --force) is noted in
// j.stale and replaced by setup, under the directory lock; a directory
// that holds what shuffle did not write is refused.
func openManifest(j *job) (*manifests.Epochs, error) {
	o := j.o
	fresh := &manifests.Epochs{
		Format: manifests.EpochsFormat, Version: manifests.EpochsVersion,
		Seed: o.Seed, Window: o.Sampling.Window, Sampling: o.Sampling.Mode, PerClip: o.Sampling.PerClip,
		Short: o.Sampling.Short, ShardSamples: o.ShardSize,
		Files: manifests.EpochFiles{Shards: manifests.ShardsFile, Sums: manifests.SumsFile},
		Tool:  o.Tool,
	}
	if j.mixed {
		fresh.Version = manifests.EpochsVersionMix
		for _, src := range j.srcs {
			fresh.Sources = append(fresh.Sources, manifests.SourceRef{Name: src.name, Dir: src.dir, Fingerprint: src.ds.Fingerprint, SHA256: src.sha, Clips: src.ds.Clips})
		}
		mix := o.Mix
		fresh.Mix = &mix
	} else {
		src := j.srcs[0]
		fresh.Dataset = manifests.DatasetRef{Dir: src.dir, Fingerprint: src.ds.Fingerprint, SHA256: src.sha, Clips: src.ds.Clips}
	}
	if o.Sampling.Mode != "random" {
		fresh.PerClip = 0
	}
	for _, m := range j.mods {
		fresh.Modalities = append(fresh.Modalities, manifests.EpochModality{Name: m.name, DType: m.dtype.Descr(), Rate: int(m.rate),
			FrameShape: m.frameShape, WindowRows: o.Sampling.Window * int(m.rate), PerClip: m.perClip, Labels: m.labels})
	}
	if st, err := os.Stat(o.Out); err == nil && !st.IsDir() {
		return nil, fmt.Errorf("%w: --out %s exists and is not a directory", ErrUsage, o.Out)
	}
	old, err := manifests.LoadEpochs(o.Out)
	if err != nil {
		if _, serr := os.Lstat(filepath.Join(o.Out, manifests.EpochsFile)); serr == nil {
			return nil, fmt.Errorf("%w: --out %s is not a clipshard epochs directory (%v): refusing to write into it", ErrUsage, o.Out, err)
		}
		if err := checkForeign(o.Out, nil); err != nil {
			return nil, err
		}
		return fresh, nil // Run makes o.Out once the run is known to fit
	}
	switch {
	case optionsKey(old) == optionsKey(fresh):
		old.Tool = fresh.Tool
		return old, nil
	case !sameOptions(old, fresh) && !o.Force:
		return nil, fmt.Errorf("%w: %s holds epochs cut with other options (%s); use --force to replace them, or another --out", ErrUsage, o.Out, keyDiff(optionsKey(old), optionsKey(fresh)))
	}
	// The dataset was rebuilt since (or --force): the old epochs are stale.
	if err := j.mayReplace(old); err != nil {
		return nil, err
	}
	if err := checkForeign(o.Out, old); err != nil {
		return nil, err
	}
	j.stale = true
	return fresh, nil
}

// mayReplace refuses to replace the epochs of old (another dataset's)
// unless this run names every one of them (its epoch range covers them)
// or --force says to: a run removes only what its command line names, so
// that a trainer reading an epoch of the older dataset keeps its files.
func (j *job) mayReplace(old *manifests.Epochs) error {
	if j.o.Force {
		return nil
	}
	var outside []int
	for _, x := range old.Epochs {
		if x.Epoch < j.o.EpochStart || x.Epoch >= j.o.EpochEnd {
			outside = append(outside, x.Epoch)
		}
	}
	if len(outside) == 0 {
		return nil
	}
	slices.Sort(outside)
	return fmt.Errorf("%w: %s holds epochs %s cut from another build of the dataset (its dataset.json sha256 differs), which this run (epochs %d:%d) was not asked to touch: refusing to remove them; use --force to replace them all, `shuffle --out %s --drop A:B` them first, or another --out",
		ErrUsage, j.o.Out, epochList(outside), j.o.EpochStart, j.o.EpochEnd, j.o.Out)
}

// epochList words a sorted list of epochs compactly: "0-2, 5".
func epochList(es []int) string {
	var parts []string
	for i := 0; i < len(es); {
		k := i
		for k+1 < len(es) && es[k+1] == es[k]+1 {
			k++
		}
		if k == i {
			parts = append(parts, fmt.Sprint(es[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", es[i], es[k]))
		}
		i = k + 1
	}
	return strings.Join(parts, ", ")
}

// checkForeign refuses an epochs directory holding files shuffle did not
// write (see foreignFiles), naming them.
func checkForeign(out string, man *manifests.Epochs) error {
	foreign, err := foreignFiles(out, man)
	if err != nil {
		return err
	}
	if len(foreign) > 0 {
		return fmt.Errorf("%w: --out %w: refusing to write into it or replace it (move them elsewhere, or choose another --out)", ErrUsage, manifests.NotOurs(out, foreign))
	}
	return nil
}

func isPartial(name string) bool { return len(name) > 9 && name[:9] == ".partial-" }

var (
	shardRE = regexp.MustCompile(`^shard-[0-9]{5,}\.[A-Za-z0-9_][A-Za-z0-9_.-]*\.npy$`)
	epochRE = regexp.MustCompile(`^epoch-[0-9]{4}$`)
)

// epochFolder lists the files of an epoch folder, relative to the folder,
// and those in it that shuffle does not write (anything but
// shard-NNNNN.NAME.npy files).
func epochFolder(dir string) (own map[string]bool, foreign []string, err error) {
	own = map[string]bool{}
	err = manifests.WalkRel(dir, func(rel string, d fs.DirEntry) error {
		switch {
		case d.Type().IsRegular() && !strings.Contains(rel, "/") && shardRE.MatchString(rel):
			own[rel] = true
		default:
			if d.IsDir() {
				foreign = append(foreign, rel+"/")
				return fs.SkipDir
			}
			foreign = append(foreign, rel)
		}
		return nil
	})
	return own, foreign, err
}

// foreignFiles returns what in the epochs directory out shuffle did not
// write: files other than the manifests, lock and temporary files, and
// epoch folders (committed or partial) holding anything but shard files;
// an epoch folder listed in man must hold only the files man lists.
func foreignFiles(out string, man *manifests.Epochs) ([]string, error) {
	entries, err := os.ReadDir(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	listed := map[string]map[string]bool{}
	if man != nil {
		for _, e := range man.Epochs {
			listed[e.Dir] = e.Listed()
		}
	}
	var foreign []string
	for _, ent := range entries {
		name := ent.Name()
		p := filepath.Join(out, name)
		switch {
		case ent.Type().IsRegular() && (name == manifests.EpochsFile || name == manifests.ShardsFile || name == manifests.SumsFile ||
			strings.HasPrefix(name, manifests.LockPrefix) || strings.HasPrefix(name, atomicfile.TempPrefix)):
		case ent.IsDir() && strings.HasPrefix(name, ".work-"):
			// pile folders of earlier versions
		case ent.IsDir() && (epochRE.MatchString(name) || isPartial(name) && epochRE.MatchString(name[len(".partial-"):])):
			var bad []string
			if l := listed[name]; l != nil {
				bad, err = manifests.Unlisted(p, l, nil)
			} else {
				_, bad, err = epochFolder(p)
			}
			if errors.Is(err, fs.ErrNotExist) {
				// Renamed or emptied by a concurrent run's commit while it
				// was listed (the check before the lock; setup checks
				// again under it): what is gone is nobody's files.
				continue
			}
			if err != nil {
				return nil, err
			}
			for _, b := range bad {
				foreign = append(foreign, name+"/"+b)
			}
		default:
			if ent.IsDir() {
				name += "/"
			}
			foreign = append(foreign, name)
		}
	}
	return foreign, nil
}

// removeEpochFolder removes an epoch folder (committed or partial) of
// out: the files listed for it (listed may be nil: then the shard files
// it holds), and the folders left empty. Anything else in it stays, and
// is named in the error.
func removeEpochFolder(dir string, listed map[string]bool) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	own, foreign, err := epochFolder(dir)
	if err != nil {
		return err
	}
	if listed != nil {
		for f := range listed {
			own[f] = true
		}
	}
	if len(foreign) > 0 {
		return fmt.Errorf("%w: %w: not removed", ErrUsage, manifests.NotOurs(dir, foreign))
	}
	return manifests.RemoveListed(dir, own)
}

// sweepTemp removes the temporary files of manifest writes that a killed
// run left in out. The caller holds out's directory lock, so no run is
// writing a manifest.
func sweepTemp(out string) {
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), atomicfile.TempPrefix) && e.Type().IsRegular() {
			os.Remove(filepath.Join(out, e.Name()))
		}
	}
}
