// Run: a convert's steps: the job from the options, an up-to-date check,
// the journal's lock, the staging directory (resumed or new), the
// pipeline, then finalize and commit.

package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/formats/regfile"
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
	// Reused counts the clips whose rows were all copied from the dataset
	// being replaced (unchanged sources, nothing decoded), ReusedPart
	// those of which some modalities were.
	Reused, ReusedPart int
	BytesIn            int64
	BytesOut           int64
	Elapsed            time.Duration
	// EarlyHashed counts the blobs whose sha256 was computed while they
	// were written (see predictRows), not read back at the end.
	EarlyHashed int
	// Dropped is what --keep dropped (nil without it).
	Dropped *Dropped
	// Segment names the segment a convert --segments wrote ("" if no
	// rows were new: the version is a new manifest only).
	Segment string
	// Compacted: the segment holds every row of the version (--compact).
	Compacted bool
	// ReuseRefused says why the dataset being replaced was not reused
	// (manifests.Vouch's error), if it was not.
	ReuseRefused string
}

// UpToDateChecks words what a run found up to date has checked.
const UpToDateChecks = "the inputs' fingerprint, every source's size, mtime, ctime and inode, the files, their sizes and .npy headers, and the manifests' sha256"

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
	prev        *previous    // the dataset being replaced, for its rows (nil: none, or --force)
	prevRefused error        // why the dataset being replaced was not reused (Result.ReuseRefused)
	// streamMin: a .npy source larger than this is converted a piece at a
	// time (see processClip), so that the workers' clips stay within half
	// the budget whatever their size.
	streamMin int64
	blobMem   int64 // buffer memory of each blob writer (BlobMemory)
	// segmented: convert --segments over a dataset it can reuse: only
	// the rows decoded are written, as a new segment of a new version.
	segmented bool
	// labels: per modality, a label modality's codes, one per clip of
	// clips, and its vocabulary (nil for the others; see readLabels).
	codes  [][]int32
	vocab  [][]string
	codeOf []map[string]int32 // label -> code, per label modality
	// vocabBytes: per label modality, its vocabulary's bytes (labelCode)
	vocabBytes []int64
	// vocabFrom: the sha256 of the dataset.json in --out whose labels
	// began the vocabularies ("" for none), checked again under the
	// journal's lock: a convert that finished meanwhile may have given
	// new labels codes this run would give others.
	vocabFrom string
}

// modState is what the writer knows about a modality so far.
type modState struct {
	w          *blob.Writer
	dtype      array.DType
	frameShape []int
	firstClip  string // the clip that set dtype and frame shape
	descrs     []string
	rows       int64
	refRows    int64 // of rows, those left where they are (convert --segments)
	stats      f16.Stats
}

// KeepAfter is how long a run that started afresh must have run for its
// work to be kept when it fails (a var for the tests).
var KeepAfter = time.Minute

// Run converts the clips of o.ClipList into the dataset directory o.Out.
// See the package doc. Errors wrap ErrUsage or ErrInput where they are the
// user's to fix; on error no dataset.json is written or replaced.
func Run(ctx context.Context, o Options) (res *Result, err error) {
	began := time.Now()
	o.Segments = o.Segments || o.Compact // (--compact is a segmented run that copies what it would refer to)
	j, err := newJob(o)
	if err != nil {
		return nil, err
	}
	fresh := false // the run started with nothing to resume
	defer func() {
		// The work done is kept for a resume: say where, and how to drop
		// it. A run that started afresh and failed within KeepAfter keeps
		// nothing (a re-run redoes that much at once): no litter beside
		// --out after a quick mistake.
		if err != nil && !errors.Is(err, ErrUsage) && ctx.Err() == nil {
			if _, serr := os.Stat(j.staging); serr == nil {
				if errors.Is(err, ErrAllSkipped) {
					// (skipped.tsv kept for the user to read; a re-run with the cause mended starts over)
					err = fmt.Errorf("%w (convert --clean --out %s removes it)", err, j.opts.Out)
					return
				}
				if (fresh && time.Since(began) < KeepAfter) || j.segmented {
					if ok, cerr := Clean(j.opts.Out); ok && cerr == nil {
						err = fmt.Errorf("%w (nothing kept: a re-run starts over)", err)
						return
					}
				}
				err = fmt.Errorf("%w (the clips done so far are kept in %s for a re-run to resume; convert --clean --out %s removes them)", err, j.staging, j.opts.Out)
			}
		}
	}()
	if !o.Force {
		if d, ok := j.upToDate(); ok && (!o.Compact || compacted(o.Out, d)) {
			j.removeStale()
			res := &Result{Dir: o.Out, Dataset: d, UpToDate: true, Elapsed: time.Since(began)}
			if o.Keep > 0 {
				if res.Dropped, err = Keep(j.opts.Out, o.Keep); err != nil {
					return nil, err
				}
			}
			return res, nil
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
	if err := j.checkVocabFrom(); err != nil {
		return nil, err
	}
	if o.Segments && !o.Force {
		// What a convert --segments killed before its commit left (under
		// the lock: no run is writing it now), before the dataset is
		// vouched for.
		if d, err := manifests.LoadDataset(j.opts.Out); err == nil {
			if err := removeLeftovers(j.opts.Out, d); err != nil {
				return nil, err
			}
		}
	}
	if !o.Force {
		// Under the lock: no other convert replaces it meanwhile.
		j.prev = j.openPrevious()
		defer j.prev.close()
		j.segmented = o.Segments && j.prev != nil
		if o.Segments && j.prev == nil {
			// A dataset in segments that cannot be grown is not silently
			// rebuilt: that would drop the versions its epochs read.
			if d, err := manifests.LoadDataset(j.opts.Out); err == nil && d.Segmented() {
				why := "it shares no modality with this run"
				if j.prevRefused != nil {
					why = j.prevRefused.Error()
				}
				return nil, fmt.Errorf("%w: --segments: the dataset in %s (version %d) cannot be grown: %s; run verify on it, or convert without --segments to rebuild it as one segment (its kept versions are then removed)",
					ErrInput, j.opts.Out, d.Number(), why)
			}
		}
	}
	res = &Result{Dir: o.Out}
	if j.prevRefused != nil {
		res.ReuseRefused = j.prevRefused.Error()
	}
	w, err := j.prepare(jf)
	if err != nil {
		return nil, err
	}
	fresh = w.next == 0
	defer w.closeBlobs()
	res.Resumed = w.next
	defer j.dirs.Close()
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	if !j.segmented { // (a segment's blobs hold only some of the clips' rows)
		w.pred = make(chan []int64, 1)
		from, base := w.next, w.frames
		go func() { w.pred <- j.predictRows(pctx, from, base) }()
		w.awaitPrediction(ctx, predictWait)
	}
	if err := j.pipeline(ctx, w, res); err != nil {
		return nil, err
	}
	if j.segmented {
		d, js, seg, err := j.finalizeSegments(w)
		if err != nil {
			return nil, err
		}
		if err := j.commitSegments(d, js, seg); err != nil {
			return nil, err
		}
		faults.Point("convert.committed")
		if o.Keep > 0 { // (under the lock still)
			if res.Dropped, err = dropVersions(j.opts.Out, d, o.Keep); err != nil {
				return nil, fmt.Errorf("version %d is committed, but dropping the older ones failed: %w", d.Number(), err)
			}
		}
		if removeStaging(j.staging) == nil {
			os.Remove(j.journalPath)
		}
		res.Dataset, res.Segment, res.Compacted = d, seg, o.Compact
		res.Elapsed = time.Since(began)
		return res, nil
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
	if !slices.ContainsFunc(o.Modalities, func(m Modality) bool { return !m.PerClip }) {
		return nil, fmt.Errorf("%w: every modality is per clip (@clip); at least one must have frames, to give the clips their length", ErrUsage)
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
	if errors.Is(err, manifests.ErrUnsafeID) {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
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
	// --mem: a quarter for the blobs' buffers, shared by the modalities;
	// the rest for the clips in flight (see pipeline).
	j := &job{opts: o, clips: clips, root: root, blobMem: BlobMemory(o.Budget, len(o.Modalities)),
		streamMin: max(minStreamBytes, clipMemory(o.Budget)/int64(4*o.Workers))}
	j.stageBeside(out)
	labelValues, like, err := j.readLabels(clips, out)
	if err != nil {
		return nil, err
	}
	faults.Point("convert.labels-read")
	// The fingerprint covers everything that decides the output bytes.
	if o.MaxTrim == 0 {
		o.MaxTrim = DefaultMaxTrim
	}
	j.opts.MaxTrim = o.MaxTrim
	var trimBound int64 // in the fingerprint only where it decides the output
	if o.Align == "trim" {
		trimBound = o.MaxTrim
	}
	fp, _ := json.Marshal(struct {
		Clips      []string
		Modalities []Modality
		Root       string
		Align      string
		Flags      [4]bool
		MaxTrim    int64      `json:",omitempty"`
		Segments   bool       `json:",omitempty"`
		Labels     [][]string `json:",omitempty"`
		LabelsLike [][]string `json:",omitempty"`
	}{clips, o.Modalities, root, o.Align, [4]bool{o.AllowInt, o.AllowNonFinite, o.AllowOverflow, o.SkipBadClips}, trimBound, o.Segments, labelValues, like})
	sum := sha256.Sum256(fp)
	j.fingerprint = hex.EncodeToString(sum[:])
	if o.Keep < 0 {
		return nil, fmt.Errorf("%w: --keep %d: keep at least the current version (1)", ErrUsage, o.Keep)
	}
	if o.Parts > 0 && o.Segments {
		return nil, fmt.Errorf("%w: --segments with --part: a part is converted whole (merge the parts, then grow the merged dataset with --segments)", ErrUsage)
	}
	if o.Parts > 0 && slices.ContainsFunc(o.Modalities, func(m Modality) bool { return m.LabelKey }) {
		return nil, fmt.Errorf("%w: --part with a label from a pickle key: each part would number the labels it meets apart; put the labels in a column of a .csv clip list (--label NAME=COLUMN), or convert in one process", ErrUsage)
	}
	if o.Parts > 0 {
		if o.Part < 0 || o.Part >= o.Parts || o.Parts > len(clips) {
			return nil, fmt.Errorf("%w: part %d of %d: want 0 <= I < N <= %d clips", ErrUsage, o.Part, o.Parts, len(clips))
		}
		lo, hi := PartRange(len(clips), o.Part, o.Parts)
		j.part = &manifests.Part{Index: o.Part, Count: o.Parts, FirstClip: lo, ListClips: hi - lo, TotalClips: len(clips), Job: j.fingerprint}
		j.clips = clips[lo:hi]
		for k := range j.codes {
			if j.codes[k] != nil {
				j.codes[k] = j.codes[k][lo:hi]
			}
		}
		ps := sha256.Sum256(fmt.Appendf(nil, "%s part %d/%d", j.fingerprint, o.Part, o.Parts))
		j.fingerprint = hex.EncodeToString(ps[:])
	}
	return j, nil
}

// readLabels reads the label modalities' columns of the clip list (whose
// ids are clips) and sets j.codes (a column's codes, one per clip of
// clips), j.vocab and j.codeOf. A label keeps its code: the vocabulary
// starts with the one of the label of the same name in the dataset in
// out (unless --force), or in --labels-like DIR's; a column's values it
// lacks follow in the order the list first gives them, over the whole
// list (so that every part of a partitioned run gives each value the same
// code); a pickle key's, in the order the writer meets them (labelCode).
// A label no clip has any more stays, with no clips. It returns the
// columns' values and the vocabularies of --labels-like, for the
// fingerprint (nil without).
func (j *job) readLabels(clips []string, out string) (values, like [][]string, err error) {
	var cols []string
	labels := 0
	for _, m := range j.opts.Modalities {
		if m.IsLabel() {
			labels++
		}
		if m.Label != "" && !slices.Contains(cols, m.Label) {
			cols = append(cols, m.Label)
		}
	}
	if labels == 0 {
		if j.opts.LabelsLike != "" {
			return nil, nil, fmt.Errorf("%w: --labels-like %s without --label: it orders the labels of --label NAME", ErrUsage, j.opts.LabelsLike)
		}
		return nil, nil, nil
	}
	var byCol map[string][]string
	if len(cols) > 0 {
		if byCol, err = manifests.ReadClipLabels(j.opts.ClipList, cols); err != nil {
			if errors.Is(err, manifests.ErrClipList) && !slices.ContainsFunc([]string{".csv", ".parquet"}, func(e string) bool { return strings.EqualFold(filepath.Ext(j.opts.ClipList), e) }) {
				return nil, nil, fmt.Errorf("%w: %w", ErrUsage, err)
			}
			return nil, nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
	}
	n := len(j.opts.Modalities)
	j.codes, j.vocab, j.codeOf = make([][]int32, n), make([][]string, n), make([]map[string]int32, n)
	var prev *manifests.Dataset
	if !j.opts.Force {
		prev, j.vocabFrom = datasetIn(out) // (checked: distinct labels; nil if none)
	}
	if j.opts.LabelsLike != "" {
		if prev, err = manifests.LoadDataset(j.opts.LabelsLike); err != nil {
			return nil, nil, fmt.Errorf("%w: --labels-like: %w", ErrUsage, err)
		}
	}
	for k, m := range j.opts.Modalities {
		if !m.IsLabel() {
			continue
		}
		j.codeOf[k] = map[string]int32{}
		var pm *manifests.Modality
		if prev != nil {
			pm = prev.Modality(m.Name)
		}
		if j.opts.LabelsLike != "" {
			if pm == nil || !pm.IsLabel() {
				return nil, nil, fmt.Errorf("%w: --labels-like %s: it has no label modality %q (convert --label %s made none there)", ErrUsage, j.opts.LabelsLike, m.Name, m.Name)
			}
			like = append(like, pm.Labels)
		}
		if pm != nil && pm.IsLabel() && len(pm.Labels) < math.MaxInt32 {
			for _, v := range pm.Labels {
				j.codeOf[k][v] = int32(len(j.codeOf[k]))
			}
			j.vocab[k] = slices.Clone(pm.Labels)
		}
		if m.Label == "" {
			continue // a pickle key's: coded by the writer
		}
		vals := byCol[m.Label]
		if len(vals) != len(clips) {
			return nil, nil, fmt.Errorf("%w: %s: column %q has %d values for %d clips", ErrInput, j.opts.ClipList, m.Label, len(vals), len(clips))
		}
		codes := make([]int32, len(vals))
		for i, v := range vals {
			if codes[i], err = j.labelCode(k, v); err != nil {
				return nil, nil, fmt.Errorf("%w: %s: column %q: %w", ErrInput, j.opts.ClipList, m.Label, err)
			}
		}
		j.codes[k] = codes
		values = append(values, vals)
	}
	return values, like, nil
}

// labelCode is label modality k's code of label v, a new one (after the
// others) if v has none yet.
func (j *job) labelCode(k int, v string) (int32, error) {
	c, ok := j.codeOf[k][v]
	if !ok {
		if j.vocabBytes == nil {
			j.vocabBytes = make([]int64, len(j.opts.Modalities))
		}
		if j.vocabBytes[k] += int64(len(v)) + 4; j.vocabBytes[k] > MaxVocabBytes {
			return 0, fmt.Errorf("the labels of %q take more than %d MiB in dataset.json (%d distinct so far): a label names a class shared by clips (a speaker), not one clip (the clip ids are kept anyway: clips.txt, Dataset.ids)",
				j.opts.Modalities[k].Name, MaxVocabBytes>>20, len(j.codeOf[k]))
		}
		c = int32(len(j.codeOf[k]))
		j.codeOf[k][v] = c
		j.vocab[k] = append(j.vocab[k], v)
	}
	return c, nil
}

// MaxVocabBytes bounds a label modality's vocabulary (its labels' bytes,
// and 4 a label): dataset.json and epochs.json hold it, and readers bound
// a manifest to manifests.MaxManifest.
var MaxVocabBytes int64 = 32 << 20

// BlobMemory is the buffer memory each of n blob writers may take under
// a --mem of budget: a quarter of it between them (blob.BuffersFor; at
// least what blob.MinChunk chunks take).
func BlobMemory(budget int64, n int) int64 { return budget / int64(4*max(1, n)) }

// clipMemory is the part of a --mem of budget for the clips in flight:
// what the blobs' buffers leave.
func clipMemory(budget int64) int64 { return budget - budget/4 }

// HeapLimit is the Go heap's soft limit that keeps a run of n modalities
// at --mem budget under budget + 64 MiB of resident memory: the blobs'
// chunk buffers are mapped outside the heap, and the program's text,
// stacks and the runtime's own take about 16 MiB more.
func HeapLimit(budget int64, n int) int64 {
	size, retain := blob.BuffersFor(BlobMemory(budget, n))
	blobs := int64(max(1, n)) * (3*int64(size) + int64(retain)) // the retained prefix's replacements are on the heap
	return max(16<<20, budget+64<<20-blobs-16<<20)
}

// minStreamBytes is the smallest .npy source converted a piece at a time
// (a variable for the tests).
var minStreamBytes int64 = 1 << 20

// PartRange returns the clip index range [lo, hi) of part i of n over a
// list of total clips: contiguous, in order, sizes differing by at most one.
func PartRange(total, i, n int) (lo, hi int) {
	return total * i / n, total * (i + 1) / n
}

// compacted reports whether the dataset d in dir is one segment: format
// 1, or format 2 with one blob a modality holding exactly its clips' rows,
// in clip order (convert --compact has nothing to do).
func compacted(dir string, d *manifests.Dataset) bool {
	if !d.Segmented() {
		return true
	}
	for _, m := range d.Modalities {
		if bl := m.BlobList(); len(bl) != 1 || bl[0].Rows != m.Rows {
			return false
		}
	}
	starts, lengths, err := manifests.ReadIndex(filepath.Join(dir, d.Files.Index))
	if err != nil {
		return false
	}
	wh, err := manifests.LoadWhere(dir, d, starts, lengths)
	if err != nil {
		return false
	}
	for k, m := range d.Modalities {
		for i := range starts {
			want := starts[i] * int64(m.Rate)
			if m.PerClip {
				want = int64(i)
			}
			if b, first, _ := d.Locate(wh, k, i, starts[i], lengths[i]); b != 0 || first != want {
				return false
			}
		}
	}
	return true
}

// upToDate reports whether o.Out holds a dataset made from the same inputs
// whose sources are unchanged (their whole stamps), and that
// manifests.Vouch vouches for (files, headers, sizes and the manifests'
// sums: not the blobs' bytes).
func (j *job) upToDate() (*manifests.Dataset, bool) {
	d, err := manifests.LoadDataset(j.opts.Out)
	if err != nil || d.Fingerprint != j.fingerprint {
		return nil, false
	}
	d, rows, err := manifests.Vouch(j.opts.Out)
	if err != nil {
		return nil, false
	}
	for _, r := range rows {
		for k, s := range r.Sources {
			if k < len(d.Modalities) && d.Modalities[k].LabelColumn != "" {
				continue // no file: the fingerprint covers the labels
			}
			if st := s.Stamp(); st.Racy() || manifests.Stamp(s.Path) != st {
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

// Clean removes what an interrupted or failed run into out left next to
// it for a resume (the staging folder, if it holds only convert's files,
// and the journal), unless a run is writing it now. It reports whether
// there was anything.
func Clean(out string) (bool, error) {
	out, err := filepath.Abs(out)
	if err != nil {
		return false, err
	}
	j := &job{opts: Options{Out: out}}
	j.stageBeside(out)
	_, e1 := os.Stat(j.staging)
	_, e2 := os.Stat(j.journalPath)
	if e1 != nil && e2 != nil {
		return false, nil
	}
	jf, err := j.lockJournal()
	if err != nil {
		return false, err
	}
	defer jf.Close()
	if err := removeStaging(j.staging); err != nil {
		return false, err
	}
	return true, os.Remove(j.journalPath)
}

// stageBeside names j's staging folder and journal, beside out.
func (j *job) stageBeside(out string) {
	parent, base := filepath.Split(out)
	j.staging = filepath.Join(parent, ".clipshard-partial-"+base)
	j.journalPath = j.staging + ".journal"
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

// datasetIn is the dataset in dir and the sha256 of its dataset.json
// (nil and "" if there is none, or none that parses).
func datasetIn(dir string) (*manifests.Dataset, string) {
	p := filepath.Join(dir, manifests.DatasetFile)
	b, err := regfile.ReadFile(p, manifests.MaxManifest)
	if err != nil {
		return nil, ""
	}
	d, err := manifests.ParseDataset(p, b)
	if err != nil {
		return nil, ""
	}
	h := sha256.Sum256(b)
	return d, hex.EncodeToString(h[:])
}

// checkVocabFrom refuses a run with labels that found a dataset in --out
// (its vocabularies' start, unless --labels-like) that another convert
// has replaced since (called under the journal's lock).
func (j *job) checkVocabFrom() error {
	if j.vocab == nil || j.opts.Force {
		return nil
	}
	if _, now := datasetIn(j.opts.Out); now != j.vocabFrom {
		return fmt.Errorf("%w: the dataset in %s changed after this convert read its labels (another convert finished meanwhile): run it again, and it starts from that one", ErrUsage, j.opts.Out)
	}
	return nil
}

// labelsOf is modality k's vocabulary (nil if it is not a label).
func (j *job) labelsOf(k int) []string {
	if k < len(j.vocab) {
		return j.vocab[k]
	}
	return nil
}
