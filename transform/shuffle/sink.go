package shuffle

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// openManifest loads o.Out's epochs.json if it describes the same dataset
// and options (then its epochs are kept), or starts a new one. It changes
// nothing on disk: a manifest of other options is refused without
// --force, one of another dataset (or any, with --force) is noted in
// j.stale and replaced by setup, under the directory lock; a directory
// that holds what shuffle did not write is refused.
func openManifest(j *job) (*manifests.Epochs, error) {
	o := j.o
	dsSum, err := manifests.HashFile(filepath.Join(o.Dataset, manifests.DatasetFile))
	if err != nil {
		return nil, err
	}
	fresh := &manifests.Epochs{
		Format: manifests.EpochsFormat, Version: manifests.EpochsVersion,
		Dataset: manifests.DatasetRef{Dir: o.Dataset, Fingerprint: j.ds.Fingerprint, SHA256: dsSum},
		Seed:    o.Seed, Window: o.Sampling.Window, Sampling: o.Sampling.Mode, PerClip: o.Sampling.PerClip,
		Short: o.Sampling.Short, ShardSamples: o.ShardSize,
		Files: manifests.EpochFiles{Shards: manifests.ShardsFile, Sums: manifests.SumsFile},
		Tool:  o.Tool,
	}
	if o.Sampling.Mode != "random" {
		fresh.PerClip = 0
	}
	for _, m := range j.mods {
		fresh.Modalities = append(fresh.Modalities, manifests.EpochModality{Name: m.name, DType: m.dtype.Descr(), Rate: int(m.rate),
			FrameShape: m.frameShape, WindowRows: o.Sampling.Window * int(m.rate)})
	}
	if st, err := os.Lstat(o.Out); err == nil && !st.IsDir() {
		return nil, fmt.Errorf("%w: --out %s exists and is not a directory", ErrUsage, o.Out)
	}
	old, err := manifests.LoadEpochs(o.Out)
	if err != nil {
		if _, serr := os.Lstat(filepath.Join(o.Out, manifests.EpochsFile)); serr == nil {
			return nil, fmt.Errorf("%w: --out %s is not a clipshard epochs directory (%v): refusing to write into it", ErrUsage, o.Out, err)
		}
		if err := checkForeign(o.Out, nil); err != nil {
			return nil, err
		}
		return fresh, nil // Run makes o.Out once the run is known to fit
	}
	switch {
	case optionsKey(old) == optionsKey(fresh):
		old.Tool = fresh.Tool
		return old, nil
	case !sameOptions(old, fresh) && !o.Force:
		return nil, fmt.Errorf("%w: %s holds epochs cut with other options (seed, window, sampling, ranks or shard size); use --force to replace them, or another --out", ErrUsage, o.Out)
	}
	// The dataset was rebuilt since (or --force): the old epochs are stale.
	if err := checkForeign(o.Out, old); err != nil {
		return nil, err
	}
	j.stale = true
	return fresh, nil
}

// checkForeign refuses an epochs directory holding files shuffle did not
// write (see foreignFiles), naming them.
func checkForeign(out string, man *manifests.Epochs) error {
	foreign, err := foreignFiles(out, man)
	if err != nil {
		return err
	}
	if len(foreign) > 0 {
		return fmt.Errorf("%w: --out %w: refusing to write into it or replace it (move them elsewhere, or choose another --out)", ErrUsage, manifests.NotOurs(out, foreign))
	}
	return nil
}

func isPartial(name string) bool { return len(name) > 9 && name[:9] == ".partial-" }

// shardFile writes one shard file.
type shardFile interface {
	// write hashes p and writes it; p must not change until close.
	write(p []byte)
	// close writes what write left pending, closes the file (not synced: the epoch commit
	// fsyncs every file) and returns its sha256.
	close() (string, error)
	name() string // relative to the epochs directory
	// abort closes the file without writing what write still refers to
	// (that memory may be gone); the partial epoch is removed.
	abort()
}

// pageShard writes one shard file through the page cache (--no-fsync,
// and samples files) from pieces of memory that stay valid until its next
// flush (windows in the loaded blobs): each piece is hashed (sha256) as
// it comes and written with the others by pwritev, so the bytes are
// copied once, by the kernel.
type pageShard struct {
	f       *os.File
	h       hash.Hash
	rel     string
	iov     [][]byte
	pending int
	off     int64 // file offset of the first pending byte
	err     error
}

const shardFlush = 8 << 20 // bytes pending before a pwritev

// newPageShard creates the file at path and starts it with the .npy
// header for shape.
func newPageShard(path, rel string, dt array.DType, shape []int) (*pageShard, error) {
	hdr, err := npy.EncodeHeader(dt.Descr(), false, shape, npy.DataAlign)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	s := &pageShard{f: f, h: sha256.New(), rel: rel}
	s.write(hdr)
	return s, nil
}

func (s *pageShard) name() string { return s.rel }

func (s *pageShard) abort() {
	clear(s.iov)
	s.iov = nil
	s.f.Close()
}

func (s *pageShard) write(p []byte) {
	if len(p) == 0 {
		return
	}
	s.h.Write(p)
	s.iov = append(s.iov, p)
	s.pending += len(p)
	if len(s.iov) >= 1024 || s.pending >= shardFlush {
		s.flush()
	}
}

func (s *pageShard) flush() error {
	if s.err != nil || len(s.iov) == 0 {
		return s.err
	}
	n, err := pwritevAll(s.f, s.iov, s.off)
	s.off += n
	clear(s.iov)
	s.iov, s.pending = s.iov[:0], 0
	s.err = err
	return err
}

func (s *pageShard) close() (string, error) {
	err := s.flush()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return hex.EncodeToString(s.h.Sum(nil)), err
}

// blobShard writes one shard file through a blob.Writer (unless
// --no-fsync): around the page cache where the filesystem allows, from a
// goroutine, with the sha256 computed from the same chunks as they are
// written (the row count is known up front). The bytes are on disk when
// it closes, so the epoch commit's fsync has nothing left to wait for, and
// a shard, read later by a trainer (usually on another node), does not
// take this node's page cache. write copies.
type blobShard struct {
	w   *blob.Writer
	rel string
}

func newBlobShard(path, rel string, dt array.DType, shape []int) (*blobShard, error) {
	w, err := blob.Create(path, dt, shape[1:], int64(shape[0]))
	if err != nil {
		return nil, err
	}
	return &blobShard{w: w, rel: rel}, nil
}

func (s *blobShard) write(p []byte)         { s.w.Write(p) } // an error comes back from Finish
func (s *blobShard) close() (string, error) { return s.w.Finish() }
func (s *blobShard) abort()                 { s.w.Close() }
func (s *blobShard) name() string           { return s.rel }

// sink writes the shards of the planned epochs. Its caller submits them
// in output order; worker goroutines write them, each shard by one
// worker, so the shards' sha256 chains run on several cores at once. The
// caller's goroutine commits an epoch once all its shards are written.
type sink struct {
	j       *job
	shards  []unit        // the run's shards, in output order
	eps     []*epochState // per j.epochs
	started int           // epochs started (partial directory made)
	entered int           // shards listed in started epochs' entries
	units   chan unit
	results chan shardResult
	wg      sync.WaitGroup
	stop    atomic.Bool // a worker failed or the caller gave up
	err     error
	closed  bool
	bytes   int64 // written in shards whose result came back
	written int64 // samples in those shards
	// work writes shard u (its files, then c.report).
	work func(u unit, c *cursor) error
}

// unit is one shard: output positions [lo, hi) of epoch ep (index into
// j.epochs), its shard-th; idx is its index in the epoch's entry,
// seq its index in the run. piles lists the external path's piles that
// hold it, in order.
type unit struct {
	ep, shard, idx, seq int
	lo, hi              int64
	piles               []int
}

type epochState struct {
	tmp       string
	entry     *manifests.EpochEntry
	sums      map[string]string // this epoch's file hashes
	left      int               // shards not written yet
	committed bool
}

// shardResult reports one written shard (or a worker's error).
type shardResult struct {
	ep, idx  int // epoch (index into j.epochs), shard (index into its entry)
	sums     [][2]string
	samples  int64
	bytes    int64
	err      error
	finished bool // the worker's unit is done (err or not)
}

// errStopped ends a worker's unit when another worker failed or the run
// is aborted.
var errStopped = errors.New("shuffle: stopped")

// newSink starts the workers; s.work must be set before the first submit.
func newSink(j *job, workers int) *sink {
	s := &sink{j: j, shards: j.shards(), eps: make([]*epochState, len(j.epochs)), units: make(chan unit),
		results: make(chan shardResult, 64)}
	for range max(1, workers) {
		s.wg.Add(1)
		go s.worker()
	}
	return s
}

// shards lists the planned shards, in output order (epoch, shard).
func (j *job) shards() []unit {
	var us []unit
	for e := range j.epochs {
		ep := &j.epochs[e]
		n := len(ep.samples)
		for k := 0; k < n; k += j.o.ShardSize {
			lo := ep.base + int64(k)
			sh := k / j.o.ShardSize
			us = append(us, unit{ep: e, shard: sh, idx: sh, seq: len(us), lo: lo, hi: lo + int64(min(j.o.ShardSize, n-k))})
		}
	}
	return us
}

// shardRel names file what ("samples" or a modality) of shard u relative
// to the epochs directory, and shardPath is where it is written (in the
// epoch's partial directory).
func (j *job) shardRel(u unit, what string) string {
	return relJoin(manifests.EpochDir(j.epochs[u.ep].epoch), manifests.ShardName(u.shard, what))
}

func (j *job) shardPath(u unit, what string) string {
	return filepath.Join(j.partialDir(j.epochs[u.ep].epoch), manifests.ShardName(u.shard, what))
}

// shardShape is the shape of modality m's file of a shard of n samples.
func (j *job) shardShape(m modInfo, n int) []int {
	return append([]int{n, int(int64(j.o.Sampling.Window) * m.rate)}, m.frameShape...)
}

// submit hands u to a worker, committing the epochs finished meanwhile.
// It returns the first error of any worker.
func (s *sink) submit(u unit) error {
	if err := s.startUpTo(u.ep); err != nil {
		return err
	}
	for {
		if s.err != nil {
			return s.err
		}
		select {
		case s.units <- u:
			return nil
		case r := <-s.results:
			s.handle(r)
		}
	}
}

// startUpTo starts every epoch up to and including e: its partial
// directory is made and its shard entries listed. manifests.Epochs without samples
// are committed at once.
func (s *sink) startUpTo(e int) error {
	for s.started <= e {
		i := s.started
		s.started++
		ep := &s.j.epochs[i]
		st := &epochState{tmp: s.j.partialDir(ep.epoch), sums: map[string]string{}}
		s.eps[i] = st
		if err := os.RemoveAll(st.tmp); err != nil {
			return err
		}
		if err := os.MkdirAll(st.tmp, 0o755); err != nil {
			return err
		}
		st.entry = &manifests.EpochEntry{Epoch: ep.epoch, Dir: manifests.EpochDir(ep.epoch), Samples: int64(len(ep.samples)), Shards: []manifests.ShardEntry{}}
		for ; s.entered < len(s.shards) && s.shards[s.entered].ep == i; s.entered++ {
			u := s.shards[s.entered]
			entry := manifests.ShardEntry{Shard: u.shard, First: u.lo - ep.base, Samples: int(u.hi - u.lo),
				Files: map[string]string{}}
			for _, what := range s.j.shardFileNames() {
				entry.Files[what] = s.j.shardRel(u, what)
			}
			st.entry.Shards = append(st.entry.Shards, entry)
		}
		st.left = len(st.entry.Shards)
		if st.left == 0 {
			if err := s.commit(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// shardFileNames names a shard's files: the modalities, then "samples".
func (j *job) shardFileNames() []string {
	var names []string
	for _, m := range j.mods {
		names = append(names, m.name)
	}
	return append(names, "samples")
}

func (s *sink) handle(r shardResult) {
	if r.err != nil {
		if s.err == nil {
			s.err = r.err
		}
		s.stop.Store(true)
		return
	}
	if r.finished {
		return
	}
	faults.Point("shuffle.shard")
	st := s.eps[r.ep]
	for _, kv := range r.sums {
		st.sums[kv[0]] = kv[1]
	}
	s.bytes += r.bytes
	s.written += r.samples
	st.left--
	if st.left == 0 && s.err == nil {
		if err := s.commit(r.ep); err != nil {
			s.err = err
			s.stop.Store(true)
		}
	}
	// After the commit: a progress line never counts samples of an epoch
	// that a kill at that moment would lose.
	if p := s.j.o.Progress; p != nil {
		p(Progress{Phase: "write", Done: s.written, Total: s.j.total, BytesWritten: s.bytes})
	}
}

// finish waits for the workers, commits what is left (epochs without
// samples included) and returns the first error.
func (s *sink) finish() error {
	if !s.closed {
		s.closed = true
		close(s.units)
		go func() {
			s.wg.Wait()
			close(s.results)
		}()
		for r := range s.results {
			s.handle(r)
		}
	}
	if s.err == nil {
		s.err = s.startUpTo(len(s.j.epochs) - 1)
	}
	if s.err == nil {
		for i, st := range s.eps {
			if !st.committed {
				s.err = fmt.Errorf("shuffle: internal error: epoch %d has %d shards unwritten", s.j.epochs[i].epoch, st.left)
				break
			}
		}
	}
	return s.err
}

// quiesce stops the workers and waits for them, unless finish has run.
func (s *sink) quiesce() {
	if s.closed {
		return
	}
	s.stop.Store(true)
	if s.err == nil {
		s.err = errStopped
	}
	s.finish()
}

// abort stops the workers and removes the partial epochs, if any (deferred
// by Run).
func (s *sink) abort() {
	s.quiesce()
	for _, st := range s.eps {
		if st != nil && !st.committed {
			os.RemoveAll(st.tmp)
		}
	}
	blob.ReleaseBuffers() // the next group's pass 1 needs the memory
}

func (s *sink) worker() {
	defer s.wg.Done()
	c := &cursor{s: s}
	defer c.release()
	for u := range s.units {
		if s.stop.Load() {
			continue
		}
		err := s.work(u, c)
		if err != nil {
			c.abort()
		}
		s.results <- shardResult{err: err, finished: true}
	}
}

// cursor is a worker's open shard (see open) and memory.
type cursor struct {
	s       *sink
	u       unit
	files   []shardFile // the modalities'
	n       int64       // samples written
	samples []byte      // samples.npy rows (see report)
	buf     []byte      // see buffer
}

// put writes the next sample of the open shard: win[k] holds its rows of
// modality k, zeros follow up to the window's size. The memory of win must
// not change until c.close.
func (c *cursor) put(win [][]byte) error {
	j := c.s.j
	if c.s.stop.Load() {
		return errStopped
	}
	for k, m := range j.mods {
		f := c.files[k]
		f.write(win[k])
		if pad := m.winBytes - int64(len(win[k])); pad > 0 {
			f.write(j.zeros[:pad])
		}
	}
	c.n++
	return nil
}

// samplesRows appends the samples.npy rows (clip, start, valid) of output
// positions [lo, hi) of ep to dst.
func (j *job) samplesRows(ep *epochPlan, lo, hi int64, dst []byte) []byte {
	for _, smp := range ep.samples[lo-ep.base : hi-ep.base] {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(smp.Clip))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(smp.Start))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(smp.Valid))
	}
	return dst
}

// buffer is the worker's memory for n bytes (kept for the next call: the
// external path reads a pile at a time into it).
func (c *cursor) buffer(n int64) []byte {
	if int64(len(c.buf)) < n {
		c.release()
		c.buf = directio.MapBuf(int(n))
	}
	return c.buf[:n]
}

// release frees the worker's buffer.
func (c *cursor) release() {
	if c.buf != nil {
		directio.Unmap(c.buf)
		c.buf = nil
	}
}

// open starts writing shard u's modality files.
func (c *cursor) open(u unit) error {
	j := c.s.j
	c.u, c.n = u, 0
	for _, m := range j.mods {
		var sf shardFile
		var err error
		if j.o.NoFsync {
			sf, err = newPageShard(j.shardPath(u, m.name), j.shardRel(u, m.name), m.dtype, j.shardShape(m, int(u.hi-u.lo)))
		} else {
			sf, err = newBlobShard(j.shardPath(u, m.name), j.shardRel(u, m.name), m.dtype, j.shardShape(m, int(u.hi-u.lo)))
		}
		if err != nil {
			return err
		}
		c.files = append(c.files, sf)
	}
	return nil
}

// close finishes the open shard and reports it.
func (c *cursor) close() error {
	var sums [][2]string
	var first error
	for _, f := range c.files {
		sum, err := f.close()
		if err != nil && first == nil {
			first = err
		}
		sums = append(sums, [2]string{f.name(), sum})
	}
	c.files = nil
	if first != nil {
		return first
	}
	if want := c.u.hi - c.u.lo; c.n != want {
		return fmt.Errorf("shuffle: internal error: shard %d of epoch %d got %d samples, want %d", c.u.idx, c.s.j.epochs[c.u.ep].epoch, c.n, want)
	}
	return c.report(c.u, sums)
}

// report writes shard u's samples file and hands the sink the shard's
// file sums (its modalities', in sums).
func (c *cursor) report(u unit, sums [][2]string) error {
	j := c.s.j
	n := int(u.hi - u.lo)
	sm, err := newPageShard(j.shardPath(u, "samples"), j.shardRel(u, "samples"), array.DType{Kind: array.Int, Size: 8}, []int{n, 3})
	if err != nil {
		return err
	}
	c.samples = j.samplesRows(&j.epochs[u.ep], u.lo, u.hi, c.samples[:0])
	sm.write(c.samples)
	sum, err := sm.close()
	if err != nil {
		return err
	}
	c.s.results <- shardResult{ep: u.ep, idx: u.idx, sums: append(sums, [2]string{sm.name(), sum}), samples: int64(n),
		bytes: int64(n) * (j.rec + 24)}
	return nil
}

// abort closes the open shard's files without reporting them.
func (c *cursor) abort() {
	for _, f := range c.files {
		f.abort()
	}
	c.files = nil
}

// commit publishes epoch e (index into j.epochs). Under the directory's
// lock, with the manifests as other runs left them: if the epoch is
// listed already (--force, or its files were damaged), the manifests are
// rewritten without it; then its partial folder replaces the final one
// (atomicfile.ReplaceDir), shards.parquet, SHA256SUMS and, last,
// epochs.json are rewritten with it, and the folder it replaced is
// emptied of the files that were shuffle's. A directory that another run has
// meanwhile given other options is not written into (ErrConflict).
func (s *sink) commit(e int) error {
	j := s.j
	st := s.eps[e]
	out := j.o.Out
	final := filepath.Join(out, st.entry.Dir)
	if !j.o.NoFsync {
		if err := syncTree(st.tmp, st.sums); err != nil {
			return err
		}
	}
	unlock, err := atomicfile.LockDir(out, false)
	if err != nil {
		return err
	}
	defer unlock()
	man := j.man
	disk, err := manifests.LoadEpochs(out)
	switch {
	case err == nil && optionsKey(disk) != optionsKey(man):
		return fmt.Errorf("%w: another run committed epochs with other options into %s meanwhile (%s); epoch %d is not committed",
			ErrConflict, out, keyDiff(optionsKey(disk), optionsKey(man)), st.entry.Epoch)
	case err == nil:
		man.Epochs = disk.Epochs // what other runs committed meanwhile
	case errors.Is(err, fs.ErrNotExist):
		// Nothing committed, or the manifest was removed by hand: keep
		// the epochs this run knows of that are still whole.
		kept := man.Epochs[:0]
		for _, x := range man.Epochs {
			if j.whole(x) {
				kept = append(kept, x)
			}
		}
		man.Epochs = kept
	default:
		return err
	}
	var prev *manifests.EpochEntry
	kept := man.Epochs[:0]
	for i, x := range man.Epochs {
		if x.Epoch == st.entry.Epoch {
			prev = &man.Epochs[i]
		} else {
			kept = append(kept, x)
		}
	}
	var listed map[string]bool // the old folder's files, if it is listed
	if prev != nil {
		listed = prev.Listed()
		man.Epochs = kept
		if err := manifests.WriteEpochs(out, man, nil); err != nil {
			return err
		}
	}
	faults.Point("shuffle.commit")
	old, err := atomicfile.ReplaceDir(st.tmp, final)
	if err != nil {
		return err
	}
	st.committed = true
	faults.Point("shuffle.renamed")
	man.Epochs = append(kept, *st.entry)
	sortEpochs(man.Epochs)
	man.Created = j.o.Now().UTC().Format(time.RFC3339)
	if err := manifests.WriteEpochs(out, man, st.sums); err != nil {
		return err
	}
	if old != "" { // the folder the epoch replaced (--force, or damaged)
		return removeEpochFolder(old, listed)
	}
	return nil
}

func sortEpochs(es []manifests.EpochEntry) {
	for i := 1; i < len(es); i++ {
		for k := i; k > 0 && es[k].Epoch < es[k-1].Epoch; k-- {
			es[k], es[k-1] = es[k-1], es[k]
		}
	}
}

// syncTree fsyncs the epoch's files four at a time, then its directories.
func syncTree(tmp string, sums map[string]string) error {
	errs := make(chan error, len(sums))
	sem := make(chan struct{}, 4)
	dirs := map[string]bool{tmp: true}
	for rel := range sums {
		_, rest, _ := strings.Cut(rel, "/") // epoch-NNNN/file
		p := filepath.Join(tmp, filepath.FromSlash(rest))
		dirs[filepath.Dir(p)] = true
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- atomicfile.Sync(p)
		}()
	}
	for range sums {
		if err := <-errs; err != nil {
			return err
		}
	}
	for d := range dirs {
		if err := atomicfile.Sync(d); err != nil {
			return err
		}
	}
	return nil
}
