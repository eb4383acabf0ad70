// Commit: the locks a run takes on the epochs directory (its epochs'
// claims, the directory's manifests), the setup under them, an epoch's
// commit, tidying after killed runs, and dropping epochs.

package shuffle

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// claimEpochs takes a non-blocking exclusive flock on a lock file per
// epoch, writes key (the run's options, see optionsKey) into it, and
// returns the func that releases (and removes) them. If key is not empty,
// a live run claiming other epochs with another key is a conflict: two
// runs with different options must not share a directory. The caller
// holds out's directory lock.
func claimEpochs(out string, epochs []int, key string) (func(), error) {
	var held []*os.File
	release := func() {
		for _, f := range held {
			os.Remove(f.Name())
			f.Close()
		}
	}
	if err := scanLocks(out, key); err != nil {
		return nil, err
	}
	for _, e := range epochs {
		p := filepath.Join(out, fmt.Sprintf("%s%04d", manifests.LockPrefix, e))
		f, err := atomicfile.TryLock(p)
		if err != nil {
			release()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: epoch %d is being written by another shuffle into %s (lock %s)", ErrUsage, e, out, p)
			}
			return nil, err
		}
		held = append(held, f)
		if key != "" {
			if err := f.Truncate(0); err == nil {
				_, err = f.WriteAt([]byte(key), 0)
			}
			if err != nil {
				release()
				return nil, err
			}
		}
	}
	return release, nil
}

// scanLocks removes the lock files in out that killed runs left (nobody
// holds them), and, if key is not empty, refuses a live run's claim made
// with another key (see claimEpochs).
func scanLocks(out, key string) error {
	// (Another run probing a lock this way holds it for a moment; a claim
	// retries past that, see lockFile.)
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil
	}
	for _, ent := range entries {
		if !strings.HasPrefix(ent.Name(), manifests.LockPrefix) {
			continue
		}
		p := filepath.Join(out, ent.Name())
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			if atomicfile.SameFile(f, p) {
				os.Remove(p)
			}
			f.Close()
			continue
		}
		// Held by a live run: its options must be ours.
		theirs, _ := io.ReadAll(io.LimitReader(f, 4096))
		f.Close()
		if key != "" && len(theirs) > 0 && string(theirs) != key {
			return fmt.Errorf("%w: another shuffle is writing %s with other options (%s): wait for it, or use another --out",
				ErrConflict, out, keyDiff(string(theirs), key))
		}
	}
	return nil
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
		if err := j.mayReplace(disk); err != nil {
			return nil, nil, err
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

// commit publishes epoch e (index into j.epochs). Under the directory's
// lock, with the manifests as other runs left them: if the epoch is
// listed already (--force, or its files were damaged), the manifests are
// rewritten without it; then its partial folder replaces the final one
// (atomicfile.ReplaceDir), shards.parquet, SHA256SUMS and, last,
// epochs.json are rewritten with it, and the folder it replaced is
// emptied of the files that were shuffle's. A directory that another run has
// meanwhile given other options is not written into (ErrConflict).
func (s *sink) commit(e int) error {
	j := s.j
	st := s.eps[e]
	out := j.o.Out
	final := filepath.Join(out, st.entry.Dir)
	if !j.o.NoFsync {
		if err := syncTree(st.tmp, st.sums); err != nil {
			return err
		}
	}
	unlock, err := atomicfile.LockDir(out, false)
	if err != nil {
		return err
	}
	defer unlock()
	man := j.man
	disk, err := manifests.LoadEpochs(out)
	switch {
	case err == nil && optionsKey(disk) != optionsKey(man):
		return fmt.Errorf("%w: another run committed epochs with other options into %s meanwhile (%s); epoch %d is not committed",
			ErrConflict, out, keyDiff(optionsKey(disk), optionsKey(man)), st.entry.Epoch)
	case err == nil:
		man.Epochs = disk.Epochs // what other runs committed meanwhile
	case errors.Is(err, fs.ErrNotExist):
		// Nothing committed, or the manifest was removed by hand: keep
		// the epochs this run knows of that are still whole.
		kept := man.Epochs[:0]
		for _, x := range man.Epochs {
			if j.whole(x) {
				kept = append(kept, x)
			}
		}
		man.Epochs = kept
	default:
		return err
	}
	var prev *manifests.EpochEntry
	kept := man.Epochs[:0]
	for i, x := range man.Epochs {
		if x.Epoch == st.entry.Epoch {
			prev = &man.Epochs[i]
		} else {
			kept = append(kept, x)
		}
	}
	var listed map[string]bool // the old folder's files, if it is listed
	if prev != nil {
		listed = prev.Listed()
		man.Epochs = kept
		if err := manifests.WriteEpochs(out, man, nil); err != nil {
			return err
		}
	}
	faults.Point("shuffle.commit")
	old, err := atomicfile.ReplaceDir(st.tmp, final)
	if err != nil {
		return err
	}
	st.committed = true
	faults.Point("shuffle.renamed")
	man.Epochs = append(kept, *st.entry)
	sortEpochs(man.Epochs)
	man.Created = j.o.Now().UTC().Format(time.RFC3339)
	if err := manifests.WriteEpochs(out, man, st.sums); err != nil {
		return err
	}
	if old != "" { // the folder the epoch replaced (--force, or damaged)
		return removeEpochFolder(old, listed)
	}
	return nil
}

func sortEpochs(es []manifests.EpochEntry) {
	for i := 1; i < len(es); i++ {
		for k := i; k > 0 && es[k].Epoch < es[k-1].Epoch; k-- {
			es[k], es[k-1] = es[k-1], es[k]
		}
	}
}

// syncTree fsyncs the epoch's files four at a time, then its directories.
func syncTree(tmp string, sums map[string]string) error {
	errs := make(chan error, len(sums))
	sem := make(chan struct{}, 4)
	dirs := map[string]bool{tmp: true}
	for rel := range sums {
		_, rest, _ := strings.Cut(rel, "/") // epoch-NNNN/file
		p := filepath.Join(tmp, filepath.FromSlash(rest))
		dirs[filepath.Dir(p)] = true
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- atomicfile.Sync(p)
		}()
	}
	for range sums {
		if err := <-errs; err != nil {
			return err
		}
	}
	for d := range dirs {
		if err := atomicfile.Sync(d); err != nil {
			return err
		}
	}
	return nil
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
