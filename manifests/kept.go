// The files of every kept version of a dataset in segments (format 2),
// with the sha256 each version records: what push sends, and what verify
// of a bucket hashes.

package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Kept is what the kept versions of a format 2 dataset hold.
type Kept struct {
	// Sums: every file some kept version lists (relative to the dataset
	// folder; a version's dataset.json at versions/N/dataset.json, not
	// the top one) and its sha256, "" for a version's SHA256SUMS (which
	// no file records).
	Sums map[string]string
	// Blobs: the files of Sums that are blobs.
	Blobs map[string]bool
	// Versions: the sha256 of each kept version's dataset.json, and its
	// number.
	Versions map[string]int
	// Parents: the sha256 of the dataset.json each kept version was made
	// from (its "previous"), and that version's number: one this folder
	// may have dropped (convert --keep), still its history.
	Parents map[string]int
	// Current is the current version's number.
	Current int
}

// KeptFiles returns the files of the kept versions of the format 2
// dataset in dir. A file two versions record with two sha256s (a name
// reused for other bytes, which convert never does) is an error naming
// it.
func KeptFiles(dir string) (*Kept, error) {
	d, err := LoadDataset(dir)
	if err != nil {
		return nil, err
	}
	if !d.Segmented() {
		return nil, fmt.Errorf("%w: %s: not a dataset in segments", ErrManifest, dir)
	}
	ns, err := KeptVersions(dir)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(ns, d.Number()) {
		return nil, fmt.Errorf("%w: %s: the current version %d is not under %s", ErrManifest, dir, d.Number(), VersionsDir)
	}
	k := &Kept{Sums: map[string]string{}, Blobs: map[string]bool{}, Versions: map[string]int{}, Parents: map[string]int{}, Current: d.Number()}
	set := func(rel, sum, by string) error {
		if err := CheckRelPath(rel); err != nil {
			return fmt.Errorf("%s: %w", by, err)
		}
		if old, ok := k.Sums[rel]; ok && old != sum {
			return fmt.Errorf("%w: %s: records sha256 %s for %s, another kept version %s: one name, two contents (verify %s)", ErrManifest, by, sum, rel, old, dir)
		}
		k.Sums[rel] = sum
		return nil
	}
	for _, n := range ns {
		v, b, err := LoadVersion(dir, n)
		if err != nil {
			return nil, err
		}
		h := sha256.Sum256(b)
		k.Versions[hex.EncodeToString(h[:])] = n
		if v.Previous != nil && isHexSum(v.Previous.SHA256) {
			k.Parents[v.Previous.SHA256] = v.Previous.Version
		}
		by := filepath.Join(dir, filepath.FromSlash(v.Files.Sums))
		sums, err := ReadSums(by)
		if err != nil {
			return nil, err
		}
		for rel, sum := range sums {
			if rel == DatasetFile && !v.Segmented() {
				rel = VersionFile(n) // (format 1's own dataset.json, kept there byte for byte)
			}
			if err := set(rel, sum, by); err != nil {
				return nil, err
			}
		}
		if err := set(v.Files.Sums, "", by); err != nil {
			return nil, err
		}
		own := v.OwnFiles()
		delete(own, DatasetFile)
		own[VersionFile(n)] = true
		for rel := range own {
			if _, ok := k.Sums[rel]; !ok {
				return nil, fmt.Errorf("%w: %s does not list %s, a file of version %d", ErrManifest, by, rel, n)
			}
		}
		for _, m := range v.Modalities {
			for _, bl := range m.BlobList() {
				if k.Sums[bl.File] != bl.SHA256 {
					return nil, fmt.Errorf("%w: version %d: modality %q: %s has sha256 %s in its dataset.json, %s in %s", ErrManifest, n, m.Name, bl.File, bl.SHA256, k.Sums[bl.File], by)
				}
				k.Blobs[bl.File] = true
			}
		}
	}
	return k, nil
}

// BlockFolder is the folder whose BLOCKSUMS lists blob rel: a segment's
// (segments/<id>), or the dataset's top ("").
func BlockFolder(rel string) string {
	if dir := path.Dir(rel); dir != "." {
		return dir
	}
	return ""
}

// BlockSumsOf is the name of folder's BLOCKSUMS.
func BlockSumsOf(folder string) string {
	if folder == "" {
		return BlockSumsFile
	}
	return folder + "/" + BlockSumsFile
}

// SegmentedLayout reports whether rel is a name a pushed dataset in
// segments may hold: a top-level file, a segment's
// (segments/<id>/<name>) or a version's (versions/<n>/<name>).
func SegmentedLayout(rel string) bool {
	parts := strings.Split(rel, "/")
	switch {
	case len(parts) == 1:
		return parts[0] != "" && !strings.HasPrefix(parts[0], ".")
	case len(parts) == 3 && parts[0] == SegmentsDir:
		return segmentName.MatchString(parts[1]) && parts[2] != "" && !strings.HasPrefix(parts[2], ".")
	case len(parts) == 3 && parts[0] == VersionsDir:
		return versionName.MatchString(parts[1]) && parts[2] != "" && !strings.HasPrefix(parts[2], ".")
	}
	return false
}
