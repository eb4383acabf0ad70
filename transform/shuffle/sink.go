// Sink: the shards of a group of epochs, handed to worker goroutines in
// output order; an epoch is committed once its shards are written.

package shuffle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

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
	if m.perClip {
		return append([]int{n}, m.frameShape...)
	}
	return append([]int{n, int(int64(j.o.Sampling.Window) * m.rate)}, m.frameShape...)
}

// partialDir is where epoch e is written before its commit.
func (j *job) partialDir(e int) string {
	return filepath.Join(j.o.Out, ".partial-"+manifests.EpochDir(e))
}

// relJoin joins slash paths for manifests.
func relJoin(parts ...string) string { return strings.Join(parts, "/") }

// shardFileNames names a shard's files: the modalities, then "samples".
func (j *job) shardFileNames() []string {
	var names []string
	for _, m := range j.mods {
		names = append(names, m.name)
	}
	return append(names, "samples")
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
		if s.j.mixed {
			st.entry.Weights, st.entry.Counts = s.j.epochMix(ep)
		}
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
