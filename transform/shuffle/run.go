package shuffle

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/array"
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
	Force      bool

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
	rec     int64 // bytes of one sample across modalities
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
	if err := checkSpace(j.o.Out, res.Planned); err != nil {
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
	// Epochs are processed in groups whose sample metadata (about
	// sampleMeta bytes a sample) fits a quarter of --mem; the blobs are
	// read once per group. The in-memory path needs the blobs to fit the
	// other three quarters.
	metaBudget := j.o.Mem / 4
	res.External = res.DataBytes > j.o.Mem-metaBudget
	var bytes int64
	for g := 0; g < len(counts); {
		var group []int
		var meta int64
		for g < len(counts) && (len(group) == 0 || meta+int64(counts[g].kept)*sampleMeta <= metaBudget) {
			group = append(group, counts[g].epoch)
			meta += int64(counts[g].kept) * sampleMeta
			g++
		}
		j.plan(group)
		j.work = filepath.Join(j.o.Out, fmt.Sprintf(".work-%04d-%04d", group[0], group[len(group)-1]))
		s := newSink(j)
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
		j.mods = append(j.mods, mi)
		j.rec += mi.winBytes
	}
	if j.man, err = openManifest(j); err != nil {
		return nil, err
	}
	return j, nil
}

// plan derives the samples of every epoch to write.
func (j *job) plan(epochs []int) {
	j.epochs = nil
	var base int64
	for _, e := range epochs {
		all := Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		per, dropped := RankSplit(len(all), j.o.WorldSize)
		ep := epochPlan{epoch: e, samples: all[:per*j.o.WorldSize], perRank: per, dropped: dropped, base: base}
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

// checkSpace refuses to start when the filesystem of out lacks the room.
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
		return fmt.Errorf("%w: %s needs %d bytes for the shards, the filesystem has %d free", ErrUsage, out, need, free)
	}
	return nil
}

// position maps a global output position to its epoch plan and index.
func (j *job) position(pos int64) (*epochPlan, int) {
	i := sort.Search(len(j.epochs), func(i int) bool { return j.epochs[i].base > pos }) - 1
	ep := &j.epochs[i]
	return ep, int(pos - ep.base)
}

// fill writes sample s's window of every modality into rec, reading clip
// rows through rows(mod, firstRow, n) and zero-filling past s.Valid.
func (j *job) fill(rec []byte, s Sample, rows func(k int, first, n int64) []byte) {
	off := int64(0)
	for k, m := range j.mods {
		first := (j.starts[s.Clip] + s.Start) * m.rate
		n := s.Valid * m.rate
		src := rows(k, first, n)
		c := copy(rec[off:off+m.winBytes], src)
		clear(rec[off+int64(c) : off+m.winBytes])
		off += m.winBytes
	}
}

// gatherInMemory loads every blob and writes the samples in order.
func (j *job) gatherInMemory(ctx context.Context, s *sink) error {
	blobs := make([][]byte, len(j.mods))
	for k, m := range j.mods {
		rows := j.ds.Modality(m.name).Rows
		f, err := os.Open(filepath.Join(j.o.Dataset, m.file))
		if err != nil {
			return err
		}
		blobs[k] = make([]byte, rows*m.rowBytes)
		_, err = f.ReadAt(blobs[k], m.dataOffset)
		f.Close()
		if err != nil {
			return fmt.Errorf("reading %s: %w", m.file, err)
		}
	}
	rec := make([]byte, j.rec)
	rows := func(k int, first, n int64) []byte {
		rb := j.mods[k].rowBytes
		return blobs[k][first*rb : (first+n)*rb]
	}
	for pos := int64(0); pos < j.total; pos++ {
		if pos%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		ep, i := j.position(pos)
		j.fill(rec, ep.samples[i], rows)
		if err := s.put(pos, rec); err != nil {
			return err
		}
	}
	return nil
}

// external is the two-pass shuffle for datasets larger than the memory
// budget. Pass 1 reads every blob once, strictly sequentially, and appends
// each sample (of every planned epoch) to the pile that holds its output
// position; pass 2 loads one pile at a time, puts its samples in order and
// writes them.
func (j *job) external(ctx context.Context, s *sink) error {
	recDisk := 8 + j.rec
	pileCap := max(1, (j.o.Mem/2)/j.rec)
	nPiles := (j.total + pileCap - 1) / pileCap
	work := j.work
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bufSize := int(max(64<<10, min(4<<20, (j.o.Mem/4)/max(1, nPiles))))
	piles := make([]*os.File, nPiles)
	for p := range piles {
		f, err := os.Create(filepath.Join(work, fmt.Sprintf("pile-%05d", p)))
		if err != nil {
			return err
		}
		defer f.Close()
		piles[p] = f
	}
	pw := newPileWriter(piles, bufSize)
	defer pw.close()

	// Which samples (by global position) come from each clip, in order.
	byClip := make([][]int64, len(j.lengths))
	for _, ep := range j.epochs {
		for i, smp := range ep.samples {
			byClip[smp.Clip] = append(byClip[smp.Clip], ep.base+int64(i))
		}
	}

	// Pass 1: sequential read, clip by clip, by a goroutine one clip ahead;
	// the piles are appended to by another.
	cr, err := j.newClipReader()
	if err != nil {
		return err
	}
	defer cr.close()
	rec := make([]byte, recDisk)
	var done int64
	for c, refs := range byClip {
		clipBufs, err := cr.next()
		if err != nil {
			return err
		}
		rows := func(k int, first, n int64) []byte {
			rb := j.mods[k].rowBytes
			local := first - j.starts[c]*j.mods[k].rate
			return clipBufs[k][local*rb : (local+n)*rb]
		}
		for _, pos := range refs {
			ep, i := j.position(pos)
			binary.LittleEndian.PutUint64(rec, uint64(pos))
			j.fill(rec[8:], ep.samples[i], rows)
			pw.write(int(pos/pileCap), rec)
			done++
		}
		cr.release()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if j.o.Progress != nil && c%64 == 0 {
			j.o.Progress(Progress{Phase: "read", Done: done, Total: j.total})
		}
	}
	cr.close()
	if err := pw.close(); err != nil {
		return err
	}
	byClip = nil

	// Pass 2: one pile at a time, read with one read, written in order.
	var removing sync.WaitGroup
	defer removing.Wait()
	buf := make([]byte, pileCap*recDisk)
	slot := make([]int64, pileCap)
	for p := int64(0); p < nPiles; p++ {
		lo := p * pileCap
		hi := min(lo+pileCap, j.total)
		n := hi - lo
		if _, err := piles[p].ReadAt(buf[:n*recDisk], 0); err != nil {
			return fmt.Errorf("reading pile %d: %w", p, err)
		}
		for i := int64(0); i < n; i++ {
			pos := int64(binary.LittleEndian.Uint64(buf[i*recDisk:]))
			if pos < lo || pos >= hi {
				return fmt.Errorf("pile %d: position %d outside [%d, %d)", p, pos, lo, hi)
			}
			slot[pos-lo] = i
		}
		piles[p].Close()
		// Freeing a pile's pages takes a few ms: not on this goroutine.
		removing.Add(1)
		go func(name string) {
			defer removing.Done()
			os.Remove(name)
		}(piles[p].Name())
		for pos := lo; pos < hi; pos++ {
			at := slot[pos-lo]*recDisk + 8
			if err := s.put(pos, buf[at:at+j.rec]); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
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
	if entries, err := os.ReadDir(out); err == nil {
		for _, ent := range entries {
			if !strings.HasPrefix(ent.Name(), LockPrefix) {
				continue
			}
			p := filepath.Join(out, ent.Name())
			if f, err := os.Open(p); err == nil {
				if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
					os.Remove(p)
				}
				f.Close()
			}
		}
	}
	for _, e := range epochs {
		p := filepath.Join(out, fmt.Sprintf("%s%04d", LockPrefix, e))
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			release()
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			release()
			return nil, fmt.Errorf("%w: epoch %d is being written by another shuffle into %s (lock %s)", ErrUsage, e, out, p)
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

// relJoin joins slash paths for manifests.
func relJoin(parts ...string) string { return strings.Join(parts, "/") }

// clipReader reads the dataset's clips in order, every modality strictly
// sequentially, one clip ahead of its caller (two sets of clip buffers).
type clipReader struct {
	sets  chan clipSet
	free  chan [][]byte
	stop  chan struct{}
	done  chan struct{}
	cur   [][]byte
	files []*os.File
}

type clipSet struct {
	bufs [][]byte
	err  error
}

func (j *job) newClipReader() (*clipReader, error) {
	cr := &clipReader{sets: make(chan clipSet, 1), free: make(chan [][]byte, 2), stop: make(chan struct{}), done: make(chan struct{})}
	readers := make([]*bufio.Reader, len(j.mods))
	for k, m := range j.mods {
		f, err := os.Open(filepath.Join(j.o.Dataset, m.file))
		if err != nil {
			cr.closeFiles()
			return nil, err
		}
		cr.files = append(cr.files, f)
		readers[k] = bufio.NewReaderSize(io.NewSectionReader(f, m.dataOffset, 1<<62), 4<<20)
	}
	cr.free <- make([][]byte, len(j.mods))
	cr.free <- make([][]byte, len(j.mods))
	go func() {
		defer close(cr.done)
		for c := range j.lengths {
			var bufs [][]byte
			select {
			case bufs = <-cr.free:
			case <-cr.stop:
				return
			}
			var err error
			for k, m := range j.mods {
				n := j.lengths[c] * m.rate * m.rowBytes
				if int64(cap(bufs[k])) < n {
					bufs[k] = make([]byte, n)
				}
				bufs[k] = bufs[k][:n]
				if _, err = io.ReadFull(readers[k], bufs[k]); err != nil {
					err = fmt.Errorf("reading %s at clip %d: %w", m.file, c, err)
					break
				}
			}
			select {
			case cr.sets <- clipSet{bufs, err}:
			case <-cr.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return cr, nil
}

// next returns the next clip's rows per modality, valid until release.
func (cr *clipReader) next() ([][]byte, error) {
	s := <-cr.sets
	cr.cur = s.bufs
	return s.bufs, s.err
}

func (cr *clipReader) release() { cr.free <- cr.cur }

func (cr *clipReader) close() {
	if cr.files == nil {
		return
	}
	close(cr.stop)
	<-cr.done
	cr.closeFiles()
	cr.files, cr.cur = nil, nil
	for len(cr.free) > 0 {
		<-cr.free
	}
	for len(cr.sets) > 0 {
		<-cr.sets
	}
}

func (cr *clipReader) closeFiles() {
	for _, f := range cr.files {
		f.Close()
	}
}

// pileWriter appends records to the piles through per-pile buffers; full
// buffers are written by a goroutine of its own while the caller fills
// others (spare buffers let it run ahead).
type pileWriter struct {
	files  []*os.File
	bufs   [][]byte
	free   chan []byte
	out    chan pileBuf
	done   chan error
	closed bool
	err    error
}

type pileBuf struct {
	pile int
	b    []byte
}

const spareBufs = 4

func newPileWriter(files []*os.File, size int) *pileWriter {
	w := &pileWriter{files: files, bufs: make([][]byte, len(files)), free: make(chan []byte, len(files)+spareBufs),
		out: make(chan pileBuf, len(files)+spareBufs), done: make(chan error, 1)}
	for p := range w.bufs {
		w.bufs[p] = make([]byte, 0, size)
	}
	for range spareBufs {
		w.free <- make([]byte, 0, size)
	}
	go func() {
		var err error
		for pb := range w.out {
			if err == nil {
				_, err = w.files[pb.pile].Write(pb.b)
			}
			w.free <- pb.b[:0]
		}
		w.done <- err
	}()
	return w
}

func (w *pileWriter) write(p int, rec []byte) {
	for len(rec) > 0 {
		b := w.bufs[p]
		n := copy(b[len(b):cap(b)], rec)
		b = b[:len(b)+n]
		rec = rec[n:]
		if len(b) == cap(b) {
			w.out <- pileBuf{p, b}
			b = <-w.free
		}
		w.bufs[p] = b
	}
}

// close writes what is buffered and waits for the writer; it returns the
// first write error. Later calls return the same.
func (w *pileWriter) close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	for p, b := range w.bufs {
		if len(b) > 0 {
			w.out <- pileBuf{p, b}
		}
	}
	close(w.out)
	w.err = <-w.done
	// Drop the buffers: pass 2 needs the memory.
	w.bufs = nil
	for len(w.free) > 0 {
		<-w.free
	}
	return w.err
}
