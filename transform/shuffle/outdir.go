package shuffle

// The epochs directory: which of its files are shuffle's, the locks that
// let runs share it, and the setup a run does under them before it writes
// anything.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/manifests"
)

// ErrConflict marks a run that disagrees with what another run has
// committed, or is committing, into the same epochs directory. It wraps
// ErrUsage (exit 2).
var ErrConflict = fmt.Errorf("%w: conflicting run", ErrUsage)

// optionsKey identifies the options that decide an epochs directory's
// bytes: runs with the same key may share a directory (each with its own
// epochs), runs with different keys may not.
func optionsKey(m *manifests.Epochs) string {
	return fmt.Sprintf("dataset=%s seed=%d window=%d sampling=%s per_clip=%d short=%s shard_samples=%d",
		m.Dataset.SHA256, m.Seed, m.Window, m.Sampling, m.PerClip, m.Short, m.ShardSamples)
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
				d = append(d, "another dataset")
				continue
			}
			d = append(d, fmt.Sprintf("%s %s, this run's %s", strings.ReplaceAll(name, "_", "-"), x, y))
		}
	}
	if len(d) == 0 {
		return theirs
	}
	return strings.Join(d, "; ")
}

// sameOptions reports whether a and b were cut with the same sampling
// options (whatever the dataset).
func sameOptions(a, b *manifests.Epochs) bool {
	return a.Seed == b.Seed && a.Window == b.Window && a.Sampling == b.Sampling && a.PerClip == b.PerClip &&
		a.Short == b.Short && a.ShardSamples == b.ShardSamples
}

var (
	shardRE = regexp.MustCompile(`^shard-[0-9]{5,}\.[A-Za-z0-9_][A-Za-z0-9_.-]*\.npy$`)
	epochRE = regexp.MustCompile(`^epoch-[0-9]{4}$`)
)

// epochFiles lists the files of an epoch folder, relative to the folder,
// and those in it that shuffle does not write (anything but
// shard-NNNNN.NAME.npy files).
func epochFolder(dir string) (own map[string]bool, foreign []string, err error) {
	own = map[string]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
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
			want := int64(npy.DataAlign) + int64(sh.Samples)*24
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
				dt, _, err := array.ParseDescr(m.DType)
				if err != nil {
					return false
				}
				rb, err := array.ByteSize(m.FrameShape, dt.Size)
				if err != nil {
					return false
				}
				want = int64(npy.DataAlign) + int64(sh.Samples)*int64(m.WindowRows)*rb
			}
			st, err := os.Lstat(filepath.Join(j.o.Out, filepath.FromSlash(rel)))
			if err != nil || !st.Mode().IsRegular() || st.Size() != want {
				return false
			}
		}
	}
	return true
}

// setup prepares the epochs directory for writing todo, under its lock:
// it claims the epochs (refusing a live run of other options), takes over
// what other runs committed meanwhile (returning the epochs of todo that
// are now whole, unless --force), replaces stale epochs (removing only
// the files their manifest lists), and removes what killed runs left: the
// partial folders of these epochs and the temporary files of manifest
// writes. release gives the claims back.
func (j *job) setup(todo []int) (release func(), done []int, err error) {
	out := j.o.Out
	unlock, err := atomicfile.LockDir(out, false)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	key := optionsKey(j.man)
	claims, err := claimEpochs(out, todo, key)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			claims()
		}
	}()
	disk, derr := manifests.LoadEpochs(out)
	switch err := derr; {
	case err == nil && optionsKey(disk) == key:
		disk.Tool = j.man.Tool
		j.man = disk
		if !j.o.Force {
			for _, e := range todo {
				if x := disk.Entry(e); x != nil && j.whole(*x) {
					done = append(done, e)
				}
			}
		}
	case err == nil:
		// Another dataset's epochs, or other options' (--force): replaced.
		if !j.stale {
			return nil, nil, fmt.Errorf("%w: another run committed epochs with other options into %s meanwhile (%s)", ErrConflict, out, keyDiff(optionsKey(disk), key))
		}
		if err := checkForeign(out, disk); err != nil {
			return nil, nil, err
		}
		// The manifest goes first: no epochs.json ever lists a removed epoch.
		for _, f := range []string{manifests.EpochsFile, manifests.ShardsFile, manifests.SumsFile} {
			if err := os.Remove(filepath.Join(out, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, nil, err
			}
		}
		if err := atomicfile.Sync(out); err != nil {
			return nil, nil, err
		}
		for _, x := range disk.Epochs {
			if err := removeEpochFolder(filepath.Join(out, x.Dir), x.Listed()); err != nil {
				return nil, nil, err
			}
		}
		j.replaced = len(disk.Epochs)
	case errors.Is(err, fs.ErrNotExist):
		if err := checkForeign(out, nil); err != nil {
			return nil, nil, err
		}
	default:
		return nil, nil, err
	}
	// Nothing is changed if any folder holds what is not ours (a commit
	// would have to remove it to put an epoch there).
	if derr == nil {
		if err := checkForeign(out, disk); err != nil {
			return nil, nil, err
		}
	}
	j.stale = false
	err = nil
	sweepTemp(out)
	if derr == nil {
		if err := manifests.RepairEpochs(out, j.man); err != nil {
			return nil, nil, err
		}
	}
	// Leftovers of a killed run of these epochs (other epochs' partial
	// folders may belong to a run writing them right now).
	for _, e := range todo {
		if err := removeEpochFolder(j.partialDir(e), nil); err != nil {
			return nil, nil, err
		}
	}
	return claims, done, nil
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

// Drop removes epochs [from, to) from the epochs directory out, for
// rolling storage: under the directory lock, with the epochs claimed (an
// epoch a live run is writing is refused), the manifests are rewritten
// without them first, then their files are removed (only the files the
// manifest lists: anything else in their folders stays, and is named).
// Partial folders of those epochs left by killed runs go too. It returns
// the epochs that were listed and are now gone.
func Drop(out string, from, to int) ([]int, error) {
	if from < 0 || to <= from || to > 9999 {
		return nil, fmt.Errorf("%w: --drop %d:%d: want 0 <= A < B <= 9999", ErrUsage, from, to)
	}
	out, err := filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	if _, err := manifests.LoadEpochs(out); err != nil {
		return nil, err
	}
	unlock, err := atomicfile.LockDir(out, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	man, err := manifests.LoadEpochs(out) // as it is now that no run can rewrite it
	if err != nil {
		return nil, err
	}
	var epochs []int
	for e := from; e < to; e++ {
		epochs = append(epochs, e)
	}
	release, err := claimEpochs(out, epochs, "")
	if err != nil {
		return nil, err
	}
	defer release()
	var gone []manifests.EpochEntry
	kept := man.Epochs[:0:0]
	for _, x := range man.Epochs {
		if x.Epoch >= from && x.Epoch < to {
			gone = append(gone, x)
		} else {
			kept = append(kept, x)
		}
	}
	sweepTemp(out)
	if err := manifests.RepairEpochs(out, man); err != nil {
		return nil, err
	}
	// Refused before anything changes if a folder to remove holds what
	// is not ours.
	for _, x := range gone {
		if bad, err := manifests.Unlisted(filepath.Join(out, x.Dir), x.Listed(), nil); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		} else if len(bad) > 0 {
			return nil, fmt.Errorf("%w: %w: epoch %d not dropped (move them elsewhere first)", ErrUsage, manifests.NotOurs(filepath.Join(out, x.Dir), bad), x.Epoch)
		}
	}
	var dropped []int
	if len(gone) > 0 {
		man.Epochs = kept
		if err := manifests.WriteEpochs(out, man, nil); err != nil {
			return nil, err
		}
		for _, x := range gone {
			if err := removeEpochFolder(filepath.Join(out, x.Dir), x.Listed()); err != nil {
				return nil, err
			}
			dropped = append(dropped, x.Epoch)
		}
	}
	for _, e := range epochs {
		if err := removeEpochFolder(filepath.Join(out, ".partial-"+manifests.EpochDir(e)), nil); err != nil {
			return nil, err
		}
		if man.Entry(e) == nil {
			// An unlisted folder (a kill between the rename and the
			// manifest): shard files only, or it stays.
			if err := removeEpochFolder(filepath.Join(out, manifests.EpochDir(e)), nil); err != nil {
				return nil, err
			}
		}
	}
	return dropped, atomicfile.Sync(out)
}

// tidy removes, under out's lock, what killed runs left in an epochs
// directory that needs no new epoch: lock files nobody holds, temporary
// files of manifest writes, and manifests a kill left a step apart.
func (j *job) tidy() error {
	out := j.o.Out
	if _, err := os.Stat(out); err != nil {
		return nil
	}
	unlock, err := atomicfile.LockDir(out, false)
	if err != nil {
		return err
	}
	defer unlock()
	scanLocks(out, "")
	sweepTemp(out)
	if man, err := manifests.LoadEpochs(out); err == nil {
		return manifests.RepairEpochs(out, man)
	}
	return nil
}
