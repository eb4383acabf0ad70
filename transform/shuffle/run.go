package shuffle

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
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
	Sampling   Sampling
	WorldSize  int   // ranks; default 1
	ShardSize  int   // samples per shard file; default 1024
	Mem        int64 // memory budget in bytes; default 2 GiB
	Workers    int   // shard writers; default GOMAXPROCS, at most 8 (fewer if --mem is small)
	Force      bool
	// NoFsync skips the fsync of the shard files before an epoch is
	// committed, and writes them through the page cache: a killed run
	// still leaves nothing half-written under a final name, but a power
	// cut may cost committed epochs their data.
	NoFsync bool

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
	Manifest  *Epochs
	Done      []int // epochs written by this run
	Skipped   []int // epochs already complete
	External  bool  // the two-pass path was used
	Bytes     int64 // bytes written
	Dropped   map[int]int
	Elapsed   time.Duration
	UpToDate  bool
	Replaced  int   // stale epochs removed (dataset rebuilt since, or --force)
	Planned   int64 // bytes the run was going to write
	DataBytes int64 // dataset blob bytes
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
	index   int // in job.epochs
	epoch   int
	samples []Sample // shuffled, cut to perRank*worldSize
	perRank int
	dropped int
	base    int64 // global position of the first sample
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
	man     *Epochs
	// replaced counts stale epochs removed because the dataset changed (or
	// --force replaced other options' epochs).
	replaced int
	work     string // pile directory of the external path
}

// Run writes epochs [o.EpochStart, o.EpochEnd) of shuffled shards into
// o.Out. Epochs already complete in o.Out (same dataset and options) are
// skipped; each epoch is committed atomically.
func Run(ctx context.Context, o Options) (*Result, error) {
	began := time.Now()
	j, err := newJob(o)
	if err != nil {
		return nil, err
	}
	res := &Result{Dir: j.o.Out, Dropped: map[int]int{}, Replaced: j.replaced}
	var todo []int
	for e := j.o.EpochStart; e < j.o.EpochEnd; e++ {
		if j.man.has(e) && !j.o.Force {
			res.Skipped = append(res.Skipped, e)
			continue
		}
		todo = append(todo, e)
	}
	if len(todo) == 0 {
		res.UpToDate, res.Manifest, res.Elapsed = true, j.man, time.Since(began)
		return res, nil
	}
	// Count each epoch's samples first (the lists themselves are derived
	// again per group): the sample lists of all epochs at once could
	// outgrow the memory budget on a large dataset.
	type count struct{ epoch, kept int }
	var counts []count
	for _, e := range todo {
		all := Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		per, dropped := RankSplit(len(all), j.o.WorldSize)
		res.Dropped[e] = dropped
		counts = append(counts, count{e, per * j.o.WorldSize})
		res.Planned += j.epochBytes(per)
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
	// Epochs are processed in groups whose sample metadata (about
	// sampleMeta bytes a sample) fits a quarter of --mem; the blobs are
	// read once per group. The in-memory path needs the blobs to fit the
	// other three quarters.
	metaBudget := j.o.Mem / 4
	res.External = res.DataBytes > j.o.Mem-metaBudget
	var groups [][]int
	var pileBytes int64 // the external path's piles of the largest group
	for g := 0; g < len(counts); {
		var group []int
		var meta, kept int64
		for g < len(counts) && (len(group) == 0 || meta+int64(counts[g].kept)*sampleMeta <= metaBudget) {
			group = append(group, counts[g].epoch)
			meta += int64(counts[g].kept) * sampleMeta
			kept += int64(counts[g].kept)
			g++
		}
		groups = append(groups, group)
		if res.External {
			pileBytes = max(pileBytes, kept*(8+j.rec))
		}
	}
	if err := checkSpace(j.o.Out, res.Planned, pileBytes); err != nil {
		return nil, err
	}
	// Claim the epochs: two runs must not write the same epoch at once
	// (array tasks share the directory, each with its own epochs).
	release, err := claimEpochs(j.o.Out, todo)
	if err != nil {
		return nil, err
	}
	defer release()
	// Leftovers of a killed run of these epochs. Other epochs' partial
	// directories may belong to a run writing them right now: they are
	// left alone.
	for _, e := range todo {
		os.RemoveAll(filepath.Join(j.o.Out, ".partial-"+epochDir(e)))
	}
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
		j.work = filepath.Join(j.o.Out, fmt.Sprintf(".work-%04d-%04d", group[0], group[len(group)-1]))
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
	if o.WorldSize == 0 {
		o.WorldSize = 1
	}
	if o.ShardSize == 0 {
		o.ShardSize = 1024
	}
	if o.Mem == 0 {
		o.Mem = 2 << 30
	}
	if o.WorldSize < 1 || o.WorldSize > 99 || o.ShardSize < 1 || o.Mem < 64<<10 {
		return nil, fmt.Errorf("%w: --world-size %d, --shard-samples %d, --mem %d: want 1..99, >= 1, >= 64KiB", ErrUsage, o.WorldSize, o.ShardSize, o.Mem)
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
	j := &job{o: o, ds: ds, starts: starts, lengths: lengths}
	for _, m := range ds.Modalities {
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
func (j *job) checkBlob(m modInfo, rows int64) error {
	path := filepath.Join(j.o.Dataset, m.file)
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	need := m.dataOffset + rows*m.rowBytes
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
		all := Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		per, dropped := RankSplit(len(all), j.o.WorldSize)
		ep := epochPlan{index: len(j.epochs), epoch: e, samples: all[:per*j.o.WorldSize], perRank: per, dropped: dropped, base: base}
		base += int64(len(ep.samples))
		j.epochs = append(j.epochs, ep)
	}
	j.total = base
}

// sampleMeta is the memory a planned sample takes: its Sample in the
// epoch's list and, on the external path, its position in the per-clip
// index.
const sampleMeta = 32

// epochBytes is what the shards of an epoch with perRank samples per rank
// take on disk.
func (j *job) epochBytes(perRank int) int64 {
	n := int64(perRank) * int64(j.o.WorldSize)
	shards := int64(0)
	if perRank > 0 {
		shards = int64(j.o.WorldSize) * int64((perRank+j.o.ShardSize-1)/j.o.ShardSize)
	}
	return n*(j.rec+24) + shards*int64(len(j.mods)+1)*npy.DataAlign
}

// checkSpace refuses to start when the filesystem of out lacks the room
// for the shards and, on the external path, the piles (temporary, in out).
func checkSpace(out string, shards, piles int64) error {
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
	if free < shards+piles {
		what := "for the shards"
		if piles > 0 {
			what = fmt.Sprintf("for the shards (%d) and the external shuffle's temporary piles (%d)", shards, piles)
		}
		return fmt.Errorf("%w: %s needs %d bytes %s, the filesystem has %d free", ErrUsage, out, shards+piles, what, free)
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
		f, err := os.Open(filepath.Join(j.o.Dataset, m.file))
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
		win := make([][]byte, len(j.mods))
		for pos := u.lo; pos < u.hi; pos++ {
			if (pos-u.lo)%1024 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			ep, i := j.position(pos)
			smp := ep.samples[i]
			for k, m := range j.mods {
				win[k] = rows(k, (j.starts[smp.Clip]+smp.Start)*m.rate, smp.Valid*m.rate)
			}
			if err := c.put(pos, win); err != nil {
				return err
			}
		}
		return nil
	}
	defer s.quiesce()
	var err error
	j.eachShard(func(_ int, lo, hi int64) {
		if err == nil {
			err = s.submit(unit{lo: lo, hi: hi})
		}
	})
	if err != nil {
		return err
	}
	return s.finish()
}

// workers is the number of shard writers: o.Workers (default GOMAXPROCS,
// at most 8). Unless --no-fsync, fewer when the budget cannot hold their
// buffers (blob.Writer's chunks, for each of a shard's files; with
// --no-fsync a worker writes from the mapped pile or the loaded blobs).
func (j *job) workers() int {
	n := j.o.Workers
	if n <= 0 {
		n = min(runtime.GOMAXPROCS(0), 8)
	}
	if j.o.NoFsync {
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

// pile is a run of output positions [lo, hi) whose samples pass 1 collects
// in one file.
type pile struct{ lo, hi int64 }

// piles cuts the output positions into piles of at most pileCap samples
// along shard boundaries, and groups them into units: a pile holds whole
// shards of one epoch (one unit), or a shard too large for one pile is
// cut into piles that make one unit (one worker writes it, pile by pile).
func (j *job) piles(pileCap int64) ([]pile, []unit) {
	var piles []pile
	var units []unit
	open, openEp := false, -1
	j.eachShard(func(e int, lo, hi int64) {
		n := hi - lo
		if n > pileCap {
			open = false
			u := unit{lo: lo, hi: hi}
			k := (n + pileCap - 1) / pileCap
			for i := int64(0); i < k; i++ {
				u.piles = append(u.piles, len(piles))
				piles = append(piles, pile{lo + n*i/k, lo + n*(i+1)/k})
			}
			units = append(units, u)
			return
		}
		if open && openEp == e && hi-units[len(units)-1].lo <= pileCap {
			units[len(units)-1].hi = hi
			piles[len(piles)-1].hi = hi
			return
		}
		open, openEp = true, e
		units = append(units, unit{lo: lo, hi: hi, piles: []int{len(piles)}})
		piles = append(piles, pile{lo, hi})
	})
	return piles, units
}

// external is the two-pass shuffle for datasets larger than the memory
// budget. Pass 1 reads every blob once, strictly sequentially, and appends
// each sample (of every planned epoch) to the pile that holds its output
// position; in pass 2 each worker maps one pile at a time and writes its
// samples in order.
func (j *job) external(ctx context.Context, s *sink) error {
	recDisk := 8 + j.rec
	workers := j.workers()
	pileCap := max(1, (j.o.Mem/2)/int64(workers)/recDisk)
	piles, units := j.piles(pileCap)
	nPiles := len(piles)
	pileOf := func(pos int64) int {
		return sort.Search(len(piles), func(i int) bool { return piles[i].hi > pos })
	}
	work := j.work
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// The piles live in two files, one per pass-1 writer (pile p in file
	// p%2, so the writers never share a file's lock), each pile in a
	// page-aligned region of its own: the open files stay two however
	// many piles a large dataset needs.
	const nWriters = 2
	files := make([]*os.File, nWriters)
	for w := range files {
		f, err := os.Create(filepath.Join(work, fmt.Sprintf("piles-%d", w)))
		if err != nil {
			return err
		}
		defer f.Close()
		files[w] = f
	}
	base := make([]int64, nPiles)
	var ends [nWriters]int64
	for p, pl := range piles {
		base[p] = ends[p%nWriters]
		ends[p%nWriters] += ((pl.hi-pl.lo)*recDisk + 4095) &^ 4095
	}
	// Deferred calls run in reverse: the workers stop before the pile
	// removals are waited for, and both before the piles are closed.
	var removing sync.WaitGroup
	defer removing.Wait()
	defer s.quiesce()

	// Which samples (by global position) come from each clip, in order.
	byClip := make([][]int64, len(j.lengths))
	for _, ep := range j.epochs {
		for i, smp := range ep.samples {
			byClip[smp.Clip] = append(byClip[smp.Clip], ep.base+int64(i))
		}
	}

	// Pass 1: a goroutine reads the blobs a run of clips at a time, in
	// order (strictly sequential reads); for each run, every sample
	// becomes a list of pieces of the run's buffers (its position before
	// them, zeros after a short window) appended to its pile with
	// pwritev, by two writers (each owns half of the piles).
	chunks, stopChunks, err := j.readChunks(max(1<<20, min(8<<20, j.o.Mem/16)))
	if err != nil {
		return err
	}
	defer stopChunks()
	type pileWrite struct {
		p      int
		pieces [][]byte
	}
	type batch struct {
		ch    *chunk
		heads []byte
		lists [][]pileWrite // per writer
		left  atomic.Int32  // writers not done with it; the last releases ch
	}
	offs := make([]int64, nPiles) // bytes appended to each pile
	var writeErr atomic.Pointer[error]
	queues := make([]chan *batch, nWriters)
	var writers sync.WaitGroup
	for w := range queues {
		queues[w] = make(chan *batch, 2)
		writers.Add(1)
		go func() {
			defer writers.Done()
			for b := range queues[w] {
				for _, pw := range b.lists[w] {
					if writeErr.Load() != nil {
						break
					}
					n, err := pwritevAll(files[w], pw.pieces, base[pw.p]+offs[pw.p])
					offs[pw.p] += n
					if err != nil {
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
	pending := make([][][]byte, nPiles)
	var touched []int
	var done int64
	for ch := range chunks {
		if ch.err != nil {
			return ch.err
		}
		var nHeads int
		for c := ch.c0; c < ch.c1; c++ {
			nHeads += len(byClip[c])
		}
		b := &batch{ch: ch, heads: make([]byte, 8*nHeads), lists: make([][]pileWrite, nWriters)}
		h := 0
		for c := ch.c0; c < ch.c1; c++ {
			for _, pos := range byClip[c] {
				ep, i := j.position(pos)
				smp := ep.samples[i]
				p := pileOf(pos)
				if len(pending[p]) == 0 {
					touched = append(touched, p)
				}
				binary.LittleEndian.PutUint64(b.heads[h:], uint64(pos))
				pending[p] = append(pending[p], b.heads[h:h+8])
				h += 8
				for k, m := range j.mods {
					first := (j.starts[c]+smp.Start)*m.rate - ch.first[k]
					n := smp.Valid * m.rate * m.rowBytes
					if n > 0 {
						pending[p] = append(pending[p], ch.rows[k][first*m.rowBytes:first*m.rowBytes+n])
					}
					if n < m.winBytes {
						pending[p] = append(pending[p], j.zeros[:m.winBytes-n])
					}
				}
				done++
			}
			byClip[c] = nil
		}
		for _, p := range touched {
			b.lists[p%nWriters] = append(b.lists[p%nWriters], pileWrite{p, pending[p]})
			pending[p] = nil
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
	}
	if err := stopWriters(); err != nil {
		return err
	}
	byClip, pending = nil, nil

	// Pass 2: the workers map a pile at a time (the pages are in the page
	// cache, just written) and write its samples in order.
	s.work = func(u unit, c *cursor) error {
		for _, p := range u.piles {
			f, size := files[p%nWriters], (piles[p].hi-piles[p].lo)*recDisk
			if offs[p] != size {
				return fmt.Errorf("pile %d: %d bytes written, want %d", p, offs[p], size)
			}
			if err := j.writePile(f, base[p], piles[p], recDisk, c); err != nil {
				return fmt.Errorf("pile %d: %w", p, err)
			}
			// Free the pile's pages now (a few ms: not on this goroutine);
			// where holes cannot be punched, the removal of the files at
			// the end frees them.
			removing.Add(1)
			go func() {
				defer removing.Done()
				unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, base[p], (size+4095)&^4095)
			}()
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		return nil
	}
	for _, u := range units {
		if err := s.submit(u); err != nil {
			return err
		}
	}
	return s.finish() // before the piles are closed and removed
}

// writePile maps the pile at offset off of f, holding the samples of
// positions [pl.lo, pl.hi) as records (position, then the sample's
// windows) in any order, and puts them in order.
func (j *job) writePile(f *os.File, off int64, pl pile, recDisk int64, c *cursor) error {
	n := pl.hi - pl.lo
	data, err := unix.Mmap(int(f.Fd()), off, int(n*recDisk), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(data)
	slot := make([]int64, n)
	for i := range slot {
		slot[i] = -1
	}
	for i := int64(0); i < n; i++ {
		pos := int64(binary.LittleEndian.Uint64(data[i*recDisk:]))
		if pos < pl.lo || pos >= pl.hi || slot[pos-pl.lo] >= 0 {
			return fmt.Errorf("record %d: position %d outside [%d, %d) or repeated", i, pos, pl.lo, pl.hi)
		}
		slot[pos-pl.lo] = i
	}
	win := make([][]byte, len(j.mods))
	for pos := pl.lo; pos < pl.hi; pos++ {
		at := slot[pos-pl.lo]*recDisk + 8
		for k, m := range j.mods {
			win[k] = data[at : at+m.winBytes]
			at += m.winBytes
		}
		if err := c.put(pos, win); err != nil {
			return err
		}
	}
	return c.flush() // before the pile is unmapped
}

// LockPrefix starts the names of the per-epoch lock files in an epochs
// directory; they exist only while a run writes those epochs (or after it
// was killed) and are not part of the output.
const LockPrefix = ".lock-epoch-"

// claimEpochs takes a non-blocking exclusive flock on a lock file per
// epoch, and returns the func that releases (and removes) them.
func claimEpochs(out string, epochs []int) (func(), error) {
	var held []*os.File
	release := func() {
		for _, f := range held {
			os.Remove(f.Name())
			f.Close()
		}
	}
	// Lock files left by killed runs: removable when nobody holds them.
	// (Another run probing them this way holds such a lock for a moment;
	// a claim below retries past that.)
	if entries, err := os.ReadDir(out); err == nil {
		for _, ent := range entries {
			if !strings.HasPrefix(ent.Name(), LockPrefix) {
				continue
			}
			p := filepath.Join(out, ent.Name())
			if f, err := os.Open(p); err == nil {
				if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil && sameFile(f, p) {
					os.Remove(p)
				}
				f.Close()
			}
		}
	}
	for _, e := range epochs {
		p := filepath.Join(out, fmt.Sprintf("%s%04d", LockPrefix, e))
		f, err := lockFile(p)
		if err != nil {
			release()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: epoch %d is being written by another shuffle into %s (lock %s)", ErrUsage, e, out, p)
			}
			return nil, err
		}
		held = append(held, f)
	}
	return release, nil
}

func shardName(shard int, what string) string {
	return fmt.Sprintf("shard-%05d.%s.npy", shard, what)
}

func epochDir(e int) string { return fmt.Sprintf("epoch-%04d", e) }

func rankDir(r int) string { return fmt.Sprintf("rank-%02d", r) }

// lockFile creates (or opens) the lock file p and takes a non-blocking
// exclusive flock on it, making sure the lock is on the file that p names
// (a run removing a stale lock may have unlinked it meanwhile). A lock
// held for a moment by such a run is waited out; one held longer fails
// with EWOULDBLOCK.
func lockFile(p string) (*os.File, error) {
	var err error
	for try := 0; try < 20; try++ {
		if try > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		var f *os.File
		if f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644); err != nil {
			return nil, err
		}
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if !errors.Is(err, unix.EWOULDBLOCK) {
				return nil, err
			}
			continue
		}
		if sameFile(f, p) {
			return f, nil
		}
		f.Close() // unlinked by a stale-lock cleanup: take the new one
		err = fmt.Errorf("%s keeps being replaced", p)
	}
	return nil, err
}

// sameFile reports whether the open file f is the one path p names.
func sameFile(f *os.File, p string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(p)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// relJoin joins slash paths for manifests.
func relJoin(parts ...string) string { return strings.Join(parts, "/") }

// chunk is a run of clips [c0, c1) of the dataset, read from every
// modality's blob: rows[k] holds blob k's rows from row first[k] on.
type chunk struct {
	c0, c1 int
	first  []int64
	rows   [][]byte
	err    error
	free   chan<- *chunk
}

// release hands the chunk's buffers back to the reader.
func (c *chunk) release() { c.free <- c }

// readChunks reads the dataset's clips in order, strictly sequentially,
// runs of clips of about limit bytes (one clip if larger), from a
// goroutine that runs up to three runs ahead of the receiver, which
// releases each run when done with it; stop ends the goroutine.
func (j *job) readChunks(limit int64) (<-chan *chunk, func(), error) {
	var files []*os.File
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, m := range j.mods {
		f, err := os.Open(filepath.Join(j.o.Dataset, m.file))
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
	clipBytes := func(c int) int64 { return j.lengths[c] * frameBytes }
	go func() {
		defer close(finished)
		defer close(out)
		defer closeFiles()
		for c0 := 0; c0 < len(j.lengths); {
			c1, size := c0+1, clipBytes(c0)
			for c1 < len(j.lengths) && size+clipBytes(c1) <= limit {
				size += clipBytes(c1)
				c1++
			}
			var ch *chunk
			select {
			case ch = <-free:
			case <-quit:
				return
			}
			ch.c0, ch.c1 = c0, c1
			for k, m := range j.mods {
				first := j.starts[c0] * m.rate
				n := ((j.starts[c1-1]+j.lengths[c1-1])*m.rate - first) * m.rowBytes
				ch.first[k] = first
				if int64(cap(ch.rows[k])) < n {
					// The modality's share of limit (runs differ a little).
					share := limit * m.rate * m.rowBytes / frameBytes
					ch.rows[k] = make([]byte, n, max(n, share+share/8))
				}
				ch.rows[k] = ch.rows[k][:n]
				if _, err := files[k].ReadAt(ch.rows[k], m.dataOffset+first*m.rowBytes); err != nil {
					ch.err = readErr(files[k].Name(), m.dataOffset+first*m.rowBytes, c0, err)
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
			c0 = c1
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
