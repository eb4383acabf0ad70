// Ownership: which files of a directory a manifest lists, and removing
// only those.

package manifests

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// ErrNotOurs marks a directory that holds files no manifest of ours lists:
// they are the user's, and clipshard never removes or replaces them.
var ErrNotOurs = errors.New("holds files that are not clipshard's")

// OwnFiles returns the files the dataset in its directory consists of, by
// the manifest: dataset.json, the other manifests and the blobs.
func (d *Dataset) OwnFiles() map[string]bool {
	own := map[string]bool{DatasetFile: true, d.Files.Clips: true, d.Files.Index: true, d.Files.Sums: true}
	if d.Files.Skipped != "" {
		own[d.Files.Skipped] = true
	}
	if d.Files.IDs != "" {
		own[d.Files.IDs] = true
	}
	if d.Files.Where != "" {
		own[d.Files.Where] = true
	}
	if d.Segmented() {
		own[VersionFile(d.Number())] = true
	}
	for _, f := range d.BlobFiles() {
		own[f] = true
	}
	return own
}

// Unlisted returns, sorted, the paths under dir (slash-separated, relative
// to dir) that are neither in listed nor a folder on the way to a listed
// file, nor accepted by extra (which may be nil). A folder that is not
// ours is named, not entered.
func Unlisted(dir string, listed map[string]bool, extra func(rel string, isDir bool) bool) ([]string, error) {
	folders := map[string]bool{}
	for f := range listed {
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			folders[d] = true
		}
	}
	var out []string
	err := WalkRel(dir, func(rel string, e fs.DirEntry) error {
		isDir := e.IsDir()
		switch {
		case extra != nil && extra(rel, isDir):
			if isDir {
				return fs.SkipDir
			}
		case isDir && folders[rel]:
		case !isDir && listed[rel]:
		default:
			if isDir {
				rel += "/"
			}
			out = append(out, rel)
			if isDir {
				return fs.SkipDir
			}
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// WalkRel walks the tree under dir (not dir itself) in lexical order,
// calling fn with each entry's slash path relative to dir; fn may return
// fs.SkipDir. dir may be a symbolic link to a folder (links below it are
// not followed). The first error ends the walk.
func WalkRel(dir string, fn func(rel string, d fs.DirEntry) error) error {
	root := dir
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		root = r
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		return fn(filepath.ToSlash(rel), d)
	})
}

// NotOurs words the error for a directory holding the unlisted files.
func NotOurs(dir string, unlisted []string) error {
	names := unlisted
	more := ""
	if len(names) > 5 {
		names, more = names[:5], fmt.Sprintf(" and %d more", len(unlisted)-5)
	}
	return fmt.Errorf("%s %w: %s%s", dir, ErrNotOurs, strings.Join(names, ", "), more)
}

// RemoveListed removes the listed files of dir (slash paths relative to
// it; a path ending in "/" lists a folder), then the listed folders and
// those on the way to listed files, if empty, dir included. It removes
// nothing else: a file that is not listed stays, and so do the folders
// that hold it; the error then names what is left.
func RemoveListed(dir string, listed map[string]bool) error {
	folders := map[string]bool{}
	for f := range listed {
		if d, ok := strings.CutSuffix(f, "/"); ok {
			if err := CheckRelPath(d); err != nil {
				return fmt.Errorf("%s: %w", dir, err)
			}
			f = d + "/x" // its folders, below
		} else if err := CheckRelPath(f); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		} else if err := os.Remove(filepath.Join(dir, filepath.FromSlash(f))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			folders[d] = true
		}
	}
	// Deepest first.
	order := make([]string, 0, len(folders))
	for d := range folders {
		order = append(order, d)
	}
	slices.SortFunc(order, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, d := range append(order, ".") {
		err := os.Remove(filepath.Join(dir, filepath.FromSlash(d)))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			left, _ := Unlisted(dir, nil, nil)
			if len(left) > 0 {
				return NotOurs(dir, left)
			}
			return err
		}
	}
	return nil
}
