// Plan: the job from the options and the dataset (checked against its
// blobs), the epochs to write, their samples, and what they will take in
// memory and on disk.

package shuffle

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/manifests"
)

type modInfo struct {
	name       string
	rate       int64 // rows per clip frame; 0 for a per-clip modality
	perClip    bool  // one row per clip: a sample takes its clip's row
	frameShape []int
	dtype      array.DType
	rowBytes   int64 // bytes per blob row
	winBytes   int64 // bytes per sample: W*rate rows (one row if perClip)
}

// srcInfo is one source dataset (a plain run has one): its blobs, and
// where its clips and frames lie in the job's global numbering (the
// sources' clips one after the other, in order).
type srcInfo struct {
	name   string
	dir    string
	ds     *manifests.Dataset
	sha    string // of its dataset.json
	clip0  int64  // global number of its first clip
	frame0 int64  // global number of its first frame
	files  []srcFile
}

// srcFile is a source's blob of one modality (in the order of job.mods).
type srcFile struct {
	path       string
	dataOffset int64
	rows       int64
}

type epochPlan struct {
	epoch   int
	samples []manifests.Sample // shuffled; global clip numbers
	base    int64              // global position of the first sample
	counts  []int64            // samples per source (a mixed run)
	weights []json.Number      // the epoch's weights, as recorded (natural: the sources' own counts)
}

type job struct {
	o       Options
	srcs    []srcInfo
	mixed   bool    // several sources (or --source): epochs format version 3
	starts  []int64 // per global clip, its first global frame
	lengths []int64
	mods    []modInfo
	rec     int64  // bytes of one sample across modalities
	zeros   []byte // the largest window's worth of zeros (read only)
	epochs  []epochPlan
	total   int64 // samples to write
	man     *manifests.Epochs
	// stale: the epochs in Out are of another dataset or (with --force)
	// other options, and are replaced (setup); replaced counts them.
	stale    bool
	replaced int
	ext      bool // the external (two-pass) path
}

// Source is one --source NAME=DIR of a mixed run.
type Source struct{ Name, Dir string }

func newJob(o Options) (*job, error) {
	mixed := len(o.Sources) > 0
	switch {
	case o.Out == "":
		return nil, fmt.Errorf("%w: --out is required", ErrUsage)
	case mixed && o.Dataset != "":
		return nil, fmt.Errorf("%w: give --dataset DIR or --source NAME=DIR ..., not both", ErrUsage)
	case !mixed && o.Dataset == "":
		return nil, fmt.Errorf("%w: --dataset DIR (or --source NAME=DIR ...) is required", ErrUsage)
	case !mixed && (len(o.Mix.Ranges) > 0 || o.Mix.EpochSamples != 0):
		return nil, fmt.Errorf("%w: --weights and --epoch-samples mix --source datasets; with one --dataset, give it as --source NAME=DIR", ErrUsage)
	}
	if err := o.Sampling.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if o.EpochEnd <= o.EpochStart || o.EpochStart < 0 || o.EpochEnd > 9999 {
		return nil, fmt.Errorf("%w: epochs [%d, %d): want 0 <= A < B <= 9999", ErrUsage, o.EpochStart, o.EpochEnd)
	}
	if o.ShardSize == 0 {
		o.ShardSize = 1024
	}
	if o.Mem == 0 {
		o.Mem = 2 << 30
	}
	if o.ShardSize < 1 || o.Mem < 64<<10 {
		return nil, fmt.Errorf("%w: --shard-samples %d, --mem %d: want >= 1, >= 64KiB", ErrUsage, o.ShardSize, o.Mem)
	}
	if o.Workers < 0 || o.Workers > 256 {
		return nil, fmt.Errorf("%w: --workers %d: want 1..256 (0: the CPUs)", ErrUsage, o.Workers)
	}
	if o.Mix.EpochSamples < 0 {
		return nil, fmt.Errorf("%w: --epoch-samples %d: want >= 1 (0: the sources' own counts)", ErrUsage, o.Mix.EpochSamples)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var err error
	if o.Out, err = filepath.Abs(o.Out); err != nil {
		return nil, err
	}
	list := o.Sources
	if !mixed {
		list = []Source{{Dir: o.Dataset}}
	}
	seen := map[string]bool{}
	j := &job{o: o, mixed: mixed}
	for _, src := range list {
		if mixed {
			if err := manifests.CheckSourceName(src.Name); err != nil {
				return nil, fmt.Errorf("%w: --source %s=%s: %w", ErrUsage, src.Name, src.Dir, err)
			}
			if seen[src.Name] {
				return nil, fmt.Errorf("%w: --source %s is given twice", ErrUsage, src.Name)
			}
			seen[src.Name] = true
		}
		dir, err := filepath.Abs(src.Dir)
		if err != nil {
			return nil, err
		}
		if !mixed {
			j.o.Dataset = dir
		}
		if err := j.addSource(src.Name, dir); err != nil {
			return nil, err
		}
	}
	if mixed {
		if err := j.o.Mix.CheckRanges(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		names := j.sourceNames()
		for e := o.EpochStart; e < o.EpochEnd; e++ {
			if _, ok := j.o.Mix.At(e, names); !ok {
				return nil, fmt.Errorf("%w: epoch %d has no weights: no --weights range holds it", ErrUsage, e)
			}
		}
	}
	for _, m := range j.mods {
		j.rec += m.winBytes
		if int64(len(j.zeros)) < m.winBytes {
			j.zeros = make([]byte, m.winBytes)
		}
	}
	if j.man, err = openManifest(j); err != nil {
		return nil, err
	}
	return j, nil
}

// sourceNames lists the sources' names, in order.
func (j *job) sourceNames() []string {
	var out []string
	for _, s := range j.srcs {
		out = append(out, s.name)
	}
	return out
}

// srcWords names source s for a message: "source wild (/data/wild)", or
// the dataset's folder in a plain run.
func (j *job) srcWords(s int) string {
	if !j.mixed {
		return j.srcs[s].dir
	}
	return fmt.Sprintf("source %s (%s)", j.srcs[s].name, j.srcs[s].dir)
}

// addSource loads the dataset in dir, checks its index and blobs, and
// appends its clips to the job's; the first source's modalities are the
// job's.
func (j *job) addSource(name, dir string) error {
	ds, err := manifests.LoadDataset(dir)
	if errors.Is(err, manifests.ErrWrongKind) {
		return fmt.Errorf("%w: %s", ErrUsage, strings.TrimPrefix(err.Error(), manifests.ErrWrongKind.Error()+": "))
	}
	if err != nil {
		return err
	}
	sha, err := manifests.HashFile(filepath.Join(dir, manifests.DatasetFile))
	if err != nil {
		return err
	}
	starts, lengths, err := manifests.ReadIndex(filepath.Join(dir, ds.Files.Index))
	if err != nil {
		return err
	}
	if int64(len(starts)) != ds.Clips {
		return fmt.Errorf("%w: %s: index.npy has %d clips, dataset.json %d (run verify)", manifests.ErrManifest, dir, len(starts), ds.Clips)
	}
	var next int64
	for i := range starts {
		if starts[i] != next || lengths[i] < 0 {
			return fmt.Errorf("%w: %s: index.npy row %d: start %d length %d, want start %d (contiguous from 0; run verify)",
				manifests.ErrManifest, dir, i, starts[i], lengths[i], next)
		}
		next += lengths[i]
	}
	if next != ds.Frames {
		return fmt.Errorf("%w: %s: index.npy's lengths add up to %d frames, dataset.json says %d (run verify)", manifests.ErrManifest, dir, next, ds.Frames)
	}
	src := srcInfo{name: name, dir: dir, ds: ds, sha: sha, clip0: int64(len(j.lengths))}
	if len(j.srcs) > 0 {
		last := &j.srcs[len(j.srcs)-1]
		src.frame0 = last.frame0 + last.ds.Frames
	}
	var mods []modInfo
	for _, m := range ds.Modalities {
		if strings.EqualFold(m.Name, "samples") {
			return fmt.Errorf("%w: %s: modality %q collides with the shards' samples files; convert again with another name", manifests.ErrManifest, dir, m.Name)
		}
		dt, _, err := array.ParseDescr(m.DType)
		if err != nil {
			return err
		}
		rb, err := array.ByteSize(m.FrameShape, dt.Size)
		if err != nil {
			return err
		}
		mi := modInfo{name: m.Name, rate: int64(m.Rate), perClip: m.PerClip, frameShape: m.FrameShape, dtype: dt,
			rowBytes: rb, winBytes: int64(j.o.Sampling.Window) * int64(m.Rate) * rb}
		if m.PerClip {
			mi.rate, mi.winBytes = 0, rb
		}
		f := srcFile{path: filepath.Join(dir, m.File), dataOffset: m.DataOffset, rows: m.Rows}
		if err := checkBlob(ds, starts, lengths, mi, f); err != nil {
			return err
		}
		mods = append(mods, mi)
		src.files = append(src.files, f)
	}
	if len(j.srcs) == 0 {
		j.mods = mods
	} else if err := j.compareMods(name, dir, mods); err != nil {
		return err
	}
	for i := range starts {
		j.starts = append(j.starts, src.frame0+starts[i])
	}
	j.lengths = append(j.lengths, lengths...)
	j.srcs = append(j.srcs, src)
	return nil
}

// compareMods refuses a source whose modality schema differs from the
// first source's, naming the difference.
func (j *job) compareMods(name, dir string, mods []modInfo) error {
	first := j.srcs[0].name
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: source %s (%s): %s (the sources must share their modalities: names, per-clip, rates, frame shapes, dtypes)", ErrUsage, name, dir, fmt.Sprintf(format, args...))
	}
	names := func(ms []modInfo) string {
		var n []string
		for _, m := range ms {
			n = append(n, m.name)
		}
		return strings.Join(n, ",")
	}
	if names(mods) != names(j.mods) {
		return bad("has modalities %s, source %s has %s", names(mods), first, names(j.mods))
	}
	clipWord := func(b bool) string {
		if b {
			return "per-clip"
		}
		return "per-frame"
	}
	for k, m := range mods {
		f := j.mods[k]
		switch {
		case m.perClip != f.perClip:
			return bad("modality %s is %s, source %s's %s", m.name, clipWord(m.perClip), first, clipWord(f.perClip))
		case m.rate != f.rate:
			return bad("modality %s has rate %d, source %s's %d", m.name, m.rate, first, f.rate)
		case !slices.Equal(m.frameShape, f.frameShape):
			return bad("modality %s has frame shape %s, source %s's %s", m.name, array.FormatShape(m.frameShape), first, array.FormatShape(f.frameShape))
		case m.dtype.Descr() != f.dtype.Descr():
			return bad("modality %s has dtype %s, source %s's %s", m.name, m.dtype.Descr(), first, f.dtype.Descr())
		}
	}
	return nil
}

// checkBlob refuses a blob shorter than the manifest says (a damaged or
// replaced dataset), naming the first clip whose rows are missing: both
// paths read every row, and learning it half-way would waste the run.
//
// It also refuses a blob that disagrees with dataset.json and index.npy in
// any number the shuffle relies on (rows, header, size): every window is
// cut from the rows those numbers locate.
func checkBlob(ds *manifests.Dataset, starts, lengths []int64, m modInfo, sf srcFile) error {
	path, rows := sf.path, sf.rows
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s (run verify)", manifests.ErrManifest, path, fmt.Sprintf(format, args...))
	}
	if m.rowBytes <= 0 {
		return bad("modality %q: frame shape %v holds no values", m.name, m.frameShape)
	}
	if want := ds.Frames * m.rate; !m.perClip && rows != want {
		return bad("dataset.json says %d rows, but %d frames at rate %d make %d", rows, ds.Frames, m.rate, want)
	}
	if m.perClip && rows != ds.Clips {
		return bad("dataset.json says %d rows for per-clip modality %q, but there are %d clips", rows, m.name, ds.Clips)
	}
	f, fi, err := regfile.Open(path)
	if err != nil {
		return err
	}
	h, herr := npy.ReadHeader(f, fi.Size())
	f.Close()
	need := sf.dataOffset + rows*m.rowBytes
	if herr != nil && fi.Size() >= need {
		return bad("%v", herr)
	}
	if herr == nil {
		wantShape := append([]int{int(rows)}, m.frameShape...)
		switch {
		case h.Descr != m.dtype.Descr() || h.Fortran || !slices.Equal(h.Shape, wantShape):
			return bad("the header says %s %s, dataset.json %s %s", h.Descr, array.FormatShape(h.Shape), m.dtype.Descr(), array.FormatShape(wantShape))
		case h.DataOffset != sf.dataOffset:
			return bad("data at byte %d, dataset.json says %d", h.DataOffset, sf.dataOffset)
		case fi.Size() > need:
			return bad("%d bytes, dataset.json needs %d: %d bytes too many", fi.Size(), need, fi.Size()-need)
		}
	}
	if fi.Size() >= need {
		return nil
	}
	if len(starts) == 0 {
		return bad("%d bytes, dataset.json needs %d", fi.Size(), need)
	}
	have := max(0, (fi.Size()-sf.dataOffset)/m.rowBytes) // whole rows present
	c := sort.Search(len(starts), func(c int) bool { return (starts[c]+lengths[c])*m.rate > have })
	if m.perClip {
		c = int(have)
	}
	c = min(c, len(starts)-1)
	first := starts[max(c, 0)] * m.rate
	if m.perClip {
		first = int64(c)
	}
	return fmt.Errorf("%w: %s: %d bytes, dataset.json needs %d: the rows of clip %d on (from byte %d) are missing (run verify)",
		manifests.ErrManifest, path, fi.Size(), need, c, sf.dataOffset+first*m.rowBytes)
}

// srcOf returns the source of global clip c.
func (j *job) srcOf(c int64) int {
	if len(j.srcs) == 1 {
		return 0
	}
	return sort.Search(len(j.srcs), func(s int) bool { return j.srcs[s].clip0 > c }) - 1
}

// sampleRows returns the source of sample smp and the rows of that
// source's blob of modality k that it takes: its window's valid rows, or,
// for a per-clip modality, its clip's row.
func (j *job) sampleRows(k int, smp manifests.Sample) (src int, first, n int64) {
	src = j.srcOf(smp.Clip)
	s := &j.srcs[src]
	m := &j.mods[k]
	if m.perClip {
		return src, smp.Clip - s.clip0, 1
	}
	return src, (j.starts[smp.Clip] - s.frame0 + smp.Start) * m.rate, smp.Valid * m.rate
}

// readErr words a failed read of a blob from byte off on, where clip
// (if >= 0) is the first clip read (a blob that shrank since the run
// started, or a failing disk).
func readErr(path string, off int64, clip int, err error) error {
	if errors.Is(err, io.EOF) {
		err = errors.New("the file ends early (changed during the run? run verify)")
	}
	if clip >= 0 {
		return fmt.Errorf("%s: reading from byte %d (clip %d on): %w", path, off, clip, err)
	}
	return fmt.Errorf("%s: reading from byte %d: %w", path, off, err)
}

// toDo splits the requested epochs into those to write and those already
// whole in the manifest (skipped, unless --force). An epoch the manifest
// lists whose files are gone or cut short is written again.
func (j *job) toDo() (todo, skipped []int) {
	for e := j.o.EpochStart; e < j.o.EpochEnd; e++ {
		if x := j.man.Entry(e); x != nil && !j.o.Force && !j.stale && j.whole(*x) {
			skipped = append(skipped, e)
			continue
		}
		todo = append(todo, e)
	}
	return todo, skipped
}

// whole reports whether every file of epoch entry x is in the epochs
// directory, a regular file of the size its shape makes (a folder removed
// by hand, or a file cut short, makes the epoch one to write again).
func (j *job) whole(x manifests.EpochEntry) bool {
	for _, sh := range x.Shards {
		for what, rel := range sh.Files {
			want := int64(npy.DataAlign) + int64(sh.Samples)*j.sampleRec()
			if what != "samples" {
				var m *manifests.EpochModality
				for i := range j.man.Modalities {
					if j.man.Modalities[i].Name == what {
						m = &j.man.Modalities[i]
					}
				}
				if m == nil {
					return false
				}
				sb, err := m.SampleBytes()
				if err != nil {
					return false
				}
				want = int64(npy.DataAlign) + int64(sh.Samples)*sb
			}
			st, err := os.Lstat(filepath.Join(j.o.Out, filepath.FromSlash(rel)))
			if err != nil || !st.Mode().IsRegular() || st.Size() != want {
				return false
			}
		}
	}
	return true
}

// emptyErr words the refusal of an epoch that would have no samples,
// saying which option to change.
func (j *job) emptyErr(e int) error {
	var longest int64
	for _, l := range j.lengths {
		longest = max(longest, l)
	}
	hint := "lower --window"
	if j.o.Sampling.Short != "pad" {
		hint += " or use --short pad"
	}
	return fmt.Errorf("%w: epoch %d would have no samples: every clip is shorter than --window %d (the longest has %d frames); %s (--allow-empty writes empty epochs)",
		ErrEmpty, e, j.o.Sampling.Window, longest, hint)
}

// ErrEmpty marks a run that would write an epoch without samples.
var ErrEmpty = errors.New("shuffle: nothing to write")

// plan derives the samples of every epoch to write.
func (j *job) plan(epochs []int) {
	j.epochs = nil
	var base int64
	for _, e := range epochs {
		ep := epochPlan{epoch: e, base: base}
		if j.mixed {
			w, _ := j.o.Mix.At(e, j.sourceNames())
			m := manifests.MixEpoch(j.mixSources(), j.o.Sampling, j.o.Seed, e, w, j.o.Mix.EpochSamples)
			ep.samples, ep.counts, ep.weights = m.Samples, m.Counts, m.Weights
		} else {
			ep.samples = manifests.Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		}
		base += int64(len(ep.samples))
		j.epochs = append(j.epochs, ep)
	}
	j.total = base
}

// epochMix is the weights and counts per source that a mixed epoch's
// entry records.
func (j *job) epochMix(ep *epochPlan) (map[string]json.Number, map[string]int64) {
	w, c := map[string]json.Number{}, map[string]int64{}
	for s, src := range j.srcs {
		c[src.name], w[src.name] = ep.counts[s], ep.weights[s]
	}
	return w, c
}

// mixSources is the sources' clip lengths.
func (j *job) mixSources() []manifests.MixSource {
	out := make([]manifests.MixSource, len(j.srcs))
	for s, src := range j.srcs {
		out[s].Lengths = j.lengths[src.clip0 : src.clip0+src.ds.Clips]
	}
	return out
}

// count returns the samples epoch e will have (without making the list),
// or refuses a mixed epoch in which a source with a share has no samples.
func (j *job) count(e int) (int64, error) {
	if j.o.Mix.EpochSamples > MaxEpochSamples {
		return 0, fmt.Errorf("%w: --epoch-samples %d: at most %d (2^40) samples an epoch", ErrUsage, j.o.Mix.EpochSamples, int64(MaxEpochSamples))
	}
	if !j.mixed {
		n := manifests.CountSamples(j.lengths, j.o.Sampling, j.o.Seed, e)
		if n > MaxEpochSamples || n < 0 {
			return 0, fmt.Errorf("%w: epoch %d would have %d samples: at most %d (2^40) an epoch (a smaller --per-clip)", ErrUsage, e, n, int64(MaxEpochSamples))
		}
		return n, nil
	}
	natural := manifests.MixNatural(j.mixSources(), j.o.Sampling, j.o.Seed, e)
	n := j.o.Mix.EpochSamples
	if n == 0 {
		for _, c := range natural {
			n += c
		}
	}
	w, _ := j.o.Mix.At(e, j.sourceNames())
	for s, c := range manifests.MixCounts(natural, w, n) {
		if c > 0 && natural[s] == 0 {
			return 0, fmt.Errorf("%w: epoch %d: %s is to give %d of the epoch's %d samples, but has none (every clip shorter than --window %d, or no clips); give it weight 0 there, or lower --window",
				ErrUsage, e, j.srcWords(s), c, n, j.o.Sampling.Window)
		}
	}
	return n, nil
}

// position maps a global output position to its epoch plan and index.
func (j *job) position(pos int64) (*epochPlan, int) {
	i := sort.Search(len(j.epochs), func(i int) bool { return j.epochs[i].base > pos }) - 1
	ep := &j.epochs[i]
	return ep, int(pos - ep.base)
}

// epochMeta is the memory that planning an epoch of n samples takes: its
// samples and the entries of its shards (in the plan and the manifest).
func (j *job) epochMeta(n int64) int64 {
	shards := 1 + n/int64(j.o.ShardSize)
	meta := satAdd(satMul(n, sampleMeta), satMul(shards, int64(shardMeta+64*len(j.mods))))
	if j.mixed {
		meta = satAdd(meta, satMul(n, 24)) // the sources' own lists, before they are merged
	}
	return meta
}

// MaxEpochSamples bounds an epoch's samples (2^40: its plan alone would
// take 32 TiB): a count past it is refused before anything is sized.
const MaxEpochSamples = 1 << 40

// satMul and satAdd are a*b and a+b of counts and sizes >= 0, saturated
// at the largest int64 instead of wrapping: a size check of a huge
// count refuses it rather than passing a wrapped, small figure.
func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a && s >= b {
		return s
	}
	return math.MaxInt64
}

// metaSlack is how far one epoch's plan may go past a quarter of --mem.
const metaSlack = 16 << 20

// shardMeta is about what a shard's entries take in the plan and the
// manifest, besides 64 bytes per modality file.
const shardMeta = 512

// sampleMeta is the memory a planned sample takes: its Sample in the
// epoch's list and, on the external path, its position in the per-clip
// index.
const sampleMeta = 32

// sizeString words a byte count for a person: 2.5GiB.
func sizeString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// epochFiles is the number of shard files (modalities and samples) of an
// epoch of n samples.
func (j *job) epochFiles(n int64) int64 {
	if n == 0 {
		return 0
	}
	return satMul(n/int64(j.o.ShardSize)+min(1, n%int64(j.o.ShardSize)), int64(len(j.mods)+1))
}

// diskBlock bounds the filesystem's allocation unit that the space check
// allows for at the end of each file.
const diskBlock = 4096

// epochBytes is what the shards of an epoch of n samples take on disk.
func (j *job) epochBytes(n int64) int64 {
	return satAdd(satMul(n, satAdd(j.rec, j.sampleRec())), satMul(j.epochFiles(n), npy.DataAlign))
}

// checkSpace refuses to start when the filesystem of out lacks the room
// for need bytes: the shards and manifests (the external path's piles lie
// in the shards' files).
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
		return fmt.Errorf("%w: %s needs %s (%d bytes) for the shards and manifests, the filesystem has %s (%d bytes) free", ErrUsage, out, sizeString(need), need, sizeString(free), free)
	}
	return nil
}
