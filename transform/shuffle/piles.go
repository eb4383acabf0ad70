// Piles: the external two-pass path, for datasets larger than the memory
// budget. Pass 1 appends each sample, in the order the sequential reads
// meet it, to its pile in the shard's own files; pass 2 puts each pile in
// order over the same bytes.

package shuffle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/faults"
)

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
					_, first, rows := j.sampleRows(k, smp)
					first -= ch.first[k]
					n := rows * m.rowBytes
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
