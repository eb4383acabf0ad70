// Keep: dropping the older versions of a dataset in segments (convert
// --keep N): their manifests, and the blobs no kept version reads.

package convert

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// dropPrefix names a version folder being dropped: versions/N is renamed
// to versions/<dropPrefix>N first (the version is gone from the list in
// one step), then the files only it listed are removed, then the folder.
const dropPrefix = manifests.DropPrefix

// Dropped is what Keep removed.
type Dropped struct {
	Versions []int // the versions dropped
	Files    int   // files removed (blobs and manifests)
	Bytes    int64 // their bytes
}

// Keep drops every version of the dataset in out but the keep newest
// (the current one among them): under the journal's lock (no convert
// runs meanwhile), each dropped version's folder is renamed aside, then
// the files it listed that no kept version lists are removed, then the
// folder. A kill at any step leaves the kept versions whole; what it
// left is removed by the next convert or Keep. A dataset of format 1 has
// one version: nothing to drop.
func Keep(out string, keep int) (*Dropped, error) {
	if keep < 1 {
		return nil, fmt.Errorf("%w: --keep %d: keep at least the current version (1)", ErrUsage, keep)
	}
	out, err := filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	d, err := manifests.LoadDataset(out)
	if err != nil {
		return nil, fmt.Errorf("%w: --keep: %w", ErrUsage, err)
	}
	j := &job{opts: Options{Out: out}}
	j.stageBeside(out)
	jf, err := j.lockJournal()
	if err != nil {
		return nil, err
	}
	defer func() {
		// (made by the lock, it holds nothing: removed while still locked,
		// so that no other run locks the name meanwhile)
		if _, err := os.Stat(j.staging); errors.Is(err, fs.ErrNotExist) {
			os.Remove(j.journalPath)
		}
		jf.Close()
	}()
	return dropVersions(out, d, keep)
}

// dropVersions is Keep under the lock.
func dropVersions(out string, d *manifests.Dataset, keep int) (*Dropped, error) {
	res := &Dropped{}
	if !d.Segmented() {
		return res, nil
	}
	// What earlier drops and commits left, first.
	if err := removeLeftovers(out, d); err != nil {
		return nil, err
	}
	ns, err := manifests.KeptVersions(out)
	if err != nil {
		return nil, err
	}
	var drop []int
	for i, n := range ns {
		if i < len(ns)-keep && n != d.Number() {
			drop = append(drop, n)
		}
	}
	if len(drop) == 0 {
		return res, nil
	}
	vdir := filepath.Join(out, manifests.VersionsDir)
	for _, n := range drop {
		if err := os.Rename(filepath.Join(vdir, strconv.Itoa(n)), filepath.Join(vdir, dropPrefix+strconv.Itoa(n))); err != nil {
			return nil, fmt.Errorf("convert: dropping version %d: %w", n, err)
		}
		faults.Point("convert.drop")
	}
	if err := atomicfile.Sync(vdir); err != nil {
		return nil, err
	}
	res.Versions = drop
	if err := removeDropped(out, d, res); err != nil {
		return nil, err
	}
	return res, nil
}

// removeDropped removes what the versions being dropped listed and no
// kept version lists (blobs, version 1's manifests), empty segment
// folders, then the dropped version folders (dataset.json last), counting
// into res.
func removeDropped(out string, d *manifests.Dataset, res *Dropped) error {
	kept, err := manifests.DirFiles(out, d)
	if err != nil {
		return err
	}
	files, dirs, err := manifests.DroppingFiles(out)
	if err != nil {
		return err
	}
	segs := map[string]bool{}
	for _, f := range slices.Sorted(func(yield func(string) bool) {
		for f := range files {
			if !yield(f) {
				return
			}
		}
	}) {
		if kept[f] {
			continue
		}
		p := filepath.Join(out, filepath.FromSlash(f))
		st, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: %s is not a regular file (a dropped version listed a file there): not removed; move it away", ErrUsage, p)
		}
		if err := os.Remove(p); err != nil {
			return err
		}
		res.Files++
		res.Bytes += st.Size()
		faults.Point("convert.dropfile")
		if dir := path.Dir(f); strings.HasPrefix(dir, manifests.SegmentsDir+"/") {
			segs[dir] = true
		}
	}
	for dir := range segs {
		os.Remove(filepath.Join(out, filepath.FromSlash(dir))) // (if empty: a kept version may read others of it)
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(filepath.Join(out, filepath.FromSlash(dir)))
		if err != nil {
			return err
		}
		listed := map[string]bool{}
		for _, e := range entries {
			if !e.Type().IsRegular() || (!leftoverFile.MatchString(e.Name()) && !strings.HasPrefix(e.Name(), atomicfile.TempPrefix)) {
				return fmt.Errorf("%w: --out %w: refusing to remove %s (move them elsewhere)", ErrUsage, manifests.NotOurs(out, []string{dir + "/" + e.Name()}), dir)
			}
			if e.Name() != manifests.DatasetFile {
				listed[dir+"/"+e.Name()] = true
			}
		}
		if err := removeUnder(out, listed); err != nil {
			return err
		}
		res.Files += len(listed)
		faults.Point("convert.dropdir")
		// dataset.json last: until it is gone, a re-run knows what the
		// folder's version listed.
		if err := os.Remove(filepath.Join(out, filepath.FromSlash(dir), manifests.DatasetFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.Remove(filepath.Join(out, filepath.FromSlash(dir))); err != nil {
			return err
		}
	}
	return atomicfile.Sync(out)
}
