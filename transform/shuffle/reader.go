// Reader: an epoch's samples read back in order (tests and tools; the
// trainer's reader is python/clipshard).

package shuffle

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/clipshard/clipshard/manifests"
)

// Reader reads the samples of one epoch, in their shuffled order, strictly
// sequentially through its shard files. It is not safe for concurrent use;
// Close releases the open files.
type Reader struct {
	dir    string
	man    *manifests.Epochs
	shards []manifests.ShardEntry
	next   int // next shard to open
	left   int // samples left in the open shard
	files  []*os.File
	rd     []*bufio.Reader
	sizes  []int  // window bytes per modality
	buf    []byte // one row of the samples file
}

// Open opens the samples of epoch in the epochs directory dir.
func Open(dir string, epoch int) (*Reader, error) {
	man, err := manifests.LoadEpochs(dir)
	if err != nil {
		return nil, err
	}
	var entry *manifests.EpochEntry
	for i := range man.Epochs {
		if man.Epochs[i].Epoch == epoch {
			entry = &man.Epochs[i]
		}
	}
	if entry == nil {
		return nil, fmt.Errorf("shuffle: %s: epoch %d is not there", dir, epoch)
	}
	r := &Reader{dir: dir, man: man, shards: append([]manifests.ShardEntry(nil), entry.Shards...), buf: make([]byte, 8*man.SampleCols())}
	sort.Slice(r.shards, func(a, b int) bool { return r.shards[a].Shard < r.shards[b].Shard })
	for _, m := range man.Modalities {
		n, err := m.SampleBytes()
		if err != nil {
			return nil, fmt.Errorf("shuffle: %s: modality %q: %w", dir, m.Name, err)
		}
		r.sizes = append(r.sizes, int(n))
	}
	return r, nil
}

// Modalities returns the modality names, in the order Next fills windows.
func (r *Reader) Modalities() []string {
	names := make([]string, len(r.man.Modalities))
	for i, m := range r.man.Modalities {
		names[i] = m.Name
	}
	return names
}

// Next reads the next sample: its (clip, start, valid) and, into windows
// (one slice per modality, grown as needed), its float16 window bytes. It
// returns io.EOF after the last sample.
func (r *Reader) Next(windows [][]byte) (manifests.Sample, [][]byte, error) {
	for r.left == 0 {
		if err := r.openNext(); err != nil {
			return manifests.Sample{}, windows, err
		}
	}
	if len(windows) < len(r.sizes) {
		windows = append(windows, make([][]byte, len(r.sizes)-len(windows))...)
	}
	for k, n := range r.sizes {
		if cap(windows[k]) < n {
			windows[k] = make([]byte, n)
		}
		windows[k] = windows[k][:n]
		if _, err := io.ReadFull(r.rd[k], windows[k]); err != nil {
			return manifests.Sample{}, windows, fmt.Errorf("shuffle: %s: %w", r.files[k].Name(), err)
		}
	}
	if _, err := io.ReadFull(r.rd[len(r.sizes)], r.buf); err != nil {
		return manifests.Sample{}, windows, fmt.Errorf("shuffle: %s: %w", r.files[len(r.sizes)].Name(), err)
	}
	r.left--
	return manifests.Sample{
		Clip:  int64(binary.LittleEndian.Uint64(r.buf[0:])),
		Start: int64(binary.LittleEndian.Uint64(r.buf[8:])),
		Valid: int64(binary.LittleEndian.Uint64(r.buf[16:])),
	}, windows, nil
}

func (r *Reader) openNext() error {
	r.Close()
	if r.next >= len(r.shards) {
		return io.EOF
	}
	s := r.shards[r.next]
	r.next++
	names := append(r.Modalities(), "samples")
	r.files, r.rd = nil, nil
	for _, n := range names {
		f, h, err := r.man.ShardFile(r.dir, s, n)
		if err != nil {
			r.Close()
			return fmt.Errorf("shuffle: %w", err)
		}
		r.files = append(r.files, f)
		r.rd = append(r.rd, bufio.NewReaderSize(io.NewSectionReader(f, h.DataOffset, h.DataSize), 1<<20))
	}
	r.left = s.Samples
	return nil
}

// Close closes the open shard files.
func (r *Reader) Close() error {
	for _, f := range r.files {
		f.Close()
	}
	r.files = nil
	return nil
}
