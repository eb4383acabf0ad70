// Run: a shuffle's steps, from the options to the committed epochs: plan,
// set the epochs directory up, then for each group of epochs read and
// gather (in memory) or pile (external), write, and commit.

package shuffle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/internal/units"
	"github.com/clipshard/clipshard/manifests"
)

// ErrUsage marks options that cannot work.
var ErrUsage = errors.New("shuffle: usage")

// Options configure Run.
type Options struct {
	Dataset string // dataset directory (convert --out)
	// Version, if > 0, cuts the epochs from that version of Dataset (a
	// dataset grown by convert --segments keeps its earlier versions):
	// versions/N/dataset.json, whose sha256 the epochs record.
	Version int
	// Sources, instead of Dataset, mixes several datasets into each
	// epoch by Mix (epochs format version 3).
	Sources    []Source
	Mix        manifests.MixWeights
	Out        string // epochs directory
	EpochStart int    // first epoch
	EpochEnd   int    // one past the last epoch
	Seed       uint64
	Sampling   manifests.Sampling
	ShardSize  int   // samples per shard file; default 1024
	Mem        int64 // memory budget in bytes; default 2 GiB
	Workers    int   // shard writers; default GOMAXPROCS, at most 8 (fewer if --mem is small)
	Force      bool
	// AllowEmpty writes epochs without samples (every clip shorter than
	// the window, or fewer samples than ranks) instead of refusing them.
	AllowEmpty bool
	// NoFsync skips the fsync of the shard files before an epoch is
	// committed, and writes them through the page cache: a killed run
	// still leaves nothing half-written under a final name, but a power
	// cut may cost committed epochs their data.
	NoFsync bool

	// QualityBatch, if > 0, measures each written epoch's order with
	// batches of that many samples (Result.Quality).
	QualityBatch int

	// Progress, if set, is called as samples are written.
	Progress func(Progress)
	Now      func() time.Time
	Tool     string
}

// Progress is a snapshot of a running shuffle.
type Progress struct {
	Phase        string // "plan" (once, before anything is written), "read", "write"
	Done, Total  int64  // samples
	BytesWritten int64
	Planned      int64 // "plan": bytes the shards will take
	Epochs       []int // "plan": the epochs to write
}

// Result is what Run did.
type Result struct {
	Dir       string
	Manifest  *manifests.Epochs
	Done      []int // epochs written by this run
	Skipped   []int // epochs already complete
	External  bool  // the two-pass path was used
	Bytes     int64 // bytes written
	Elapsed   time.Duration
	UpToDate  bool
	Replaced  int             // stale epochs removed (dataset rebuilt since, or --force)
	Planned   int64           // bytes the run was going to write
	DataBytes int64           // dataset blob bytes
	Quality   map[int]Quality // per epoch written, with Options.QualityBatch
	// ShortClips: the clips shorter than the window (of every source),
	// which --short skip leaves out and --short pad pads; Short says which.
	ShortClips int
	Short      string
}

// Run writes epochs [o.EpochStart, o.EpochEnd) of shuffled shards into
// o.Out. manifests.Epochs already complete in o.Out (same dataset and options) are
// skipped; each epoch is committed atomically.
func Run(ctx context.Context, o Options) (*Result, error) {
	began := time.Now()
	j, err := newJob(o)
	if err != nil {
		return nil, err
	}
	res := &Result{Dir: j.o.Out, Short: j.o.Sampling.Short, ShortClips: j.shortClips()}
	todo, skipped := j.toDo()
	if len(todo) == 0 {
		if err := j.tidy(); err != nil {
			return nil, err
		}
		res.Skipped = skipped
		res.UpToDate, res.Manifest, res.Elapsed = true, j.man, time.Since(began)
		return res, nil
	}
	// Count each epoch's samples first, without making the lists (they
	// are made per group of epochs, within the memory budget): sizes and
	// refusals come before anything is allocated.
	metaBudget := j.o.Mem / 4
	var counts []epochCount
	var files int64 // shard files to write
	for _, e := range todo {
		n, err := j.count(e)
		if err != nil {
			return nil, err
		}
		if n == 0 && !j.o.AllowEmpty {
			return nil, j.emptyErr(e)
		}
		// One epoch's plan is made whole: it may take a quarter of --mem
		// and part of the 64 MiB beyond it that the budget allows.
		if meta := j.epochMeta(n); meta > metaBudget+metaSlack {
			return nil, fmt.Errorf("%w: epoch %d has %d samples: planning it takes %s (%d bytes a sample, and the shards' entries), more than a quarter of --mem %s and %s; give --mem %s or more, or cut fewer samples (a larger --window, a smaller --per-clip)",
				ErrUsage, e, n, units.Bytes(meta), sampleMeta, units.Bytes(j.o.Mem), units.Bytes(metaSlack), units.Bytes(satMul(4, meta-metaSlack)))
		}
		counts = append(counts, epochCount{e, int(n)})
		res.Planned = satAdd(res.Planned, j.epochBytes(n))
		files = satAdd(files, j.epochFiles(n))
	}
	for _, run := range j.runs {
		for k, m := range j.mods {
			res.DataBytes += run.files[k].rows * m.rowBytes
		}
	}
	var totalSamples int64
	for _, c := range counts {
		totalSamples += int64(c.kept)
	}
	if j.o.Progress != nil {
		j.o.Progress(Progress{Phase: "plan", Total: totalSamples, Planned: res.Planned, Epochs: todo})
	}
	// manifests.Epochs are processed in groups whose sample metadata fits a quarter
	// of --mem. The in-memory path needs the blobs to fit the other three
	// quarters.
	res.External = res.DataBytes > j.o.Mem-metaBudget
	j.ext = res.External
	groups := groupEpochs(counts, metaBudget)
	// On disk, each file's last block is whole; the manifests take a few
	// more (shards.parquet and epochs.json grow with the shards).
	if err := checkSpace(j.o.Out, res.Planned+files*(diskBlock+256)+64<<10); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(j.o.Out, 0o755); err != nil {
		return nil, err
	}
	release, done, err := j.setup(todo)
	if err != nil {
		return nil, err
	}
	defer release()
	faults.Point("shuffle.setup")
	res.Replaced = j.replaced
	if len(done) > 0 { // committed by another run meanwhile
		var left []int
		var kept []epochCount
		for i, e := range todo {
			if slices.Contains(done, e) {
				continue
			}
			left = append(left, e)
			kept = append(kept, counts[i])
		}
		todo, counts = left, kept
		skipped = append(skipped, done...)
		slices.Sort(skipped)
		if len(todo) == 0 {
			release()
			if err := j.tidy(); err != nil { // the claims just given back
				return nil, err
			}
			res.Skipped = skipped
			res.UpToDate, res.Manifest, res.Elapsed = true, j.man, time.Since(began)
			return res, nil
		}
		groups = groupEpochs(counts, metaBudget)
	}
	res.Skipped = skipped
	// The pile folders of earlier versions.
	if entries, err := os.ReadDir(j.o.Out); err == nil {
		for _, e := range entries {
			var a, b int
			if n, _ := fmt.Sscanf(e.Name(), ".work-%04d-%04d", &a, &b); n == 2 && a <= todo[len(todo)-1] && b >= todo[0] {
				os.RemoveAll(filepath.Join(j.o.Out, e.Name()))
			}
		}
	}
	var bytes int64
	for _, group := range groups {
		j.plan(group)
		if j.o.QualityBatch > 0 {
			if res.Quality == nil {
				res.Quality = map[int]Quality{}
			}
			for _, ep := range j.epochs {
				q := Measure(ep.samples, j.o.QualityBatch)
				if j.mixed {
					MeasureSources(&q, ep.samples, j.o.QualityBatch, j.sourceNames(), ep.counts, j.srcOf)
				}
				res.Quality[ep.epoch] = q
			}
		}
		s := newSink(j, j.workers())
		if res.External {
			err = j.external(ctx, s)
		} else {
			err = j.gatherInMemory(ctx, s)
		}
		if err == nil {
			err = s.finish()
		}
		bytes += s.bytes
		s.abort()
		if err != nil {
			return nil, err
		}
	}
	j.epochs = nil
	res.Done, res.Bytes, res.Manifest = todo, bytes, j.man
	res.Elapsed = time.Since(began)
	return res, nil
}

// epochCount is the number of samples an epoch keeps (over all ranks).
type epochCount struct{ epoch, kept int }

// groupEpochs cuts the epochs into groups whose sample metadata (about
// sampleMeta bytes a sample) fits metaBudget; the blobs are read once per
// group.
func groupEpochs(counts []epochCount, metaBudget int64) [][]int {
	var groups [][]int
	for g := 0; g < len(counts); {
		var group []int
		var meta int64
		for g < len(counts) && (len(group) == 0 || meta+int64(counts[g].kept)*sampleMeta <= metaBudget) {
			group = append(group, counts[g].epoch)
			meta += int64(counts[g].kept) * sampleMeta
			g++
		}
		groups = append(groups, group)
	}
	return groups
}
