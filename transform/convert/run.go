package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// Result is what Run did.
type Result struct {
	Dir       string
	Dataset   *manifests.Dataset
	UpToDate  bool // nothing changed since the last run: nothing was written
	Resumed   int  // clips taken over from an interrupted run
	Converted int  // clips converted by this run
	BytesIn   int64
	BytesOut  int64
	Elapsed   time.Duration
	// EarlyHashed counts the blobs whose sha256 was computed while they
	// were written (see predictRows), not read back at the end.
	EarlyHashed int
}

// job is one Run.
type job struct {
	opts        Options
	clips       []string
	root        string
	fingerprint string
	part        *manifests.Part
	staging     string // directory the dataset is built in
	journalPath string
	dirs        formats.Dirs // source folders kept open
	// streamMin: a .npy source larger than this is converted a piece at a
	// time (see processClip), so that the workers' clips stay within half
	// the budget whatever their size.
	streamMin int64
}

// modState is what the writer knows about a modality so far.
type modState struct {
	w          *blob.Writer
	dtype      array.DType
	frameShape []int
	firstClip  string // the clip that set dtype and frame shape
	descrs     []string
	rows       int64
	stats      f16.Stats
}

// Run converts the clips of o.ClipList into the dataset directory o.Out.
// See the package doc. Errors wrap ErrUsage or ErrInput where they are the
// user's to fix; on error no dataset.json is written or replaced.
func Run(ctx context.Context, o Options) (*Result, error) {
	began := time.Now()
	j, err := newJob(o)
	if err != nil {
		return nil, err
	}
	if !o.Force {
		if d, ok := j.upToDate(); ok {
			j.removeStale()
			return &Result{Dir: o.Out, Dataset: d, UpToDate: true, Elapsed: time.Since(began)}, nil
		}
	}
	if _, err := checkOut(o.Out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(j.opts.Out), 0o755); err != nil {
		return nil, err
	}
	jf, err := j.lockJournal()
	if err != nil {
		return nil, err
	}
	defer jf.Close()
	res := &Result{Dir: o.Out}
	w, err := j.prepare(jf)
	if err != nil {
		return nil, err
	}
	defer w.closeBlobs()
	res.Resumed = w.next
	defer j.dirs.Close()
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	w.pred = make(chan []int64, 1)
	from, base := w.next, w.frames
	go func() { w.pred <- j.predictRows(pctx, from, base) }()
	if err := j.pipeline(ctx, w, res); err != nil {
		return nil, err
	}
	d, err := j.finalize(w)
	if err != nil {
		return nil, err
	}
	if err := j.commit(d); err != nil {
		return nil, err
	}
	os.Remove(j.journalPath)
	res.Dataset = d
	res.EarlyHashed = w.earlyHashed
	res.Elapsed = time.Since(began)
	return res, nil
}

func newJob(o Options) (*job, error) {
	if len(o.Modalities) == 0 {
		return nil, fmt.Errorf("%w: no --modality given", ErrUsage)
	}
	if o.Out == "" || o.ClipList == "" {
		return nil, fmt.Errorf("%w: --clips and --out are required", ErrUsage)
	}
	switch o.Align {
	case "":
		o.Align = "strict"
	case "strict", "trim":
	default:
		return nil, fmt.Errorf("%w: --align %q: want strict or trim", ErrUsage, o.Align)
	}
	seen := map[string]bool{}
	for _, m := range o.Modalities {
		if err := CheckName(m.Name); err != nil {
			return nil, err
		}
		if seen[m.Name] {
			return nil, fmt.Errorf("%w: modality %q given twice", ErrUsage, m.Name)
		}
		seen[m.Name] = true
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Budget <= 0 {
		o.Budget = 256 << 20
	}
	if o.Checkpoint < 0 {
		o.Checkpoint = 16 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	o.Out = out
	check := manifests.InsideRoot
	if o.AllowOutsideRoot {
		check = nil
	}
	clips, err := manifests.ReadClipListChecked(o.ClipList, check)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	root := o.Root
	if root == "" {
		root = filepath.Dir(o.ClipList)
	}
	if root, err = filepath.Abs(root); err != nil {
		return nil, err
	}
	o.Root = root
	j := &job{opts: o, clips: clips, root: root, streamMin: max(minStreamBytes, o.Budget/int64(4*o.Workers))}
	parent, base := filepath.Split(out)
	j.staging = filepath.Join(parent, ".clipshard-partial-"+base)
	j.journalPath = j.staging + ".journal"
	// The fingerprint covers everything that decides the output bytes.
	fp, _ := json.Marshal(struct {
		Clips      []string
		Modalities []Modality
		Root       string
		Align      string
		Flags      [4]bool
	}{clips, o.Modalities, root, o.Align, [4]bool{o.AllowInt, o.AllowNonFinite, o.AllowOverflow, o.SkipBadClips}})
	sum := sha256.Sum256(fp)
	j.fingerprint = hex.EncodeToString(sum[:])
	if o.Parts > 0 {
		if o.Part < 0 || o.Part >= o.Parts || o.Parts > len(clips) {
			return nil, fmt.Errorf("%w: part %d of %d: want 0 <= I < N <= %d clips", ErrUsage, o.Part, o.Parts, len(clips))
		}
		lo, hi := PartRange(len(clips), o.Part, o.Parts)
		j.part = &manifests.Part{Index: o.Part, Count: o.Parts, FirstClip: lo, ListClips: hi - lo, TotalClips: len(clips), Job: j.fingerprint}
		j.clips = clips[lo:hi]
		ps := sha256.Sum256(fmt.Appendf(nil, "%s part %d/%d", j.fingerprint, o.Part, o.Parts))
		j.fingerprint = hex.EncodeToString(ps[:])
	}
	return j, nil
}

// minStreamBytes is the smallest .npy source converted a piece at a time
// (a variable for the tests).
var minStreamBytes int64 = 1 << 20

// PartRange returns the clip index range [lo, hi) of part i of n over a
// list of total clips: contiguous, in order, sizes differing by at most one.
func PartRange(total, i, n int) (lo, hi int) {
	return total * i / n, total * (i + 1) / n
}

// upToDate reports whether o.Out holds a dataset made from the same inputs
// whose sources are unchanged (size and mtime).
func (j *job) upToDate() (*manifests.Dataset, bool) {
	d, err := manifests.LoadDataset(j.opts.Out)
	if err != nil || d.Fingerprint != j.fingerprint {
		return nil, false
	}
	names := make([]string, len(d.Modalities))
	for i, m := range d.Modalities {
		names[i] = m.Name
		if st, err := os.Stat(filepath.Join(j.opts.Out, m.File)); err != nil || st.Size() != m.Size {
			return nil, false
		}
	}
	rows, err := manifests.ReadClips(filepath.Join(j.opts.Out, d.Files.Clips), names)
	if err != nil {
		return nil, false
	}
	for _, r := range rows {
		for _, s := range r.Sources {
			if st := manifests.Stamp(s.Path); st.Size != s.Size || st.MtimeNS != s.MtimeNS {
				return nil, false
			}
		}
	}
	for _, sk := range d.Skipped {
		for _, s := range sk.Sources {
			if manifests.Stamp(s.Path) != s {
				return nil, false
			}
		}
	}
	return d, true
}

// removeStale removes a staging directory and journal left by a run that
// was killed after its dataset was committed.
func (j *job) removeStale() {
	if _, err := os.Stat(j.journalPath); err != nil {
		removeStaging(j.staging)
		return
	}
	jf, err := atomicfile.TryLock(j.journalPath)
	if err != nil {
		return // a run is in progress
	}
	defer jf.Close()
	if removeStaging(j.staging) == nil {
		os.Remove(j.journalPath)
	}
}

// lockJournal opens the journal (made if need be) with an exclusive lock
// on it, held for the whole run: a second convert into the same --out is
// refused.
func (j *job) lockJournal() (*os.File, error) {
	jf, err := atomicfile.TryLock(j.journalPath)
	if errors.Is(err, atomicfile.ErrLocked) {
		return nil, fmt.Errorf("%w: another clipshard convert is writing %s (lock %s held)", ErrUsage, j.opts.Out, j.journalPath)
	}
	return jf, err
}

// writer is the state of the ordered writer.
type writer struct {
	job      *job
	ctx      context.Context // the run's: streamed clips check it between pieces
	journal  *journal
	mods     []*modState
	rows     []manifests.ClipRow
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
	select {
	case p := <-w.pred:
		w.predicted = true
		for k, st := range w.mods {
			if p != nil {
				st.w.Predict(p[k]) // an error only means no early hash
			}
		}
	default:
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
		m.ends = append(m.ends, st.w.End())
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
			if st.w.Written() < m.ends[k] {
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

// prepare sets up the staging directory: it resumes from a journal of the
// same inputs, keeping every clip whose bytes verify, or starts afresh.
func (j *job) prepare(jf *os.File) (*writer, error) {
	w := &writer{job: j, mods: make([]*modState, len(j.opts.Modalities))}
	for k := range w.mods {
		w.mods[k] = &modState{}
	}
	var recs []journalRecord
	if !j.opts.Force {
		if fp, rs, err := readJournal(j.journalPath); err == nil && fp == j.fingerprint {
			if _, err := os.Stat(j.staging); err == nil {
				recs = j.verifyRecords(rs)
			}
		}
	}
	if len(recs) == 0 {
		if err := removeStaging(j.staging); err != nil {
			return nil, err
		}
		if err := os.Mkdir(j.staging, 0o755); err != nil {
			return nil, err
		}
	} else if err := sweepTemp(j.staging); err != nil {
		// A kill while a manifest was being written left its temporary
		// file: it must not be committed with the dataset.
		return nil, err
	}
	for _, r := range recs {
		if err := w.replay(r); err != nil {
			return nil, err
		}
	}
	var err error
	if w.journal, err = truncateJournal(jf, j.fingerprint, recs); err != nil {
		return nil, err
	}
	for k, m := range w.mods {
		if m.frameShape == nil {
			continue // opened when the first clip arrives
		}
		if m.w, err = blob.Open(j.blobPath(k), m.dtype, m.frameShape, m.rows); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func (j *job) blobPath(k int) string {
	return filepath.Join(j.staging, j.opts.Modalities[k].Name+".npy")
}

// verifyRecords returns the longest prefix of recs that belongs to this
// clip list and whose bytes are intact in the staged blobs.
func (j *job) verifyRecords(recs []journalRecord) []journalRecord {
	type reader struct {
		f   *os.File
		off int64
		fb  int64
	}
	readers := make([]*reader, len(j.opts.Modalities))
	defer func() {
		for _, r := range readers {
			if r != nil {
				r.f.Close()
			}
		}
	}()
	for i, rec := range recs {
		if i >= len(j.clips) || rec.Clip != j.clips[i] {
			return recs[:i]
		}
		// A clip is taken over only if its sources are as they were when
		// it was converted (or skipped): same size and mtime.
		if rec.Skip != "" {
			for _, ss := range rec.SkipSources {
				if manifests.Stamp(ss.Path) != ss {
					return recs[:i]
				}
			}
			continue
		}
		if len(rec.Mods) != len(j.opts.Modalities) {
			return recs[:i]
		}
		for _, m := range rec.Mods {
			if manifests.Stamp(m.Path) != (manifests.SourceStamp{Path: m.Path, Size: m.Size, MtimeNS: m.MtimeNS}) {
				return recs[:i]
			}
		}
		for k, m := range rec.Mods {
			dt, _, err := array.ParseDescr(m.DType)
			if err != nil {
				return recs[:i]
			}
			fb, err := array.ByteSize(m.FrameShape, dt.Size)
			if err != nil {
				return recs[:i]
			}
			r := readers[k]
			if r == nil {
				f, err := os.Open(j.blobPath(k))
				if err != nil {
					return recs[:i]
				}
				r = &reader{f: f, off: 4096, fb: fb}
				readers[k] = r
			}
			if fb != r.fb {
				return recs[:i]
			}
			n := m.Rows * fb
			h, err := hashRange(r.f, r.off, n)
			if err != nil || fmt.Sprintf("%016x", h) != m.XXH64 {
				return recs[:i]
			}
			r.off += n
		}
	}
	return recs
}

// replay applies a verified journal record to the writer state.
func (w *writer) replay(r journalRecord) error {
	if r.Skip != "" {
		w.skipped = append(w.skipped, manifests.Skipped{Clip: r.Clip, Reason: r.Skip, Sources: r.SkipSources})
		w.next++
		return nil
	}
	row := manifests.ClipRow{Clip: r.Clip, Start: w.frames, Length: r.Length, Trimmed: r.Trimmed, Sources: make([]manifests.ClipSource, len(r.Mods))}
	for k, m := range r.Mods {
		st := w.mods[k]
		dt, _, err := array.ParseDescr(m.DType)
		if err != nil {
			return err
		}
		if st.frameShape == nil {
			st.dtype, st.frameShape, st.firstClip = dt, m.FrameShape, r.Clip
		}
		var x uint64
		fmt.Sscanf(m.XXH64, "%x", &x)
		row.Sources[k] = manifests.ClipSource{XXH64: x, Path: m.Path, Size: m.Size, MtimeNS: m.MtimeNS}
		st.rows += m.Rows
		if !slices.Contains(st.descrs, m.SourceDescr) {
			st.descrs = append(st.descrs, m.SourceDescr)
		}
		s, err := decodeStats(m.Stats)
		if err != nil {
			return err
		}
		st.stats.Add(f16.Stats(s))
	}
	w.rows = append(w.rows, row)
	w.frames += r.Length
	w.trimmed += r.Trimmed
	w.next++
	return nil
}

// write appends one converted clip (or records it skipped).
func (w *writer) write(c *clipOut) error {
	j := w.job
	id := j.clips[c.index]
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
			rec.SkipSources = append(rec.SkipSources, manifests.Stamp(m.Path(j.root, id)))
		}
		if err := w.journal.write(rec); err != nil {
			return err
		}
		w.skipped = append(w.skipped, manifests.Skipped{Clip: id, Reason: reason, Sources: rec.SkipSources})
		w.next++
		return nil
	}
	row := manifests.ClipRow{Clip: id, Start: w.frames, Length: c.length, Trimmed: c.trimmed, Sources: make([]manifests.ClipSource, len(c.mods))}
	for k := range c.mods {
		mo := &c.mods[k]
		st := w.mods[k]
		if st.w == nil {
			var err error
			if st.w, err = blob.Open(j.blobPath(k), st.dtype, st.frameShape, 0); err != nil {
				return err
			}
		}
		var err error
		if mo.stream {
			err = j.writeStream(w.ctx, mo, j.opts.Modalities[k].KeepDType, func(p []byte) error {
				_, err := st.w.Write(p)
				return err
			})
		} else {
			_, err = st.w.Write(mo.data)
		}
		if err != nil {
			return fmt.Errorf("writing modality %q: %w", j.opts.Modalities[k].Name, err)
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

// pipeline decodes and converts the clips from w.next on with opts.Workers
// goroutines and writes them in order.
func (j *job) pipeline(ctx context.Context, w *writer, res *Result) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.ctx = ctx
	n := len(j.clips)
	// Half the budget for converted clips waiting to be written; the
	// other half for the clips the workers hold (each at most twice
	// streamMin: its source and its converted rows).
	b := newBudget(j.opts.Budget/2, w.next)
	stop := context.AfterFunc(ctx, b.wake)
	defer stop()

	indices := make(chan int, 256)
	results := make(chan *clipOut, 2*j.opts.Workers)
	var wg sync.WaitGroup
	go func() {
		defer close(indices)
		for i := w.next; i < n; i++ {
			select {
			case indices <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range j.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range indices {
				c := j.processClip(ctx, i)
				if !b.acquire(ctx, c.cost, i) {
					c.release()
					return
				}
				select {
				case results <- c:
				case <-ctx.Done():
					c.release()
					return
				}
			}
		}()
	}
	defer func() {
		cancel()
		// Drain so that workers blocked on send can exit.
		go func() {
			for c := range results {
				c.release()
			}
		}()
		wg.Wait()
		close(results)
	}()

	pending := map[int]*clipOut{}
	report := func(phase string) {
		if j.opts.Progress != nil {
			j.opts.Progress(Progress{Clips: w.next, ClipsTotal: n, Resumed: res.Resumed, BytesIn: res.BytesIn, BytesOut: w.bytesOut, Phase: phase})
		}
	}
	report("convert")
	for w.next < n {
		if ctx.Err() != nil {
			w.flush()
			return ctx.Err()
		}
		var c *clipOut
		select {
		case c = <-results:
		case <-ctx.Done():
			w.flush()
			return ctx.Err()
		}
		pending[c.index] = c
		for ctx.Err() == nil {
			c, ok := pending[w.next]
			if !ok {
				break
			}
			delete(pending, w.next)
			err := w.write(c)
			res.BytesIn += c.bytesIn
			c.release()
			b.release(c.cost, w.next)
			if err != nil {
				for _, p := range pending {
					p.release()
				}
				w.flush() // keep what is done for a resume
				return err
			}
			if c.err == nil {
				res.Converted++
			}
			report("convert")
		}
	}
	res.BytesOut = w.bytesOut
	return w.flush()
}

// budget bounds the bytes of converted clips waiting to be written. The
// clip the writer needs next is always admitted, so the pipeline cannot
// deadlock however large one clip is.
type budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	used  int64
	limit int64
	next  int
}

func newBudget(limit int64, next int) *budget {
	b := &budget{limit: limit, next: next}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *budget) acquire(ctx context.Context, cost int64, index int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.used > 0 && b.used+cost > b.limit && index != b.next {
		if ctx.Err() != nil {
			return false
		}
		b.cond.Wait()
	}
	b.used += cost
	return ctx.Err() == nil
}

func (b *budget) release(cost int64, next int) {
	b.mu.Lock()
	b.used -= cost
	b.next = next
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) wake() {
	b.mu.Lock()
	b.mu.Unlock()
	b.cond.Broadcast()
}
