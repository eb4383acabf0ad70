// Out dir: which --out a convert may replace, and the staging folder's
// cleanup (only files that are convert's own).

package convert

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/manifests"
)

// checkOut decides whether --out may be replaced: it may if it does not
// exist, is an empty directory, or is a clipshard dataset (a dataset.json
// of ours that loads) holding no file its manifest does not list. It
// returns the files to remove once the new dataset has replaced it (nil
// if none). Anything else is refused, naming the files that are not ours:
// a replace never deletes what the old manifest does not list.
func checkOut(out string) (map[string]bool, error) {
	st, err := os.Lstat(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		// The dataset replaces --out whole: a link would be replaced by
		// a folder, and the folder it points to left behind.
		return nil, fmt.Errorf("%w: --out %s is a symbolic link: give the folder it points to", ErrUsage, out)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%w: --out %s exists and is not a directory", ErrUsage, out)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return map[string]bool{}, nil
	}
	d, err := manifests.LoadDataset(out)
	if err != nil {
		if _, serr := os.Lstat(filepath.Join(out, manifests.DatasetFile)); serr != nil {
			var names []string
			for _, e := range entries {
				n := e.Name()
				if e.IsDir() {
					n += "/"
				}
				names = append(names, n)
			}
			return nil, fmt.Errorf("%w: --out %w (no %s: not a dataset): refusing to replace it (move them elsewhere, or choose another --out)",
				ErrUsage, manifests.NotOurs(out, names), manifests.DatasetFile)
		}
		return nil, fmt.Errorf("%w: --out %s is not a clipshard dataset (%v): refusing to replace it (choose another --out)", ErrUsage, out, err)
	}
	// Every kept version's files (format 2), and what a convert
	// --segments killed before its commit left, are ours.
	own, err := manifests.DirFiles(out, d)
	if err != nil {
		return nil, fmt.Errorf("%w: --out %s: %w: refusing to replace it (choose another --out)", ErrUsage, out, err)
	}
	extra, err := unlistedOrLeft(out, own)
	if err != nil {
		return nil, err
	}
	if len(extra) > 0 {
		return nil, fmt.Errorf("%w: --out %w: refusing to replace it (move them elsewhere, or choose another --out)", ErrUsage, manifests.NotOurs(out, extra))
	}
	return own, nil
}

// removeOld removes the previous dataset, moved to dir by the commit: its
// listed files and then dir. Files someone put there meanwhile stay, and
// the error says where.
func removeOld(dir string, own map[string]bool) error {
	if err := manifests.RemoveListed(dir, own); err != nil {
		return fmt.Errorf("the new dataset is in place, but the previous one's folder %s was kept: %w", dir, err)
	}
	return nil
}

// stagingName reports whether name is one of the files convert writes
// into its staging directory (see writeManifests and blobPath).
func stagingName(name string) bool {
	switch name {
	case manifests.DatasetFile, manifests.ClipsFile, manifests.IndexFile, manifests.SumsFile, manifests.SkippedFile, manifests.IDsFile:
		return true
	}
	return strings.HasSuffix(name, ".npy") || strings.HasPrefix(name, atomicfile.TempPrefix)
}

// removeStaging removes a staging directory (a killed or finished run's)
// if it holds only files convert writes there; otherwise it is not ours,
// and it is left alone with an error naming what it holds.
func removeStaging(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	own := map[string]bool{}
	var extra []string
	for _, e := range entries {
		if e.IsDir() && (e.Name() == manifests.SegmentsDir || e.Name() == manifests.VersionsDir) {
			// A merge by reference's staged segments and version.
			err := manifests.WalkRel(filepath.Join(dir, e.Name()), func(rel string, f fs.DirEntry) error {
				full := e.Name() + "/" + rel
				switch {
				case f.IsDir() && !strings.Contains(rel, "/") && manifests.Leftover(full, true):
					own[full+"/"] = true
				case f.Type().IsRegular() && strings.Count(rel, "/") == 1 && (leftoverFile.MatchString(f.Name()) || strings.HasPrefix(f.Name(), atomicfile.TempPrefix)):
					own[full] = true
				default:
					extra = append(extra, full)
					if f.IsDir() {
						return fs.SkipDir
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			own[e.Name()+"/"] = true
			continue
		}
		if e.IsDir() && e.Name() == "version" {
			// convert --segments' staged version manifests.
			inner, err := os.ReadDir(filepath.Join(dir, e.Name()))
			if err != nil {
				return err
			}
			for _, f := range inner {
				if f.Type().IsRegular() && (stagingName(f.Name()) || f.Name() == manifests.WhereFile) {
					own["version/"+f.Name()] = true
				} else {
					extra = append(extra, "version/"+f.Name())
				}
			}
			own["version/"] = true
			continue
		}
		if e.Type().IsRegular() && stagingName(e.Name()) {
			own[e.Name()] = true
		} else {
			extra = append(extra, e.Name())
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("%w: %w: it is not a staging folder of convert's; move it away", ErrUsage, manifests.NotOurs(dir, extra))
	}
	return manifests.RemoveListed(dir, own)
}

// sweepTemp removes the temporary files of atomic writes that a killed run
// left in dir.
func sweepTemp(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), atomicfile.TempPrefix) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// unlistedOrLeft returns the paths under out that are neither in own nor
// left by a convert --segments killed before its commit; the latter are
// added to own (folders with a final "/"), to be removed with the rest.
// Left: the temporary files of atomic writes in out, and folders under
// segments/ and versions/ that no kept version lists, holding plain files
// of the names convert gives.
func unlistedOrLeft(out string, own map[string]bool) ([]string, error) {
	// The files a version being dropped (convert --keep, killed) listed.
	dropping, _, err := manifests.DroppingFiles(out)
	if err != nil {
		return nil, err
	}
	for f := range dropping {
		if st, err := os.Lstat(filepath.Join(out, filepath.FromSlash(f))); err == nil && st.Mode().IsRegular() {
			own[f] = true
		}
	}
	var left []string
	extra, err := manifests.Unlisted(out, own, func(rel string, isDir bool) bool {
		switch {
		case isDir && (rel == manifests.SegmentsDir || rel == manifests.VersionsDir):
			left = append(left, rel)
			return true
		case !isDir && !strings.Contains(rel, "/") && strings.HasPrefix(rel, atomicfile.TempPrefix):
			own[rel] = true
			return true
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	for _, top := range left {
		entries, err := os.ReadDir(filepath.Join(out, top))
		if err != nil {
			return nil, err
		}
		listedUnder := false
		for _, e := range entries {
			rel := top + "/" + e.Name()
			if !e.IsDir() || !hasUnder(own, rel) {
				continue
			}
			listedUnder = true
			more, err := manifests.Unlisted(filepath.Join(out, rel), under(own, rel), nil)
			if err != nil {
				return nil, err
			}
			for _, m := range more {
				extra = append(extra, rel+"/"+m)
			}
		}
		for _, e := range entries {
			rel := top + "/" + e.Name()
			switch {
			case e.IsDir() && hasUnder(own, rel):
			case e.IsDir() && manifests.Leftover(rel, true):
				files, err := os.ReadDir(filepath.Join(out, filepath.FromSlash(rel)))
				if err != nil {
					return nil, err
				}
				for _, f := range files {
					if f.Type().IsRegular() && (leftoverFile.MatchString(f.Name()) || strings.HasPrefix(f.Name(), atomicfile.TempPrefix)) {
						own[rel+"/"+f.Name()] = true
					} else {
						extra = append(extra, rel+"/"+f.Name())
					}
				}
				own[rel+"/"] = true
			default:
				extra = append(extra, rel)
			}
		}
		if !listedUnder {
			own[top+"/"] = true
		}
	}
	slices.Sort(extra)
	return extra, nil
}

// under returns the paths of own under folder rel, relative to it.
func under(own map[string]bool, rel string) map[string]bool {
	out := map[string]bool{}
	for f := range own {
		if r, ok := strings.CutPrefix(f, rel+"/"); ok {
			out[r] = true
		}
	}
	return out
}
