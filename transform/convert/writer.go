// Writer: the pipeline's one serial stage, which appends converted clips
// to the blobs in clip-list order and journals them.

package convert

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// writer is the state of the ordered writer.
type writer struct {
	job      *job
	ctx      context.Context // the run's: streamed clips check it between pieces
	journal  *journal
	mods     []*modState
	rows     []manifests.ClipRow
	where    [][]segLoc // convert --segments: per clip, per modality
	skipped  []manifests.Skipped
	next     int   // next clip index to write
	frames   int64 // clip frames written
	trimmed  int64
	bytesOut int64
	unsynced int64 // bytes appended since the last flush or checkpoint
	marks    []journalMark
	// pred delivers predictRows' result; predicted records that the blobs'
	// hashers were started with it.
	pred        chan []int64
	predRows    []int64 // from pred, once predKnown
	predKnown   bool
	predicted   bool
	earlyHashed int
}

// startHashers starts the blobs' sha256 (blob.Writer.Predict) once the
// predicted row counts are known and every blob is open.
func (w *writer) startHashers() {
	if w.predicted || w.pred == nil {
		return
	}
	for _, st := range w.mods {
		if st.w == nil {
			return
		}
	}
	if !w.predKnown {
		select {
		case w.predRows = <-w.pred:
			w.predKnown = true
		default:
			return
		}
	}
	w.predicted = true
	for k, st := range w.mods {
		if w.predRows != nil {
			st.w.Predict(w.predRows[k]) // an error only means no early hash
		}
	}
}

// predictWait is how long a run waits for predictRows before it starts
// converting.
const predictWait = 25 * time.Millisecond

// awaitPrediction waits up to d for predictRows (which reads the header
// of every clip's first .npy source: 5-12 ms for 400 clips). Known before
// the first clip is written, the blobs' hashers start at once; otherwise
// they keep, or later read back, what is written before, and the chunks
// they keep are replaced by fresh memory. Not waiting, the header reads
// and the workers also took longer together than one after the other
// (25 interleaved runs, median: mixed set 249 -> 234 ms; 11 runs: large
// set 193 -> 183 ms, small and float16-only sets the same).
func (w *writer) awaitPrediction(ctx context.Context, d time.Duration) {
	if w.pred == nil || w.predKnown {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case w.predRows = <-w.pred:
		w.predKnown = true
	case <-t.C:
	case <-ctx.Done():
	}
}

// flush writes buffered blob rows, waits until they are in the files,
// then writes the journal records describing them.
func (w *writer) flush() error {
	for _, m := range w.mods {
		if m.w != nil {
			if err := m.w.Flush(); err != nil {
				return err
			}
		}
	}
	w.unsynced, w.marks = 0, nil
	return w.journal.flush()
}

// journalMark is a checkpoint: the journal's first cut bytes describe
// rows that end, in each blob, at ends[k].
type journalMark struct {
	ends []int64
	cut  int
}

// checkpoint makes the journal records written so far due once their rows
// are in the blobs, without waiting for them (Flush waits on the disk, and
// the writer is the pipeline's one serial stage): settle writes them
// after a later clip, once the blobs' write goroutines got there.
func (w *writer) checkpoint() error {
	m := journalMark{cut: w.journal.size()}
	for _, st := range w.mods {
		end := int64(0)
		if st.w != nil { // (convert --segments: a modality none of whose rows are new has none)
			end = st.w.End()
		}
		m.ends = append(m.ends, end)
	}
	w.marks = append(w.marks, m)
	w.unsynced = 0
	return w.settle()
}

// settle writes the journal records of the checkpoints whose rows are in
// the blobs.
func (w *writer) settle() error {
	inFiles := func(m journalMark) bool {
		for k, st := range w.mods {
			if st.w != nil && st.w.Written() < m.ends[k] {
				return false
			}
		}
		return true
	}
	done := 0
	for done < len(w.marks) && inFiles(w.marks[done]) {
		done++
	}
	if done == 0 {
		return nil
	}
	cut := w.marks[done-1].cut
	if err := w.journal.flushPrefix(cut); err != nil {
		return err
	}
	w.marks = w.marks[:copy(w.marks, w.marks[done:])]
	for i := range w.marks {
		w.marks[i].cut -= cut
	}
	return nil
}

func (w *writer) closeBlobs() {
	for _, m := range w.mods {
		if m.w != nil {
			m.w.Close()
			m.w = nil
		}
	}
}

// write appends one converted clip (or records it skipped).
func (w *writer) write(c *clipOut) error {
	j := w.job
	id := j.clips[c.index]
	if c.err == nil {
		c.err = w.labelCodes(id, c)
	}
	if c.err == nil {
		c.err = w.checkShapes(id, c)
	}
	if c.err != nil {
		if !j.opts.SkipBadClips {
			return c.err
		}
		reason := strings.TrimPrefix(c.err.Error(), ErrInput.Error()+": ")
		rec := journalRecord{Index: c.index, Clip: id, Skip: reason}
		for _, m := range j.opts.Modalities {
			if m.Label == "" { // (a label has no file: the fingerprint covers it)
				rec.SkipSources = append(rec.SkipSources, manifests.Stamp(m.Path(j.root, id)))
			}
		}
		if err := w.journal.write(rec); err != nil {
			return err
		}
		w.skipped = append(w.skipped, manifests.Skipped{Clip: id, Reason: reason, Sources: rec.SkipSources})
		w.next++
		return nil
	}
	row := manifests.ClipRow{Clip: id, Start: w.frames, Length: c.length, Trimmed: c.trimmed, Sources: make([]manifests.ClipSource, len(c.mods))}
	var locs []segLoc
	if j.segmented {
		locs = make([]segLoc, len(c.mods))
	}
	for k := range c.mods {
		mo := &c.mods[k]
		st := w.mods[k]
		if mo.ref != nil {
			locs[k] = segLoc{file: mo.ref.file, first: mo.ref.first}
			st.rows += mo.rows
			st.refRows += mo.rows
			st.stats.Add(mo.stats)
			if !slices.Contains(st.descrs, mo.sourceDescr) {
				st.descrs = append(st.descrs, mo.sourceDescr)
			}
			row.Sources[k] = mo.src
			continue
		}
		if locs != nil {
			locs[k] = segLoc{first: st.rows - st.refRows}
		}
		if st.w == nil {
			var err error
			if st.w, err = blob.OpenMem(j.blobPath(k), st.dtype, st.frameShape, 0, j.blobMem); err != nil {
				return err
			}
		}
		var err error
		if mo.stream {
			err = j.writeStream(w.ctx, mo, j.opts.Modalities[k].KeepDType, func(p []byte) error {
				_, err := st.w.Write(p)
				return err
			})
		} else if mo.reuse != nil {
			err = j.copyReused(w.ctx, mo, func(p []byte) error {
				_, err := st.w.Write(p)
				return err
			})
		} else {
			_, err = st.w.Write(mo.data)
		}
		if err != nil {
			return fmt.Errorf("clip %q: writing modality %q: %w", id, j.opts.Modalities[k].Name, err)
		}
		st.rows += mo.rows
		st.stats.Add(mo.stats)
		if !slices.Contains(st.descrs, mo.sourceDescr) {
			st.descrs = append(st.descrs, mo.sourceDescr)
		}
		w.bytesOut += mo.size
		w.unsynced += mo.size
		row.Sources[k] = mo.src
	}
	if err := w.journal.writeRaw(c.journal); err != nil {
		return err
	}
	switch {
	case j.opts.Checkpoint == 0:
		// Every clip on file and journaled before the next one.
		if err := w.flush(); err != nil {
			return err
		}
	case w.unsynced >= j.opts.Checkpoint:
		if err := w.checkpoint(); err != nil {
			return err
		}
	case len(w.marks) > 0:
		if err := w.settle(); err != nil {
			return err
		}
	}
	w.rows = append(w.rows, row)
	if locs != nil {
		w.where = append(w.where, locs)
	}
	w.frames += c.length
	w.trimmed += c.trimmed
	w.next++
	w.startHashers()
	faults.Point("convert.clip")
	return nil
}

// checkShapes checks a clip's frame shapes and dtypes against the first
// clip of each modality, and sets them from this clip if it is the first.
func (w *writer) checkShapes(id string, c *clipOut) error {
	for k := range c.mods {
		mo, st := &c.mods[k], w.mods[k]
		name := w.job.opts.Modalities[k].Name
		if st.frameShape == nil {
			continue
		}
		if !slices.Equal(mo.frameShape, st.frameShape) {
			return fmt.Errorf("%w: %s: clip %q: modality %q: frame shape %s differs from %s of clip %q",
				ErrInput, mo.src.Path, id, name, array.FormatShape(mo.frameShape), array.FormatShape(st.frameShape), st.firstClip)
		}
		if mo.dtype != st.dtype {
			return fmt.Errorf("%w: %s: clip %q: modality %q: dtype %s differs from %s of clip %q (--keep-dtype needs one dtype)",
				ErrInput, mo.src.Path, id, name, mo.dtype, st.dtype, st.firstClip)
		}
	}
	for k := range c.mods {
		if st := w.mods[k]; st.frameShape == nil {
			st.frameShape, st.dtype, st.firstClip = append([]int{}, c.mods[k].frameShape...), c.mods[k].dtype, id
		}
	}
	return nil
}

// labelCodes gives the labels a clip's worker read from pickle keys their
// codes, in clip order (so that a run numbers them as the clips give
// them), and fills in their rows, audit and journal record.
func (w *writer) labelCodes(id string, c *clipOut) error {
	j := w.job
	coded := false
	for k := range c.mods {
		mo := &c.mods[k]
		if mo.label == "" || mo.ref != nil || mo.reuse != nil || mo.data != nil {
			continue
		}
		code, err := j.labelCode(k, mo.label)
		if err != nil {
			return fmt.Errorf("%w: %s: clip %q: modality %q: %w", ErrInput, mo.src.Path, id, j.opts.Modalities[k].Name, err)
		}
		fillLabel(mo, code)
		coded = true
	}
	if coded && c.journal != nil {
		c.journal = c.record(id)
	}
	return nil
}

// fillLabel sets mo's row to the int32 code, with its audit and hash as a
// column label's (convertPiece over the code, kept).
func fillLabel(mo *modOut, code int32) {
	mo.data = binary.LittleEndian.AppendUint32(nil, uint32(code))
	cv, _ := convertPiece(make([]byte, 4), mo.data, labelDType, true, 1, 0) // (an int32 never fails)
	mo.rows, mo.dtype, mo.frameShape, mo.size = 1, labelDType, []int{}, 4
	mo.stats, mo.xxh = cv.stats, cv.xxh
	mo.src.XXH64, mo.src.Audited, mo.src.Descr, mo.src.Stats = cv.xxh, true, mo.sourceDescr, manifests.Stats(cv.stats)
}
