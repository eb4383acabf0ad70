// Read: the dataset's blobs in sequential runs of frames, for the external
// path's pass 1.

package shuffle

import (
	"cmp"
	"os"
	"sort"

	"github.com/clipshard/clipshard/formats/regfile"
)

// passOneOrder orders global positions as pass 1 meets their samples: by
// clip, start, then position.
func (j *job) passOneOrder(a, b int64) int {
	ea, ia := j.position(a)
	eb, ib := j.position(b)
	sa, sb := ea.samples[ia], eb.samples[ib]
	return cmp.Or(cmp.Compare(sa.Clip, sb.Clip), cmp.Compare(sa.Start, sb.Start), cmp.Compare(a, b))
}

// chunk is a run of the frames of one source, read from every modality's
// blob: the samples that start in frames [g0, g1) (global frame numbers:
// the sources' frames one after the other) are cut from it. rows[k] holds
// the source's blob k's rows from row first[k] (numbered within the
// source) on, through frame g1 plus a window (or the source's end).
type chunk struct {
	g0, g1 int64
	first  []int64
	rows   [][]byte
	err    error
	free   chan<- *chunk
}

// release hands the chunk's buffers back to the reader.
func (c *chunk) release() { c.free <- c }

// readChunks reads the sources' frames in order, each source's blobs
// front to back, in runs of about limit bytes over all modalities (a clip
// larger than that is read in pieces), from a goroutine that runs up to
// three runs ahead of the receiver, which releases each run when done
// with it; stop ends the goroutine. Reads are sequential: each run starts
// where the last one's frames end, and also reads the window after them
// again (those rows were just read, and are in the page cache), so that
// every sample that starts in a run lies whole in it. The buffers are
// bounded by limit plus a window, whatever the size of a clip.
func (j *job) readChunks(limit int64) (<-chan *chunk, func(), error) {
	// Every blob is opened (and checked a regular file) once, before the
	// read starts; a run's files are those of its blobs.
	files := make([][]*os.File, len(j.runs))
	open := map[string]*os.File{}
	closeFiles := func() {
		for p, f := range open {
			f.Close()
			delete(open, p)
		}
	}
	for s, run := range j.runs {
		for _, sf := range run.files {
			f := open[sf.path]
			if f == nil {
				var err error
				if f, _, err = regfile.Open(sf.path); err != nil {
					closeFiles()
					return nil, nil, err
				}
				open[sf.path] = f
			}
			files[s] = append(files[s], f)
		}
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
	var clipBytes int64  // the per-clip modalities' bytes for one clip
	for _, m := range j.mods {
		frameBytes += m.rate * m.rowBytes
		if m.perClip {
			clipBytes += m.rowBytes
		}
	}
	w := int64(j.o.Sampling.Window)
	step := max(1, limit/max(1, frameBytes)) // frames a run starts
	clipAt := func(g int64) int {            // the (global) clip frame g belongs to
		return sort.Search(len(j.starts), func(c int) bool { return j.starts[c]+j.lengths[c] > g })
	}
	go func() {
		defer close(finished)
		defer close(out)
		defer closeFiles()
		for s, src := range j.runs {
			total := src.frame0 + src.frames // one past the run's last frame
			for g0, g1 := src.frame0, src.frame0; g0 < total; g0 = g1 {
				g1 = min(total, g0+step)
				if clipBytes > 0 {
					// Short clips with large per-clip values: the run also
					// ends where its clips' values would pass the limit.
					c := clipAt(g0) + int(max(1, limit/clipBytes))
					if c < len(j.starts) && j.starts[c] < g1 {
						g1 = max(g0+1, j.starts[c])
					}
				}
				end := min(total, g1+w)
				var ch *chunk
				select {
				case ch = <-free:
				case <-quit:
					return
				}
				ch.g0, ch.g1 = g0, g1
				for k, m := range j.mods {
					sf := src.files[k]
					first := (g0 - src.frame0) * m.rate
					n := (end - g0) * m.rate * m.rowBytes
					if m.perClip {
						// The rows of the clips the run's samples start in.
						first = int64(clipAt(g0)) - src.clip0
						n = (int64(clipAt(g1-1)) - src.clip0 + 1 - first) * m.rowBytes
					}
					ch.first[k] = first
					if int64(cap(ch.rows[k])) < n {
						c := n
						if !m.perClip {
							c = max(n, (step+w)*m.rate*m.rowBytes)
						}
						ch.rows[k] = make([]byte, n, c)
					}
					ch.rows[k] = ch.rows[k][:n]
					if _, err := files[s][k].ReadAt(ch.rows[k], sf.dataOffset+first*m.rowBytes); err != nil {
						ch.err = readErr(sf.path, sf.dataOffset+first*m.rowBytes, clipAt(g0)-int(j.srcs[src.src].clip0), err)
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
			files[s] = nil
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
