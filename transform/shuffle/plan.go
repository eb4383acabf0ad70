// Plan: the job from the options and the dataset (checked against its
// blobs), the epochs to write, their samples, and what they will take in
// memory and on disk.

package shuffle

import (
	"errors"
	"fmt"
	"io"
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
	file       string
	rate       int64 // rows per clip frame; 0 for a per-clip modality
	perClip    bool  // one row per clip: a sample takes its clip's row
	frameShape []int
	dtype      array.DType
	rowBytes   int64 // bytes per blob row
	winBytes   int64 // bytes per sample: W*rate rows (one row if perClip)
	dataOffset int64
}

type epochPlan struct {
	epoch   int
	samples []manifests.Sample // shuffled
	base    int64              // global position of the first sample
}

type job struct {
	o       Options
	ds      *manifests.Dataset
	starts  []int64
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

func newJob(o Options) (*job, error) {
	if o.Dataset == "" || o.Out == "" {
		return nil, fmt.Errorf("%w: --dataset and --out are required", ErrUsage)
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
	if o.Now == nil {
		o.Now = time.Now
	}
	var err error
	if o.Out, err = filepath.Abs(o.Out); err != nil {
		return nil, err
	}
	if o.Dataset, err = filepath.Abs(o.Dataset); err != nil {
		return nil, err
	}
	ds, err := manifests.LoadDataset(o.Dataset)
	if err != nil {
		return nil, err
	}
	starts, lengths, err := manifests.ReadIndex(filepath.Join(o.Dataset, ds.Files.Index))
	if err != nil {
		return nil, err
	}
	if int64(len(starts)) != ds.Clips {
		return nil, fmt.Errorf("%w: %s: index.npy has %d clips, dataset.json %d (run verify)", manifests.ErrManifest, o.Dataset, len(starts), ds.Clips)
	}
	var next int64
	for i := range starts {
		if starts[i] != next || lengths[i] < 0 {
			return nil, fmt.Errorf("%w: %s: index.npy row %d: start %d length %d, want start %d (contiguous from 0; run verify)",
				manifests.ErrManifest, o.Dataset, i, starts[i], lengths[i], next)
		}
		next += lengths[i]
	}
	if next != ds.Frames {
		return nil, fmt.Errorf("%w: %s: index.npy's lengths add up to %d frames, dataset.json says %d (run verify)", manifests.ErrManifest, o.Dataset, next, ds.Frames)
	}
	j := &job{o: o, ds: ds, starts: starts, lengths: lengths}
	for _, m := range ds.Modalities {
		if strings.EqualFold(m.Name, "samples") {
			return nil, fmt.Errorf("%w: %s: modality %q collides with the shards' samples files; convert again with another name", manifests.ErrManifest, o.Dataset, m.Name)
		}
		dt, _, err := array.ParseDescr(m.DType)
		if err != nil {
			return nil, err
		}
		rb, err := array.ByteSize(m.FrameShape, dt.Size)
		if err != nil {
			return nil, err
		}
		mi := modInfo{name: m.Name, file: m.File, rate: int64(m.Rate), perClip: m.PerClip, frameShape: m.FrameShape, dtype: dt,
			rowBytes: rb, winBytes: int64(o.Sampling.Window) * int64(m.Rate) * rb, dataOffset: m.DataOffset}
		if m.PerClip {
			mi.rate, mi.winBytes = 0, rb
		}
		if err := j.checkBlob(mi, m.Rows); err != nil {
			return nil, err
		}
		j.mods = append(j.mods, mi)
		j.rec += mi.winBytes
		if int64(len(j.zeros)) < mi.winBytes {
			j.zeros = make([]byte, mi.winBytes)
		}
	}
	if j.man, err = openManifest(j); err != nil {
		return nil, err
	}
	return j, nil
}

// checkBlob refuses a blob shorter than the manifest says (a damaged or
// replaced dataset), naming the first clip whose rows are missing: both
// paths read every row, and learning it half-way would waste the run.
//
// It also refuses a blob that disagrees with dataset.json and index.npy in
// any number the shuffle relies on (rows, header, size): every window is
// cut from the rows those numbers locate.
func (j *job) checkBlob(m modInfo, rows int64) error {
	path := filepath.Join(j.o.Dataset, m.file)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s (run verify)", manifests.ErrManifest, path, fmt.Sprintf(format, args...))
	}
	if m.rowBytes <= 0 {
		return bad("modality %q: frame shape %v holds no values", m.name, m.frameShape)
	}
	if want := j.ds.Frames * m.rate; !m.perClip && rows != want {
		return bad("dataset.json says %d rows, but %d frames at rate %d make %d", rows, j.ds.Frames, m.rate, want)
	}
	if m.perClip && rows != j.ds.Clips {
		return bad("dataset.json says %d rows for per-clip modality %q, but there are %d clips", rows, m.name, j.ds.Clips)
	}
	f, fi, err := regfile.Open(path)
	if err != nil {
		return err
	}
	h, herr := npy.ReadHeader(f, fi.Size())
	f.Close()
	need := m.dataOffset + rows*m.rowBytes
	if herr != nil && fi.Size() >= need {
		return bad("%v", herr)
	}
	if herr == nil {
		wantShape := append([]int{int(rows)}, m.frameShape...)
		switch {
		case h.Descr != m.dtype.Descr() || h.Fortran || !slices.Equal(h.Shape, wantShape):
			return bad("the header says %s %s, dataset.json %s %s", h.Descr, array.FormatShape(h.Shape), m.dtype.Descr(), array.FormatShape(wantShape))
		case h.DataOffset != m.dataOffset:
			return bad("data at byte %d, dataset.json says %d", h.DataOffset, m.dataOffset)
		case fi.Size() > need:
			return bad("%d bytes, dataset.json needs %d: %d bytes too many", fi.Size(), need, fi.Size()-need)
		}
	}
	if fi.Size() >= need {
		return nil
	}
	have := max(0, (fi.Size()-m.dataOffset)/m.rowBytes) // whole rows present
	c := sort.Search(len(j.starts), func(c int) bool { return (j.starts[c]+j.lengths[c])*m.rate > have })
	if m.perClip {
		c = int(have)
	}
	first, _ := j.sampleRows(m, manifests.Sample{Clip: int64(min(c, len(j.starts)-1))})
	return fmt.Errorf("%w: %s: %d bytes, dataset.json needs %d: the rows of clip %d on (from byte %d) are missing (run verify)",
		manifests.ErrManifest, path, fi.Size(), need, c, m.dataOffset+first*m.rowBytes)
}

// sampleRows returns the rows of m's blob that sample smp takes: its
// window's valid rows, or, for a per-clip modality, its clip's row.
func (j *job) sampleRows(m modInfo, smp manifests.Sample) (first, n int64) {
	if m.perClip {
		return smp.Clip, 1
	}
	return (j.starts[smp.Clip] + smp.Start) * m.rate, smp.Valid * m.rate
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
			want := int64(npy.DataAlign) + int64(sh.Samples)*24
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
		all := manifests.Samples(j.lengths, j.o.Sampling, j.o.Seed, e)
		ep := epochPlan{epoch: e, samples: all, base: base}
		base += int64(len(ep.samples))
		j.epochs = append(j.epochs, ep)
	}
	j.total = base
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
	return n*sampleMeta + shards*int64(shardMeta+64*len(j.mods))
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
	return (n + int64(j.o.ShardSize) - 1) / int64(j.o.ShardSize) * int64(len(j.mods)+1)
}

// diskBlock bounds the filesystem's allocation unit that the space check
// allows for at the end of each file.
const diskBlock = 4096

// epochBytes is what the shards of an epoch of n samples take on disk.
func (j *job) epochBytes(n int64) int64 {
	return n*(j.rec+24) + j.epochFiles(n)*npy.DataAlign
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
