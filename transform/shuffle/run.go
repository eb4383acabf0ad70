package shuffle

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// ErrUsage marks options that cannot work.
var ErrUsage = errors.New("shuffle: usage")

// Options configure Run.
type Options struct {
	Dataset    string // dataset directory (convert --out)
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
}

type modInfo struct {
	name       string
	file       string
	rate       int64
	frameShape []int
	dtype      array.DType
	rowBytes   int64 // bytes per blob row
	winBytes   int64 // bytes per sample window: W*rate rows
	dataOffset int64
}

type epochPlan struct {
	epoch   int
	samples []manifests.Sample // shuffled
	base    int64              // global position of the first sample
}

type job struct {
	o       Options
	ds      *manifests.Dataset
	starts  []int64
	lengths []int64
	mods    []modInfo
	rec     int64  // bytes of one sample across modalities
	zeros   []byte // the largest window's worth of zeros (read only)
	epochs  []epochPlan
	total   int64 // samples to write
	man     *manifests.Epochs
	// stale: the epochs in Out are of another dataset or (with --force)
	// other options, and are replaced (setup); replaced counts them.
	stale    bool
	replaced int
	ext      bool // the external (two-pass) path
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
	res := &Result{Dir: j.o.Out}
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
		n := manifests.CountSamples(j.lengths, j.o.Sampling, j.o.Seed, e)
		if n == 0 && !j.o.AllowEmpty {
			return nil, j.emptyErr(e)
		}
		// One epoch's plan is made whole: it may take a quarter of --mem
		// and part of the 64 MiB beyond it that the budget allows.
		if meta := j.epochMeta(n); meta > metaBudget+metaSlack {
			return nil, fmt.Errorf("%w: epoch %d has %d samples: planning it takes %s (%d bytes a sample, and the shards' entries), more than a quarter of --mem %s and %s; give --mem %s or more, or cut fewer samples (a larger --window, a smaller --per-clip)",
				ErrUsage, e, n, sizeString(meta), sampleMeta, sizeString(j.o.Mem), sizeString(metaSlack), sizeString(4*(meta-metaSlack)))
		}
		counts = append(counts, epochCount{e, int(n)})
		res.Planned += j.epochBytes(n)
		files += j.epochFiles(n)
	}
	for _, m := range j.mods {
		res.DataBytes += j.ds.Modality(m.name).Rows * m.rowBytes
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
				res.Quality[ep.epoch] = Measure(ep.samples, j.o.QualityBatch)
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

func newJob(o Options) (*job, error) {
	if o.Dataset == "" || o.Out == "" {
		return nil, fmt.Errorf("%w: --dataset and --out are required", ErrUsage)
	}
	if err := o.Sampling.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if o.EpochEnd <= o.EpochStart || o.EpochStart < 0 || o.EpochEnd > 9999 {
		return nil, fmt.Errorf("%w: epochs [%d, %d): want 0 <= A < B <= 9999", ErrUsage, o.EpochStart, o.EpochEnd)
	}
	if o.ShardSize == 0 {
		o.ShardSize = 1024
	}
	if o.Mem == 0 {
		o.Mem = 2 << 30
	}
	if o.ShardSize < 1 || o.Mem < 64<<10 {
		return nil, fmt.Errorf("%w: --shard-samples %d, --mem %d: want >= 1, >= 64KiB", ErrUsage, o.ShardSize, o.Mem)
	}
	if o.Workers < 0 || o.Workers > 256 {
		return nil, fmt.Errorf("%w: --workers %d: want 1..256 (0: the CPUs)", ErrUsage, o.Workers)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var err error
	if o.Out, err = filepath.Abs(o.Out); err != nil {
		return nil, err
	}
	if o.Dataset, err = filepath.Abs(o.Dataset); err != nil {
		return nil, err
	}
	ds, err := manifests.LoadDataset(o.Dataset)
	if err != nil {
		return nil, err
	}
	starts, lengths, err := manifests.ReadIndex(filepath.Join(o.Dataset, ds.Files.Index))
	if err != nil {
		return nil, err
	}
	if int64(len(starts)) != ds.Clips {
		return nil, fmt.Errorf("%w: %s: index.npy has %d clips, dataset.json %d (run verify)", manifests.ErrManifest, o.Dataset, len(starts), ds.Clips)
	}
	var next int64
	for i := range starts {
		if starts[i] != next || lengths[i] < 0 {
			return nil, fmt.Errorf("%w: %s: index.npy row %d: start %d length %d, want start %d (contiguous from 0; run verify)",
				manifests.ErrManifest, o.Dataset, i, starts[i], lengths[i], next)
		}
		next += lengths[i]
	}
	if next != ds.Frames {
		return nil, fmt.Errorf("%w: %s: index.npy's lengths add up to %d frames, dataset.json says %d (run verify)", manifests.ErrManifest, o.Dataset, next, ds.Frames)
	}
	j := &job{o: o, ds: ds, starts: starts, lengths: lengths}
	for _, m := range ds.Modalities {
		if strings.EqualFold(m.Name, "samples") {
			return nil, fmt.Errorf("%w: %s: modality %q collides with the shards' samples files; convert again with another name", manifests.ErrManifest, o.Dataset, m.Name)
		}
		dt, _, err := array.ParseDescr(m.DType)
		if err != nil {
			return nil, err
		}
		rb, err := array.ByteSize(m.FrameShape, dt.Size)
		if err != nil {
			return nil, err
		}
		mi := modInfo{name: m.Name, file: m.File, rate: int64(m.Rate), frameShape: m.FrameShape, dtype: dt,
			rowBytes: rb, winBytes: int64(o.Sampling.Window) * int64(m.Rate) * rb, dataOffset: m.DataOffset}
		if err := j.checkBlob(mi, m.Rows); err != nil {
			return nil, err
		}
		j.mods = append(j.mods, mi)
		j.rec += mi.winBytes
		if int64(len(j.zeros)) < mi.winBytes {
			j.zeros = make([]byte, mi.winBytes)
		}
	}
	if j.man, err = openManifest(j); err != nil {
		return nil, err
	}
	return j, nil
}

// checkBlob refuses a blob shorter than the manifest says (a damaged or
// replaced dataset), naming the first clip whose rows are missing: both
// paths read every row, and learning it half-way would waste the run.
//
// It also refuses a blob that disagrees with dataset.json and index.npy in
// any number the shuffle relies on (rows, header, size): every window is
// cut from the rows those numbers locate.
func (j *job) checkBlob(m modInfo, rows int64) error {
	path := filepath.Join(j.o.Dataset, m.file)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s (run verify)", manifests.ErrManifest, path, fmt.Sprintf(format, args...))
	}
	if m.rowBytes <= 0 {
		return bad("modality %q: frame shape %v holds no values", m.name, m.frameShape)
	}
	if want := j.ds.Frames * m.rate; rows != want {
		return bad("dataset.json says %d rows, but %d frames at rate %d make %d", rows, j.ds.Frames, m.rate, want)
	}
	f, fi, err := regfile.Open(path)
	if err != nil {
		return err
	}
	h, herr := npy.ReadHeader(f, fi.Size())
	f.Close()
	need := m.dataOffset + rows*m.rowBytes
	if herr != nil && fi.Size() >= need {
		return bad("%v", herr)
	}
	if herr == nil {
		wantShape := append([]int{int(rows)}, m.frameShape...)
		switch {
		case h.Descr != m.dtype.Descr() || h.Fortran || !slices.Equal(h.Shape, wantShape):
			return bad("the header says %s %s, dataset.json %s %s", h.Descr, array.FormatShape(h.Shape), m.dtype.Descr(), array.FormatShape(wantShape))
		case h.DataOffset != m.dataOffset:
			return bad("data at byte %d, dataset.json says %d", h.DataOffset, m.dataOffset)
		case fi.Size() > need:
			return bad("%d bytes, dataset.json needs %d: %d bytes too many", fi.Size(), need, fi.Size()-need)
		}
	}
	if fi.Size() >= need {
		return nil
	}
	have := max(0, (fi.Size()-m.dataOffset)/m.rowBytes) // whole rows present
	c := sort.Search(len(j.starts), func(c int) bool { return (j.starts[c]+j.lengths[c])*m.rate > have })
	return fmt.Errorf("%w: %s: %d bytes, dataset.json needs %d: the rows of clip %d on (from byte %d) are missing (run verify)",
		manifests.ErrManifest, path, fi.Size(), need, c, m.dataOffset+j.starts[min(c, len(j.starts)-1)]*m.rate*m.rowBytes)
}

// readErr words a failed read of a blob from byte off on, where clip
// (if >= 0) is the first clip read (a blob that shrank since the run
// started, or a failing disk).
func readErr(path string, off int64, clip int, err error) error {
	if errors.Is(err, io.EOF) {
		err = errors.New("the file ends early (changed during the run? run verify)")
	}
	if clip >= 0 {
		return fmt.Errorf("%s: reading from byte %d (clip %d on): %w", path, off, clip, err)
	}
	return fmt.Errorf("%s: reading from byte %d: %w", path, off, err)
}

// plan derives the samples of every epoch to write.
func (j *job) plan(epochs []int) {
	j.epochs = nil
	var base int64
	for _, e := range epochs {
		all := manifests.Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		ep := epochPlan{epoch: e, samples: all, base: base}
		base += int64(len(ep.samples))
		j.epochs = append(j.epochs, ep)
	}
	j.total = base
}

// epochMeta is the memory that planning an epoch of n samples takes: its
// samples and the entries of its shards (in the plan and the manifest).
func (j *job) epochMeta(n int64) int64 {
	shards := 1 + n/int64(j.o.ShardSize)
	return n*sampleMeta + shards*int64(shardMeta+64*len(j.mods))
}

// metaSlack is how far one epoch's plan may go past a quarter of --mem.
const metaSlack = 16 << 20

// shardMeta is about what a shard's entries take in the plan and the
// manifest, besides 64 bytes per modality file.
const shardMeta = 512

// sizeString words a byte count for a person: 2.5GiB.
func sizeString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// sampleMeta is the memory a planned sample takes: its Sample in the
// epoch's list and, on the external path, its position in the per-clip
// index.
const sampleMeta = 32

// epochFiles is the number of shard files (modalities and samples) of an
// epoch of n samples.
func (j *job) epochFiles(n int64) int64 {
	if n == 0 {
		return 0
	}
	return (n + int64(j.o.ShardSize) - 1) / int64(j.o.ShardSize) * int64(len(j.mods)+1)
}

// diskBlock bounds the filesystem's allocation unit that the space check
// allows for at the end of each file.
const diskBlock = 4096

// epochBytes is what the shards of an epoch of n samples take on disk.
func (j *job) epochBytes(n int64) int64 {
	return n*(j.rec+24) + j.epochFiles(n)*npy.DataAlign
}

// checkSpace refuses to start when the filesystem of out lacks the room
// for need bytes: the shards and manifests (the external path's piles lie
// in the shards' files).
func checkSpace(out string, need int64) error {
	dir := out
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil // cannot tell; go ahead
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free < need {
		return fmt.Errorf("%w: %s needs %d bytes for the shards and manifests, the filesystem has %d free", ErrUsage, out, need, free)
	}
	return nil
}

// position maps a global output position to its epoch plan and index.
func (j *job) position(pos int64) (*epochPlan, int) {
	i := sort.Search(len(j.epochs), func(i int) bool { return j.epochs[i].base > pos }) - 1
	ep := &j.epochs[i]
	return ep, int(pos - ep.base)
}

// gatherInMemory loads every blob; the workers fill their shards from it.
func (j *job) gatherInMemory(ctx context.Context, s *sink) error {
	blobs := make([][]byte, len(j.mods))
	for k, m := range j.mods {
		rows := j.ds.Modality(m.name).Rows
		f, _, err := regfile.Open(filepath.Join(j.o.Dataset, m.file))
		if err != nil {
			return err
		}
		// Mapped memory with huge pages where offered: a fresh heap buffer
		// of the dataset's size costs a page fault (and zeroing) every 4 KiB.
		blobs[k] = directio.MapBuf(int(rows * m.rowBytes))
		defer directio.Unmap(blobs[k])
		_, err = f.ReadAt(blobs[k], m.dataOffset)
		f.Close()
		if err != nil {
			return readErr(f.Name(), m.dataOffset, -1, err)
		}
	}
	rows := func(k int, first, n int64) []byte {
		rb := j.mods[k].rowBytes
		return blobs[k][first*rb : (first+n)*rb]
	}
	s.work = func(u unit, c *cursor) error {
		if err := c.open(u); err != nil {
			return err
		}
		ep := &j.epochs[u.ep]
		win := make([][]byte, len(j.mods))
		for i, smp := range ep.samples[u.lo-ep.base : u.hi-ep.base] {
			if i%1024 == 1023 && ctx.Err() != nil {
				return ctx.Err()
			}
			for k, m := range j.mods {
				win[k] = rows(k, (j.starts[smp.Clip]+smp.Start)*m.rate, smp.Valid*m.rate)
			}
			if err := c.put(win); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.close()
	}
	defer s.quiesce()
	for _, u := range s.shards {
		if err := s.submit(u); err != nil {
			return err
		}
	}
	return s.finish()
}

// workers is the number of shard writers: o.Workers (default GOMAXPROCS,
// at most 8). On the in-memory path without --no-fsync, fewer when the
// budget cannot hold their buffers (blob.Writer's chunks, for each of a
// shard's files; with --no-fsync a worker writes from the loaded blobs,
// and on the external path the piles are cut to the workers' share).
func (j *job) workers() int {
	n := j.o.Workers
	if n <= 0 {
		n = min(runtime.GOMAXPROCS(0), 8)
	}
	if j.o.NoFsync || j.ext {
		return n
	}
	// blob.Create: three chunks of up to ChunkSize, no larger than the data.
	chunks := func(size int64) int64 { return 3 * min(blob.ChunkSize, size) }
	per := chunks(int64(j.o.ShardSize) * 24)
	for _, m := range j.mods {
		per += chunks(int64(j.o.ShardSize) * m.winBytes)
	}
	return int(max(1, min(int64(n), (j.o.Mem/4+32<<20)/per)))
}

// pile is a run of output positions [lo, hi) within one shard: pass 1
// appends their samples, in the order it meets them, to the part of the
// shard's files that will hold them, and pass 2 puts them in order there.
type pile struct{ lo, hi int64 }

// piles cuts every shard into piles of at most pileCap samples (of about
// equal size), listing them in the shard's unit.
func piles(units []unit, pileCap int64) []pile {
	var piles []pile
	for u := range units {
		lo, n := units[u].lo, units[u].hi-units[u].lo
		k := (n + pileCap - 1) / pileCap
		for i := int64(0); i < k; i++ {
			units[u].piles = append(units[u].piles, len(piles))
			piles = append(piles, pile{lo + n*i/k, lo + n*(i+1)/k})
		}
	}
	return piles
}

// shardHeader is the .npy header of modality m's file of a shard of n
// samples.
func (j *job) shardHeader(m modInfo, n int) ([]byte, error) {
	return npy.EncodeHeader(m.dtype.Descr(), false, j.shardShape(m, n), npy.DataAlign)
}

// partialDir is where epoch e is written before its commit.
func (j *job) partialDir(e int) string {
	return filepath.Join(j.o.Out, ".partial-"+manifests.EpochDir(e))
}

// Pass 1's limits: the files a writer keeps open, and (if > 0, for tests)
// the bytes read at a time.
var (
	maxOpenShards       = 256
	pass1Chunk    int64 = 0
)

// external is the two-pass shuffle for datasets larger than the memory
// budget. Every shard is cut into piles (runs of its output positions).
// Pass 1 reads every blob once, strictly sequentially, and appends each
// sample (of every planned epoch) to its pile, which lies in the shard's
// own files, where the pile's samples will end up: the appends are
// sequential writes, and no temporary files are needed. In pass 2 a
// worker reads a pile at a time into memory and writes its samples back
// in order over the same bytes, hashing them as it goes.
func (j *job) external(ctx context.Context, s *sink) error {
	workers := j.workers()
	pileCap := max(1, (j.o.Mem/2)/int64(workers)/j.rec)
	units := s.shards
	piles := piles(units, pileCap)
	nm := len(j.mods)
	// Each pile's place in its shard's files: shard (index into units),
	// and the file offset of its first byte in each modality's file.
	shardOf := make([]int, len(piles))
	region := make([]int64, len(piles)*nm)
	paths := make([]string, len(units)*nm)
	if err := s.startUpTo(len(j.epochs) - 1); err != nil {
		return err
	}
	for u, un := range units {
		for k, m := range j.mods {
			hdr, err := j.shardHeader(m, int(un.hi-un.lo))
			if err != nil {
				return err
			}
			paths[u*nm+k] = j.shardPath(un, m.name)
			for _, p := range un.piles {
				shardOf[p] = u
				region[p*nm+k] = int64(len(hdr)) + (piles[p].lo-un.lo)*m.winBytes
			}
		}
	}
	pileOf := func(pos int64) int {
		return sort.Search(len(piles), func(i int) bool { return piles[i].hi > pos })
	}
	defer s.quiesce()

	// Which samples (by global position) come from each clip, in the
	// order pass 1 meets them: by start, then position (a clip larger
	// than a read is read in pieces, in the order of its frames).
	byClip := make([][]int64, len(j.lengths))
	for _, ep := range j.epochs {
		for i, smp := range ep.samples {
			byClip[smp.Clip] = append(byClip[smp.Clip], ep.base+int64(i))
		}
	}
	for _, list := range byClip {
		slices.SortFunc(list, j.passOneOrder)
	}

	// Pass 1: a goroutine reads the blobs a run of clips at a time, in
	// order (strictly sequential reads); for each run, every sample's
	// window in each modality (and zeros after a short one) is appended to
	// its pile with pwritev, by two writers (each owns half of the shards,
	// and keeps their files open, up to a limit).
	limit := max(1<<20, min(8<<20, j.o.Mem/16))
	if pass1Chunk > 0 {
		limit = pass1Chunk
	}
	chunks, stopChunks, err := j.readChunks(limit)
	if err != nil {
		return err
	}
	defer stopChunks()
	type pileWrite struct {
		at     int // pile*nm + modality
		pieces [][]byte
	}
	type batch struct {
		ch    *chunk
		lists [][]pileWrite // per writer
		left  atomic.Int32  // writers not done with it; the last releases ch
	}
	const nWriters = 2
	maxOpen := maxOpenShards             // files each writer keeps open
	offs := make([]int64, len(piles)*nm) // bytes appended to each pile's part of a file
	var writeErr atomic.Pointer[error]
	queues := make([]chan *batch, nWriters)
	var writers sync.WaitGroup
	for w := range queues {
		queues[w] = make(chan *batch, 2)
		writers.Add(1)
		go func() {
			defer writers.Done()
			open := map[int]*os.File{}
			defer func() {
				for _, f := range open {
					f.Close()
				}
			}()
			write := func(pw pileWrite) error {
				file := shardOf[pw.at/nm]*nm + pw.at%nm
				f := open[file]
				if f == nil {
					if len(open) == maxOpen {
						for _, f := range open {
							f.Close()
						}
						clear(open)
					}
					var err error
					if f, err = os.OpenFile(paths[file], os.O_RDWR|os.O_CREATE, 0o644); err != nil {
						return err
					}
					open[file] = f
				}
				n, err := pwritevAll(f, pw.pieces, region[pw.at]+offs[pw.at])
				offs[pw.at] += n
				return err
			}
			for b := range queues[w] {
				for _, pw := range b.lists[w] {
					if writeErr.Load() != nil {
						break
					}
					if err := write(pw); err != nil {
						writeErr.CompareAndSwap(nil, &err)
					}
				}
				if b.left.Add(-1) == 0 {
					b.ch.release()
				}
			}
		}()
	}
	stopWriters := func() error {
		if queues != nil {
			for _, q := range queues {
				close(q)
			}
			writers.Wait()
			queues = nil
		}
		if e := writeErr.Load(); e != nil {
			return *e
		}
		return nil
	}
	defer stopWriters()
	pending := make([][][]byte, len(piles)*nm)
	var touched []int
	var done int64
	c, next := 0, 0 // pass 1's place: the next sample is byClip[c][next]
	for ch := range chunks {
		if ch.err != nil {
			return ch.err
		}
		b := &batch{ch: ch, lists: make([][]pileWrite, nWriters)}
		// The samples that start in the chunk's frames [g0, g1): the next
		// ones of clip c on.
		for ; c < len(byClip) && j.starts[c] < ch.g1; c++ {
			for ; next < len(byClip[c]); next++ {
				pos := byClip[c][next]
				ep, i := j.position(pos)
				smp := ep.samples[i]
				if j.starts[c]+smp.Start >= ch.g1 {
					break
				}
				p := pileOf(pos)
				if len(pending[p*nm]) == 0 {
					touched = append(touched, p)
				}
				for k, m := range j.mods {
					at := p*nm + k
					first := (j.starts[c]+smp.Start)*m.rate - ch.first[k]
					n := smp.Valid * m.rate * m.rowBytes
					if n > 0 {
						pending[at] = append(pending[at], ch.rows[k][first*m.rowBytes:first*m.rowBytes+n])
					}
					if n < m.winBytes {
						pending[at] = append(pending[at], j.zeros[:m.winBytes-n])
					}
				}
				done++
			}
			if next < len(byClip[c]) {
				break // the clip goes on in the next chunk
			}
			byClip[c], next = nil, 0
		}
		for _, p := range touched {
			w := shardOf[p] % nWriters
			for k := range j.mods {
				b.lists[w] = append(b.lists[w], pileWrite{p*nm + k, pending[p*nm+k]})
				pending[p*nm+k] = nil
			}
		}
		touched = touched[:0]
		b.left.Store(nWriters)
		for _, q := range queues {
			q <- b
		}
		if writeErr.Load() != nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if j.o.Progress != nil {
			j.o.Progress(Progress{Phase: "read", Done: done, Total: j.total})
		}
		faults.Point("shuffle.read")
	}
	if err := stopWriters(); err != nil {
		return err
	}
	byClip, pending = nil, nil
	for p := range piles {
		for k, m := range j.mods {
			if want := (piles[p].hi - piles[p].lo) * m.winBytes; offs[p*nm+k] != want {
				return fmt.Errorf("shuffle: internal error: pile %d of %s: %d bytes written, want %d", p, m.name, offs[p*nm+k], want)
			}
		}
	}

	// Pass 2: a worker orders a shard pile by pile.
	s.work = func(u unit, c *cursor) error {
		return j.orderShard(ctx, c, u, piles, paths[u.seq*nm:(u.seq+1)*nm], region)
	}
	for _, u := range units {
		if err := s.submit(u); err != nil {
			return err
		}
	}
	return s.finish()
}

// orderShard puts in order the samples of the shard un, which pass 1
// left in its files (paths, one per modality) as piles, each in the
// order pass 1 met its samples (see passOneOrder); it writes the
// shard's headers and samples file, hashes every file and reports the
// shard.
func (j *job) orderShard(ctx context.Context, c *cursor, un unit, piles []pile, paths []string, region []int64) error {
	n := int(un.hi - un.lo)
	nm := len(j.mods)
	files := make([]*os.File, nm)
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	hashes := make([]hash.Hash, nm)
	for k, m := range j.mods {
		f, err := os.OpenFile(paths[k], os.O_RDWR, 0)
		if err != nil {
			return err
		}
		files[k] = f
		hdr, err := j.shardHeader(m, n)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(hdr, 0); err != nil {
			return err
		}
		hashes[k] = sha256.New()
		hashes[k].Write(hdr)
	}
	var order []int64
	var iov [][]byte
	for _, p := range un.piles {
		if c.s.stop.Load() || ctx.Err() != nil {
			return errStopped
		}
		pl := piles[p]
		// The pile's samples in the order pass 1 appended them.
		order = order[:0]
		for pos := pl.lo; pos < pl.hi; pos++ {
			order = append(order, pos)
		}
		slices.SortFunc(order, j.passOneOrder)
		slot := make([]int64, pl.hi-pl.lo) // slot[pos-lo]: where pos is in the pile
		for i, pos := range order {
			slot[pos-pl.lo] = int64(i)
		}
		for k, m := range j.mods {
			size := (pl.hi - pl.lo) * m.winBytes
			buf := c.buffer(size)
			if _, err := files[k].ReadAt(buf, region[p*nm+k]); err != nil {
				return fmt.Errorf("reading %s back: %w", files[k].Name(), err)
			}
			iov = iov[:0]
			for i := range slot {
				win := buf[slot[i]*m.winBytes : (slot[i]+1)*m.winBytes]
				hashes[k].Write(win)
				iov = append(iov, win)
			}
			if _, err := pwritevAll(files[k], iov, region[p*nm+k]); err != nil {
				return err
			}
			if !j.o.NoFsync {
				// These bytes are final: start their writeback now, so
				// the disk works while the next piles are ordered, and
				// the commit's fsync waits for the last ones only.
				unix.SyncFileRange(int(files[k].Fd()), region[p*nm+k], size, unix.SYNC_FILE_RANGE_WRITE)
			}
		}
	}
	var sums [][2]string
	for k, m := range j.mods {
		if !j.o.NoFsync {
			unix.SyncFileRange(int(files[k].Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE) // the header, and anything left
		}
		err := files[k].Close()
		files[k] = nil
		if err != nil {
			return err
		}
		sums = append(sums, [2]string{j.shardRel(un, m.name), hex.EncodeToString(hashes[k].Sum(nil))})
	}
	return c.report(un, sums)
}

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

// relJoin joins slash paths for manifests.
func relJoin(parts ...string) string { return strings.Join(parts, "/") }

// passOneOrder orders global positions as pass 1 meets their samples: by
// clip, start, then position.
func (j *job) passOneOrder(a, b int64) int {
	ea, ia := j.position(a)
	eb, ib := j.position(b)
	sa, sb := ea.samples[ia], eb.samples[ib]
	return cmp.Or(cmp.Compare(sa.Clip, sb.Clip), cmp.Compare(sa.Start, sb.Start), cmp.Compare(a, b))
}

// chunk is a run of the dataset's frames, read from every modality's
// blob: the samples that start in frames [g0, g1) (global frame numbers,
// as in index.npy) are cut from it. rows[k] holds blob k's rows from row
// first[k] = g0*rate on, through frame g1 plus a window (or the end).
type chunk struct {
	g0, g1 int64
	first  []int64
	rows   [][]byte
	err    error
	free   chan<- *chunk
}

// release hands the chunk's buffers back to the reader.
func (c *chunk) release() { c.free <- c }

// readChunks reads the dataset's frames in order, in runs of about limit
// bytes over all modalities (a clip larger than that is read in pieces),
// from a goroutine that runs up to three runs ahead of the receiver, which
// releases each run when done with it; stop ends the goroutine. Reads are
// sequential: each run starts where the last one's frames end, and also
// reads the window after them again (those rows were just read, and are
// in the page cache), so that every sample that starts in a run lies
// whole in it. The buffers are bounded by limit plus a window, whatever
// the size of a clip.
func (j *job) readChunks(limit int64) (<-chan *chunk, func(), error) {
	var files []*os.File
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, m := range j.mods {
		f, _, err := regfile.Open(filepath.Join(j.o.Dataset, m.file))
		if err != nil {
			closeFiles()
			return nil, nil, err
		}
		files = append(files, f)
	}
	const sets = 4
	out := make(chan *chunk, sets)
	free := make(chan *chunk, sets)
	for range sets {
		free <- &chunk{rows: make([][]byte, len(j.mods)), first: make([]int64, len(j.mods)), free: free}
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	var frameBytes int64 // all modalities' bytes for one clip frame
	for _, m := range j.mods {
		frameBytes += m.rate * m.rowBytes
	}
	total := j.ds.Frames
	w := int64(j.o.Sampling.Window)
	step := max(1, limit/max(1, frameBytes)) // frames a run starts
	clipAt := func(g int64) int {            // the clip frame g belongs to
		return sort.Search(len(j.starts), func(c int) bool { return j.starts[c]+j.lengths[c] > g })
	}
	go func() {
		defer close(finished)
		defer close(out)
		defer closeFiles()
		for g0 := int64(0); g0 < total; g0 += step {
			g1 := min(total, g0+step)
			end := min(total, g1+w)
			var ch *chunk
			select {
			case ch = <-free:
			case <-quit:
				return
			}
			ch.g0, ch.g1 = g0, g1
			for k, m := range j.mods {
				first := g0 * m.rate
				n := (end - g0) * m.rate * m.rowBytes
				ch.first[k] = first
				if int64(cap(ch.rows[k])) < n {
					ch.rows[k] = make([]byte, n, max(n, (step+w)*m.rate*m.rowBytes))
				}
				ch.rows[k] = ch.rows[k][:n]
				if _, err := files[k].ReadAt(ch.rows[k], m.dataOffset+first*m.rowBytes); err != nil {
					ch.err = readErr(files[k].Name(), m.dataOffset+first*m.rowBytes, clipAt(g0), err)
					break
				}
			}
			select {
			case out <- ch:
			case <-quit:
				return
			}
			if ch.err != nil {
				return
			}
		}
	}()
	stop := func() {
		select {
		case <-quit:
			return
		default:
		}
		close(quit)
		<-finished
	}
	return out, stop, nil
}

// pwritevAll writes the pieces at off with as few pwritev calls as the
// kernel's 1024 pieces a call allow; it returns the bytes written.
func pwritevAll(f *os.File, pieces [][]byte, off int64) (int64, error) {
	fd := int(f.Fd())
	var total int64
	for len(pieces) > 0 {
		batch := pieces[:min(len(pieces), 1024)]
		n, err := unix.Pwritev(fd, batch, off+total)
		if err != nil {
			return total, fmt.Errorf("writing %s: %w", f.Name(), err)
		}
		total += int64(n)
		// Drop what was written (a short write resumes mid-piece).
		for n > 0 && len(pieces) > 0 {
			if n >= len(pieces[0]) {
				n -= len(pieces[0])
				pieces = pieces[1:]
			} else {
				pieces[0] = pieces[0][n:]
				n = 0
			}
		}
	}
	return total, nil
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
