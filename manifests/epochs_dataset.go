// Epochs and the dataset they were cut from: a dataset converted again in
// place under its epochs is noticed by every reader (the samples' clip
// rows would name another dataset's clips).

package manifests

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
)

// DatasetChanged is a dataset an epochs folder was cut from that is there
// and is now another dataset.
type DatasetChanged struct {
	What    string // "dataset", or "source NAME"
	Dir     string
	Want    string // the sha256 of dataset.json epochs.json records
	Now     string // its sha256 now
	Problem string // why it could not be read, if it could not
}

func (c DatasetChanged) Error() string {
	if c.Problem != "" {
		return fmt.Sprintf("the %s the epochs were cut from, %s: its dataset.json cannot be read to check that it is still that dataset: %s", c.What, c.Dir, c.Problem)
	}
	return fmt.Sprintf("cut from the %s %s when its dataset.json had sha256 %s; it now has %s: the dataset was converted again (or replaced) since the shuffle, and the samples' clip rows name the clips of the dataset they were cut from, not of this one: shuffle again from %s (into a new folder, or --force), or restore the dataset they were cut from",
		c.What, c.Dir, c.Want, c.Now, c.Dir)
}

// DatasetsChanged checks each dataset man was cut from (its dataset, or
// each source of a mixed run) that is present at the folder recorded: it
// must be the one recorded (dataset.json's sha256), or hold it as a kept
// version (versions/N/dataset.json, of a dataset grown by convert
// --segments). A dataset that is not
// there (moved, or on another machine) is not checked.
func DatasetsChanged(man *Epochs) []DatasetChanged {
	type ref struct{ what, dir, sha string }
	var refs []ref
	if man.Version == EpochsVersionMix {
		for _, s := range man.Sources {
			refs = append(refs, ref{"source " + s.Name, s.Dir, s.SHA256})
		}
	} else {
		refs = append(refs, ref{"dataset", man.Dataset.Dir, man.Dataset.SHA256})
	}
	var out []DatasetChanged
	for _, x := range refs {
		if x.dir == "" || !filepath.IsAbs(x.dir) || x.sha == "" {
			continue
		}
		sum, err := HashFile(filepath.Join(x.dir, DatasetFile))
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		case err != nil:
			out = append(out, DatasetChanged{What: x.what, Dir: x.dir, Want: x.sha, Problem: oneLine(err)})
		case sum != x.sha:
			if v, err := FindVersion(x.dir, x.sha); err == nil && v != nil {
				continue // a kept version (convert --segments): the epochs read it
			}
			out = append(out, DatasetChanged{What: x.what, Dir: x.dir, Want: x.sha, Now: sum})
		}
	}
	return out
}

// checkDatasetsHere adds a problem for each dataset DatasetsChanged finds.
func checkDatasetsHere(man *Epochs, r *Report) {
	for _, c := range DatasetsChanged(man) {
		r.add(Problem{File: EpochsFile, What: c.Error()})
	}
}
