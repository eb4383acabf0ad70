// Report: what a verification found, and the checks datasets and epochs
// share (sha256 of listed files, opened as regular files only).

package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/clipshard/clipshard/formats/regfile"
)

// Problem is one thing verification found wrong.
type Problem struct {
	File string `json:"file"`           // path relative to the checked directory (or a source path)
	Clip string `json:"clip,omitempty"` // the clip concerned, if any
	What string `json:"what"`
}

func (p Problem) String() string {
	s := p.File
	if p.Clip != "" {
		s += ": clip " + fmt.Sprintf("%q", p.Clip)
	}
	return s + ": " + p.What
}

// Report is the result of a verification.
type Report struct {
	Kind     string    `json:"kind"` // "dataset"
	Dir      string    `json:"dir"`
	Level    string    `json:"level"` // "structure+sha256", "+deep", "+sources"
	Files    int       `json:"files_checked"`
	Bytes    int64     `json:"bytes_hashed"`
	Clips    int       `json:"clips,omitempty"`
	Samples  int64     `json:"samples,omitempty"` // epochs: samples over all epochs and ranks
	Problems []Problem `json:"problems"`
	// InProgress names what a live run is writing (an epoch's partial
	// folder): not damage, and not checked.
	InProgress []string `json:"in_progress,omitempty"`
	mu         *sync.Mutex
	// blocks: what the data files' blocks must hash to (their BLOCKSUMS,
	// found sound by the structure check), checked as they are hashed.
	blocks map[string]blockWant
}

func (r *Report) add(p Problem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// One problem is reported once, whichever checks met it (a FIFO is
	// met by the header check and by the hashing).
	if slices.Contains(r.Problems, p) {
		return
	}
	r.Problems = append(r.Problems, p)
}

// Add records a problem; safe for concurrent use.
func (r *Report) Add(p Problem) { r.add(p) }

// NewReport starts a report.
func NewReport(kind, dir, level string) *Report {
	return &Report{Kind: kind, Dir: dir, Level: level, mu: new(sync.Mutex)}
}

// Sort orders the problems by file, for stable output.
func (r *Report) Sort() {
	sort.SliceStable(r.Problems, func(i, j int) bool { return r.Problems[i].File < r.Problems[j].File })
}

// OK reports whether nothing was found wrong.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// VerifyOptions select how deep verification goes.
type VerifyOptions struct {
	Deep    bool // per-clip xxHash64 of every blob
	Sources bool // re-decode the sources and compare
	Workers int  // files hashed at once (default 2)
	// Progress, if set, is called with bytes hashed so far and the total.
	Progress func(done, total int64)
	// Mem bounds the memory of --sources (DefaultVerifyMem if 0): a .npy
	// source larger than an eighth of it is compared a piece at a time.
	// (A pickle is decoded whole.)
	Mem int64
	// manifestsOnly: hash the manifests, not the blobs (Vouch).
	manifestsOnly bool
}

// DefaultVerifyMem is verify's --mem.
const DefaultVerifyMem = 256 << 20

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }

// CheckSums hashes every file of sums that is present (names relative to
// dir), o.Workers at a time, and records mismatches in r.
func CheckSums(dir string, sums map[string]string, present map[string]bool, o VerifyOptions, r *Report) {
	if o.Workers <= 0 {
		o.Workers = 2
	}
	var names []string
	var total int64
	for f := range sums {
		if present[f] {
			names = append(names, f)
			if st, err := os.Stat(filepath.Join(dir, f)); err == nil {
				total += st.Size()
			}
		}
	}
	sort.Strings(names)
	var mu sync.Mutex
	var done int64
	sem := make(chan struct{}, o.Workers)
	var wg sync.WaitGroup
	for _, f := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			want, blocked := r.blocks[f]
			var bh *BlockHasher
			if blocked {
				bh = NewBlockHasher(want.block)
			}
			got, n, err := hashFileCounting(filepath.Join(dir, f), bh, func(k int64) {
				if o.Progress != nil {
					mu.Lock()
					done += k
					o.Progress(done, total)
					mu.Unlock()
				}
			})
			r.mu.Lock()
			r.Files++
			r.Bytes += n
			r.mu.Unlock()
			switch {
			case err != nil:
				r.add(Problem{File: f, What: oneLine(err)})
			case got != sums[f]:
				r.add(Problem{File: f, What: "sha256 mismatch: content differs from SHA256SUMS"})
			case blocked && want.problem(bh) != "":
				r.add(Problem{File: f, What: want.problem(bh)})
			}
		}()
	}
	wg.Wait()
}

// hashFileCounting is HashFile reporting progress as it reads.
func hashFileCounting(path string, bh *BlockHasher, progress func(int64)) (string, int64, error) {
	f, _, err := regfile.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	return hashReader(f, bh, progress)
}

// hashReader is the hex sha256 of what r holds, read in 1 MiB blocks,
// reporting progress as it reads, and the bytes read; bh, if not nil,
// hashes its blocks too.
func hashReader(r io.Reader, bh *BlockHasher, progress func(int64)) (string, int64, error) {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			if bh != nil {
				bh.Write(buf[:k])
			}
			n += int64(k)
			progress(int64(k))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", n, err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
