// Gather: the in-memory path, when the dataset's blobs fit the memory
// budget: every blob loaded, every shard cut from them by a worker.

package shuffle

import (
	"context"
	"runtime"

	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/regfile"
)

// gatherInMemory loads every blob; the workers fill their shards from it.
func (j *job) gatherInMemory(ctx context.Context, s *sink) error {
	blobs := make([][][]byte, len(j.runs)) // [run][modality]
	for s, run := range j.runs {
		blobs[s] = make([][]byte, len(j.mods))
		for k, m := range j.mods {
			sf := run.files[k]
			f, _, err := regfile.Open(sf.path)
			if err != nil {
				return err
			}
			// Mapped memory with huge pages where offered: a fresh heap buffer
			// of the dataset's size costs a page fault (and zeroing) every 4 KiB.
			blobs[s][k] = directio.MapBuf(int(sf.rows * m.rowBytes))
			defer directio.Unmap(blobs[s][k])
			_, err = f.ReadAt(blobs[s][k], sf.dataOffset)
			f.Close()
			if err != nil {
				return readErr(f.Name(), sf.dataOffset, -1, err)
			}
		}
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
				src, first, n := j.sampleRows(k, smp)
				win[k] = blobs[src][k][first*m.rowBytes : (first+n)*m.rowBytes]
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
	per := chunks(int64(j.o.ShardSize) * j.sampleRec())
	for _, m := range j.mods {
		per += chunks(int64(j.o.ShardSize) * m.winBytes)
	}
	return int(max(1, min(int64(n), (j.o.Mem/4+32<<20)/per)))
}
