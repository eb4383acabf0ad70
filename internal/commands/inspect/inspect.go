// Package inspectcmd is "clipshard inspect": what a dataset or an epochs
// folder holds, in text, JSON or a self-contained HTML page of plots, read
// from the manifests and from a bounded sample of the data.
package inspectcmd

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

const usage = `usage: inspect [--json | --html FILE [--force]] [--clip ID] [--sample EPOCH:I] [--fps F] [--rows N] [--batch B] [--mem SIZE] DIR|s3://BUCKET/PREFIX

Show what DIR holds: a dataset written by convert (its dataset.json) or an
epochs folder written by shuffle (its epochs.json); or one pushed to a
bucket (s3://BUCKET/PREFIX: its manifests and headers fetched, the rows
sampled read by bounded ranged GETs, nothing else downloaded).
  dataset  clips, frames, hours at --fps; per modality dtype, frame shape,
           rate, bytes and the conversion's NaN/Inf/overflow/underflow
           counts and max |x|; the clip-length distribution with the
           longest and shortest clips; skipped and trimmed clips; the
           sources' size; value histograms from --rows rows per modality
           read evenly across its blob (the figures say how many)
  --clip   that clip's rows: per feature mean/std/min/max, NaN positions
  epochs   per epoch samples, shards and bytes, and its shuffle quality
           along the epoch (distinct clips per batch and same-clip
           neighbours, per tenth: a degraded tail shows), from the whole
           order if it fits --mem (24 bytes a sample), else from the
           start of each tenth (the figures say how many samples)
  --sample EPOCH:I  sample I of an epoch: its clip, start, valid frames and
           each modality's value statistics
--json prints the figures as JSON; --html FILE writes one self-contained
page (inline SVG, no scripts, no network) with the plots. FILE must not
exist, or be a page inspect wrote before (it is replaced); any other
file is refused, exit 2, and --force replaces only a regular file. A
path inside a dataset or an epochs folder is always refused.

Example:
  inspect /tmp/ds
  inspect --html /tmp/ds.html /tmp/ds

Flags:
`

const exitCodes = `
Exit status: 0 shown; 1 unreadable or damaged input (one line names the
file); 2 usage error, or DIR is not a dataset or epochs folder (as verify).
`

// Run runs the command as name ("clipshard inspect").
func Run(name string, args []string, stdout, stderr io.Writer) (code int) {
	defer ui.Recover(stderr, name, &code)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	jsonOut := fs.Bool("json", false, "print the figures as JSON")
	html := fs.String("html", "", "write a self-contained HTML page of plots to `FILE`: a new path, or a page inspect wrote before (anything else is refused)")
	force := fs.Bool("force", false, "with --html: replace FILE even if it is not a page inspect wrote (a regular file outside any dataset or epochs folder; never a device, FIFO, directory or symlink)")
	clip := fs.String("clip", "", "a dataset's clip `ID`: its rows' statistics")
	sample := fs.String("sample", "", "an epochs folder's sample `EPOCH:I`: its clip, window and values")
	fps := fs.Float64("fps", 25, "clip frames per second, for hours")
	rows := fs.Int("rows", 65536, "rows read per modality for the value histograms (evenly across the blob; fewer for rows so wide that they would hold more than 4M values)")
	batch := fs.Int("batch", 256, "batch size of the shuffle-quality figures")
	memFlag := fs.String("mem", "256MiB", "memory for an epoch's order (24 bytes a sample): a larger epoch is measured on a stretch of each tenth, a `SIZE` such as 1GiB")
	if done, code := ui.Parse(fs, args, stdout, stderr, ui.Named(usage, "inspect", name), ui.Named(exitCodes, "inspect", name), true); done {
		return code
	}
	if fs.NArg() != 1 || *rows < 1 || !(*fps > 0) || math.IsInf(*fps, 0) || *batch < 1 || (*jsonOut && *html != "") {
		fmt.Fprintf(stderr, "%s: want one DIR (and --rows >= 1, a finite --fps > 0, --batch >= 1, not both --json and --html; see --help)\n", name)
		return 2
	}
	mem, err := ui.ParseSize(*memFlag)
	if err != nil || mem < 1<<10 {
		fmt.Fprintf(stderr, "%s: --mem %q: want a size of at least 1KiB\n", name, *memFlag)
		return 2
	}
	dir := fs.Arg(0)
	if *force && *html == "" {
		return usageErr(stderr, name, "--force is for --html")
	}
	if *html != "" {
		if err := checkHTML(*html, *force); err != nil {
			return usageErr(stderr, name, "%s", err)
		}
	}
	open, shown := localOpen, dir
	var mirror *manifests.Mirror
	if bucket.IsURL(dir) {
		// A bucket folder (clipshard push): its manifests and headers
		// mirrored, its data read by bounded ranged GETs as it is sampled.
		u, err := bucket.Parse(dir)
		if err != nil {
			return usageErr(stderr, name, "%s", err)
		}
		c, err := bucket.New()
		if err != nil {
			ui.Fail(stderr, name, err)
			return 2
		}
		if mirror, err = manifests.MirrorBucket(context.Background(), c, u); err != nil {
			ui.Fail(stderr, name, err)
			return 1
		}
		defer mirror.Close()
		dir, open = mirror.Dir, bucketOpen(c, mirror)
	}
	var rep any
	switch {
	case exists(filepath.Join(dir, "dataset.json")):
		if *sample != "" {
			return usageErr(stderr, name, "--sample is for an epochs folder; %s is a dataset", shown)
		}
		rep, err = inspectDataset(dir, *clip, *fps, *rows, open)
		if r, ok := rep.(*DatasetReport); ok && r != nil {
			r.Dir = shown
		}
	case exists(filepath.Join(dir, "epochs.json")):
		if *clip != "" {
			return usageErr(stderr, name, "--clip is for a dataset; %s is an epochs folder", shown)
		}
		rep, err = inspectEpochs(dir, *sample, *batch, mem, open)
		if r, ok := rep.(*EpochsReport); ok && r != nil {
			r.Dir = shown
		}
	default:
		// As verify: a path that is not a clipshard folder is a usage error.
		if st, err := os.Stat(dir); err != nil {
			fmt.Fprintf(stderr, "%s: %s does not exist (or cannot be read: %v)\n", name, shown, errors.Unwrap(err))
		} else if !st.IsDir() {
			fmt.Fprintf(stderr, "%s: %s is not a directory: give a dataset or epochs folder\n", name, shown)
		} else {
			fmt.Fprintf(stderr, "%s: %s: neither a dataset (no dataset.json) nor an epochs folder (no epochs.json)\n", name, shown)
		}
		return 2
	}
	if err != nil && mirror != nil {
		err = errors.New(strings.ReplaceAll(err.Error(), mirror.Dir, shown)) // name the objects, not the mirror
	}
	if err != nil {
		var u usageError
		if errors.As(err, &u) {
			return usageErr(stderr, name, "%s", u.msg)
		}
		ui.Fail(stderr, name, err)
		return 1
	}
	switch {
	case *jsonOut:
		if err := ui.WriteJSON(stdout, rep); err != nil {
			ui.Fail(stderr, name, err)
			return 1
		}
	case *html != "":
		if err := writeHTML(*html, rep, *force); err != nil {
			if errors.Is(err, atomicfile.ErrRefused) {
				return usageErr(stderr, name, "%s", err)
			}
			ui.Fail(stderr, name, err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote %s\n", *html)
	default:
		w := &ui.ErrWriter{W: stdout}
		printText(ui.SafeWriter{W: w}, rep)
		if w.Err != nil {
			ui.Fail(stderr, name, fmt.Errorf("writing the output: %w", w.Err))
			return 1
		}
	}
	return 0
}

// opener opens a blob or shard file to read its rows: a file, or (a
// bucket folder) its object by bounded ranged GETs.
type opener func(path string) (readerAt, error)

type readerAt interface {
	io.ReaderAt
	io.Closer
}

func localOpen(p string) (readerAt, error) {
	f, _, err := regfile.Open(p)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// bucketOpen opens the data objects of a mirrored bucket folder by ranged
// GETs of the version mirrored (If-Match: a replaced object is an error),
// and its other files (the manifests, mirrored whole) as files.
func bucketOpen(c *bucket.Client, m *manifests.Mirror) opener {
	return func(p string) (readerAt, error) {
		rel, err := filepath.Rel(m.Dir, p)
		rel = filepath.ToSlash(rel)
		if err != nil || !m.Data[rel] {
			return localOpen(p)
		}
		return &objectReader{c: c, u: m.URL, rel: rel, obj: m.Objects[rel]}, nil
	}
}

type objectReader struct {
	c   *bucket.Client
	u   bucket.URL
	rel string
	obj bucket.Object
}

func (o *objectReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= o.obj.Size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), o.obj.Size-off)
	b, err := o.c.Range(context.Background(), o.u, o.rel, off, n, o.obj.ETag)
	copy(p, b)
	if err == nil && n < int64(len(p)) {
		err = io.EOF
	}
	return len(b), err
}

func (o *objectReader) Close() error { return nil }

type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usageErr(stderr io.Writer, name, format string, a ...any) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, fmt.Sprintf(format, a...))
	return 2
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// -- dataset --------------------------------------------------------------

// DatasetReport is what inspect shows of a dataset.
type DatasetReport struct {
	Kind       string           `json:"kind"` // "dataset"
	Dir        string           `json:"dir"`
	Clips      int64            `json:"clips"`
	Frames     int64            `json:"frames"`
	FPS        float64          `json:"fps"`
	Hours      float64          `json:"hours"`
	Modalities []ModalityReport `json:"modalities"`
	Lengths    Distribution     `json:"clip_lengths"` // in clip frames
	Longest    []ClipLength     `json:"longest"`
	Shortest   []ClipLength     `json:"shortest"`
	Skipped    []string         `json:"skipped"`
	Trimmed    int64            `json:"trimmed_frames"`
	SourceSize int64            `json:"source_bytes"`
	Histogram  []int64          `json:"length_histogram"` // clip counts over LengthEdges
	LengthEdge []float64        `json:"length_edges"`
	// LengthScale is "clipped" when some clips are more than 4 times the
	// 90th percentile (a huge clip among short ones): the last bin then
	// holds them (from the others' longest to the longest), the others
	// are binned over their own range.
	LengthScale string      `json:"length_scale"`
	Clip        *ClipReport `json:"clip,omitempty"`
}

// ModalityReport is one blob's figures.
type ModalityReport struct {
	Name       string          `json:"name"`
	DType      string          `json:"dtype"`
	FrameShape []int           `json:"frame_shape"`
	Rate       int             `json:"rate"`
	PerClip    bool            `json:"per_clip,omitempty"`
	Rows       int64           `json:"rows"`
	Bytes      int64           `json:"bytes"`
	Stats      manifests.Stats `json:"conversion"`
	Sampled    int64           `json:"sampled_rows"` // rows read for the histogram
	Values     Histogram       `json:"values"`
}

// Distribution is a five-number summary.
type Distribution struct {
	Min, Q1, Median, Q3, Max int64
	Mean                     float64
}

// ClipLength is a clip and its length in clip frames.
type ClipLength struct {
	Clip   string `json:"clip"`
	Row    int    `json:"row"`
	Frames int64  `json:"frames"`
}

// Histogram counts values in equal bins over [Lo, Hi]; NaN and Inf apart.
type Histogram struct {
	Lo, Hi float64
	Counts []int64
	NaN    int64
	Inf    int64
	Values int64
}

func inspectDataset(dir, clip string, fps float64, maxRows int, open opener) (*DatasetReport, error) {
	// The structure check of verify: manifests, index, ids and blob
	// headers agree (a damaged manifest is refused, naming the file and
	// what is wrong, before any figure is made of it).
	d, clipRows, err := manifests.Vouch(dir)
	if err != nil {
		return nil, err
	}
	starts, lengths := make([]int64, len(clipRows)), make([]int64, len(clipRows))
	for i, c := range clipRows {
		starts[i], lengths[i] = c.Start, c.Length
	}
	var ids []string
	if d.Files.IDs != "" {
		p, err := manifests.Join(dir, d.Files.IDs)
		if err != nil {
			return nil, err
		}
		if ids, err = readIDs(p); err != nil {
			return nil, err
		}
		if len(ids) != len(lengths) {
			return nil, fmt.Errorf("%s: %d ids, index.npy has %d clips", p, len(ids), len(lengths))
		}
	}
	id := func(i int) string {
		if ids == nil {
			return "#" + strconv.Itoa(i)
		}
		return ids[i]
	}
	r := &DatasetReport{Kind: "dataset", Dir: dir, Clips: d.Clips, Frames: d.Frames, FPS: fps,
		Hours: float64(d.Frames) / fps / 3600, Trimmed: d.Trimmed, Skipped: []string{}}
	for _, s := range d.Skipped {
		r.Skipped = append(r.Skipped, s.Clip+": "+s.Reason)
	}
	r.Lengths, r.Longest, r.Shortest = lengthFigures(lengths, id)
	r.LengthEdge, r.Histogram, r.LengthScale = lengthHistogram(lengths)
	// The sources' sizes, of every clip and modality.
	for _, c := range clipRows {
		for _, s := range c.Sources {
			r.SourceSize += max(0, s.Size)
		}
	}
	for _, m := range d.Modalities {
		mr := ModalityReport{Name: m.Name, DType: m.DType, FrameShape: m.FrameShape, Rate: m.Rate, PerClip: m.PerClip,
			Rows: m.Rows, Bytes: m.Size, Stats: d.Stats[m.Name]}
		blob, err := manifests.Join(dir, m.File)
		if err != nil {
			return nil, err
		}
		if mr.Sampled, mr.Values, err = sampleValues(blob, m, maxRows, open); err != nil {
			return nil, err
		}
		r.Modalities = append(r.Modalities, mr)
	}
	if clip != "" {
		i := slices.Index(ids, clip)
		if i < 0 {
			if n, err := strconv.Atoi(strings.TrimPrefix(clip, "#")); err == nil && strings.HasPrefix(clip, "#") && n >= 0 && n < len(lengths) {
				i = n
			} else {
				return nil, usageError{fmt.Sprintf("--clip %q: no such clip in %s (give an id of its clips.txt, or #ROW)", clip, dir)}
			}
		}
		if r.Clip, err = clipReport(dir, d, i, id(i), starts[i], lengths[i], open); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// maxIDs bounds a dataset's clips.txt (as every manifest: 256 MiB, about
// ten million ids).
const maxIDs = manifests.MaxManifest

// readIDs reads the clip ids a dataset lists one a line (convert's
// clips.txt), opened as a regular file only (a FIFO is named, not
// waited on) and bounded in size.
func readIDs(path string) ([]string, error) {
	b, err := regfile.ReadFile(path, maxIDs)
	if err != nil {
		return nil, err
	}
	ids := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(b) == 0 {
		ids = nil
	}
	return ids, nil
}

func lengthFigures(lengths []int64, id func(int) string) (Distribution, []ClipLength, []ClipLength) {
	if len(lengths) == 0 {
		return Distribution{}, nil, nil
	}
	order := make([]int, len(lengths))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lengths[order[a]] < lengths[order[b]] })
	q := func(f float64) int64 { return lengths[order[int(math.Round(f*float64(len(order)-1)))]] }
	var sum float64
	for _, l := range lengths {
		sum += float64(l)
	}
	dist := Distribution{Min: q(0), Q1: q(0.25), Median: q(0.5), Q3: q(0.75), Max: q(1), Mean: sum / float64(len(lengths))}
	k := min(5, len(order))
	var longest, shortest []ClipLength
	for j := 0; j < k; j++ {
		i := order[len(order)-1-j]
		longest = append(longest, ClipLength{id(i), i, lengths[i]})
		i = order[j]
		shortest = append(shortest, ClipLength{id(i), i, lengths[i]})
	}
	return dist, longest, shortest
}

// lengthHistogram bins the clip lengths into 20 bins of equal width over
// [shortest, longest], or (scale "clipped", when some clips are more than
// 4 times the 90th percentile: a huge clip among short ones) 19 bins over
// the others' range and a last one holding the long clips, up to the
// longest, so that the rest are not all in one bar.
func lengthHistogram(lengths []int64) ([]float64, []int64, string) {
	if len(lengths) == 0 {
		return nil, nil, "linear"
	}
	sorted := slices.Sorted(slices.Values(lengths))
	lo, hi := sorted[0], sorted[len(sorted)-1]
	q := sorted[(len(sorted)-1)*9/10]
	bulk := sorted[sort.Search(len(sorted), func(i int) bool { return sorted[i] > 4*q })-1]
	bins, scale := 20, "linear"
	if bulk < hi && bulk > lo {
		bins, scale = 19, "clipped"
	} else {
		bulk = hi
	}
	edges := make([]float64, bins+1)
	for i := range edges {
		edges[i] = float64(lo) + float64(bulk-lo)*float64(i)/float64(bins)
	}
	edges[bins] = float64(bulk)
	if scale == "clipped" {
		edges = append(edges, float64(hi))
	}
	counts := make([]int64, len(edges)-1)
	for _, l := range lengths {
		b := min(bins-1, sort.Search(bins, func(i int) bool { return float64(l) < edges[i+1] }))
		if l > bulk {
			b = bins // the long clips' bin
		}
		counts[b]++
	}
	return edges, counts, scale
}

// decoder returns a function reading value j of a row's bytes as float64.
func decoder(descr string) (func(b []byte, j int) float64, int, error) {
	dt, big, err := array.ParseDescr(descr)
	if err != nil {
		return nil, 0, err
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if big {
		bo = binary.BigEndian
	}
	size := dt.Size
	switch strings.TrimLeft(descr, "<>|=") {
	case "f2":
		return func(b []byte, j int) float64 { return float64(array.Float16ToFloat32(bo.Uint16(b[j*2:]))) }, size, nil
	case "f4":
		return func(b []byte, j int) float64 { return float64(math.Float32frombits(bo.Uint32(b[j*4:]))) }, size, nil
	case "f8":
		return func(b []byte, j int) float64 { return math.Float64frombits(bo.Uint64(b[j*8:])) }, size, nil
	case "i8":
		return func(b []byte, j int) float64 { return float64(int64(bo.Uint64(b[j*8:]))) }, size, nil
	case "i4":
		return func(b []byte, j int) float64 { return float64(int32(bo.Uint32(b[j*4:]))) }, size, nil
	case "i2":
		return func(b []byte, j int) float64 { return float64(int16(bo.Uint16(b[j*2:]))) }, size, nil
	case "u1", "b1":
		return func(b []byte, j int) float64 { return float64(b[j]) }, size, nil
	}
	return nil, 0, fmt.Errorf("dtype %s: not shown", descr)
}

// maxValues bounds the values a histogram holds (32 MiB of float64).
const maxValues = 4 << 20

// sampleValues reads up to maxRows rows of the blob, in 64 runs spread
// evenly over it, and histograms their values (two passes over what was
// read: range, then counts).
func sampleValues(blob string, m manifests.Modality, maxRows int, open opener) (int64, Histogram, error) {
	dec, size, err := decoder(m.DType)
	if err != nil {
		return 0, Histogram{}, fmt.Errorf("%s: %w", blob, err)
	}
	per := 1
	for _, x := range m.FrameShape {
		per *= x
	}
	rowBytes := int64(per * size)
	f, err := open(blob)
	if err != nil {
		return 0, Histogram{}, err
	}
	defer f.Close()
	var vals []float64
	var h Histogram
	// At most maxRows rows, and at most maxValues values (8 bytes each
	// held): a blob of very wide rows is sampled on fewer of them.
	take := min(int64(maxRows), m.Rows, max(1, maxValues/int64(max(1, per))))
	runs := min(int64(64), max(1, take))
	var read int64
	for k := int64(0); k < runs && rowBytes > 0; k++ {
		n := take / runs
		if k < take%runs {
			n++
		}
		first := m.Rows * k / runs
		n = min(n, m.Rows-first)
		if n <= 0 {
			continue
		}
		buf := make([]byte, n*rowBytes)
		if _, err := f.ReadAt(buf, m.DataOffset+first*rowBytes); err != nil {
			return 0, Histogram{}, fmt.Errorf("%s: rows %d..%d: %w", blob, first, first+n, err)
		}
		read += n
		for j := 0; j < int(n)*per; j++ {
			v := dec(buf, j)
			switch {
			case math.IsNaN(v):
				h.NaN++
			case math.IsInf(v, 0):
				h.Inf++
			default:
				vals = append(vals, v)
			}
		}
	}
	h.Values = int64(len(vals)) + h.NaN + h.Inf
	if len(vals) > 0 {
		h.Lo, h.Hi = slices.Min(vals), slices.Max(vals)
		h.Counts = make([]int64, 40)
		for _, v := range vals {
			b := len(h.Counts) - 1
			if h.Hi > h.Lo {
				b = min(b, int((v-h.Lo)/(h.Hi-h.Lo)*float64(len(h.Counts))))
			}
			h.Counts[b]++
		}
	}
	return read, h, nil
}

// ClipReport is one clip's rows per modality.
type ClipReport struct {
	Clip       string          `json:"clip"`
	Row        int             `json:"row"`
	Start      int64           `json:"start"`
	Frames     int64           `json:"frames"`
	Modalities []FeatureReport `json:"modalities"`
}

// FeatureReport is per-feature statistics of some rows of a modality.
type FeatureReport struct {
	Name string `json:"name"`
	Rows int64  `json:"rows"`
	// Mean and Std are of the finite values; Min and Max of the values
	// that are not NaN (an all-Inf feature's are ±Inf). A figure of no
	// values is NaN: null in JSON, like ±Inf (nan and inf count them).
	Mean []ui.Float `json:"mean"`
	Std  []ui.Float `json:"std"`
	Min  []ui.Float `json:"min"`
	Max  []ui.Float `json:"max"`
	// NaN counts and the first NaN positions as [row, feature].
	NaN      int64      `json:"nan"`
	NaNAt    [][2]int64 `json:"nan_at"`
	Infinite int64      `json:"inf"`
}

func clipReport(dir string, d *manifests.Dataset, i int, id string, start, length int64, open opener) (*ClipReport, error) {
	c := &ClipReport{Clip: id, Row: i, Start: start, Frames: length}
	for _, m := range d.Modalities {
		blob, err := manifests.Join(dir, m.File)
		if err != nil {
			return nil, err
		}
		first, n := m.ClipRows(i, start, length)
		fr, err := featureStats(blob, m.Name, m.DType, m.FrameShape, m.DataOffset, first, n, open)
		if err != nil {
			return nil, err
		}
		c.Modalities = append(c.Modalities, *fr)
	}
	return c, nil
}

// featureStats streams rows [first, first+n) of a .npy blob or shard in
// pieces of at most 8 MiB, with running per-feature figures.
func featureStats(path, name, descr string, frame []int, offset, first, n int64, open opener) (*FeatureReport, error) {
	dec, size, err := decoder(descr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	per := 1
	for _, x := range frame {
		per *= x
	}
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &FeatureReport{Name: name, Rows: n, Mean: make([]ui.Float, per), Std: make([]ui.Float, per), Min: make([]ui.Float, per),
		Max: make([]ui.Float, per), NaNAt: [][2]int64{}}
	mean, lo, hi := make([]float64, per), make([]float64, per), make([]float64, per)
	for j := range lo {
		lo[j], hi[j] = math.Inf(1), math.Inf(-1)
	}
	seen := make([]bool, per) // a value that is not NaN
	count := make([]float64, per)
	sq := make([]float64, per)
	rowBytes := int64(per * size)
	step := max(1, (8<<20)/max(1, rowBytes))
	for at := int64(0); at < n && rowBytes > 0; at += step {
		k := min(step, n-at)
		buf := make([]byte, k*rowBytes)
		if _, err := f.ReadAt(buf, offset+(first+at)*rowBytes); err != nil {
			return nil, fmt.Errorf("%s: rows %d..%d: %w", path, first+at, first+at+k, err)
		}
		for row := int64(0); row < k; row++ {
			for j := 0; j < per; j++ {
				v := dec(buf, int(row)*per+j)
				switch {
				case math.IsNaN(v):
					r.NaN++
					if len(r.NaNAt) < 20 {
						r.NaNAt = append(r.NaNAt, [2]int64{at + row, int64(j)})
					}
					continue
				case math.IsInf(v, 0):
					r.Infinite++
					seen[j] = true
					lo[j], hi[j] = min(lo[j], v), max(hi[j], v)
					continue
				}
				seen[j] = true
				count[j]++
				mean[j] += v
				sq[j] += v * v
				lo[j], hi[j] = min(lo[j], v), max(hi[j], v)
			}
		}
	}
	for j := range mean {
		r.Mean[j], r.Std[j], r.Min[j], r.Max[j] = ui.Float(math.NaN()), ui.Float(math.NaN()), ui.Float(math.NaN()), ui.Float(math.NaN())
		if seen[j] {
			r.Min[j], r.Max[j] = ui.Float(lo[j]), ui.Float(hi[j])
		}
		if count[j] == 0 {
			continue
		}
		m := mean[j] / count[j]
		r.Mean[j] = ui.Float(m)
		r.Std[j] = ui.Float(math.Sqrt(max(0, sq[j]/count[j]-m*m)))
	}
	return r, nil
}

// -- epochs ---------------------------------------------------------------

// EpochsReport is what inspect shows of an epochs folder.
type EpochsReport struct {
	Kind    string `json:"kind"` // "epochs"
	Dir     string `json:"dir"`
	Dataset string `json:"dataset,omitempty"`
	// Sources of a mixed folder (epochs format version 3).
	Sources []manifests.SourceRef `json:"sources,omitempty"`
	Seed    uint64                `json:"seed"`
	Window  int                   `json:"window"`
	Batch   int                   `json:"batch"`
	Epochs  []EpochReport         `json:"epochs"`
	Sample  *SampleReport         `json:"sample,omitempty"`
	Names   []string              `json:"modalities"`
	Shapes  map[string]any        `json:"sample_shapes"`
}

// EpochReport is one epoch's figures, and its shuffle quality per tenth.
type EpochReport struct {
	Epoch   int             `json:"epoch"`
	Samples int64           `json:"samples"`
	Shards  int             `json:"shards"`
	Bytes   int64           `json:"bytes"`
	Quality shuffle.Quality `json:"quality"`
	// Measured is how many samples the quality figures were measured on
	// (all of them, unless the epoch's order is larger than --mem).
	Measured int64             `json:"measured_samples"`
	Tenths   []shuffle.Quality `json:"quality_by_tenth"`
	// Mixed epochs: the samples and weight of each source (the shares per
	// batch are in Quality.Sources, and per tenth in Tenths).
	Counts  map[string]int64  `json:"source_counts,omitempty"`
	Weights map[string]string `json:"source_weights,omitempty"`
	// ShareByBatch (a mixed epoch): each source's share of the measured
	// whole batches, in order, each point over GroupBatches consecutive
	// batches (at most 100 points).
	ShareByBatch map[string][]float64 `json:"source_share_by_batch,omitempty"`
	GroupBatches int                  `json:"share_group_batches,omitempty"`
	// What a uniform shuffle of the measured samples would give: distinct
	// clips per batch, sum over clips of 1-(1-p)^batch, and the share of
	// same-clip neighbours, sum of p^2 (p: a clip's share of the samples).
	UniformDistinct   float64 `json:"distinct_clips_uniform"`
	UniformNeighbours float64 `json:"same_clip_neighbours_uniform"`
}

// SampleReport is one sample of an epoch.
type SampleReport struct {
	Epoch      int             `json:"epoch"`
	Index      int64           `json:"index"`
	Source     string          `json:"source,omitempty"` // a mixed folder's: the sample's source
	Clip       int64           `json:"clip_row"`
	ClipID     string          `json:"clip"`
	Start      int64           `json:"start"`
	Valid      int64           `json:"valid"`
	Shard      string          `json:"shard"`
	Modalities []FeatureReport `json:"modalities"`
}

func inspectEpochs(dir, sample string, batch int, mem int64, open opener) (*EpochsReport, error) {
	man, err := manifests.VouchEpochs(dir) // verify's structure check
	if err != nil {
		return nil, err
	}
	r := &EpochsReport{Kind: "epochs", Dir: dir, Dataset: man.Dataset.Dir, Sources: man.Sources, Seed: man.Seed, Window: man.Window, Batch: batch,
		Shapes: map[string]any{}}
	cols := man.SampleCols()
	names := man.SourceNames()
	for _, m := range man.Modalities {
		r.Names = append(r.Names, m.Name)
		r.Shapes[m.Name] = m.SampleShape()
	}
	for _, e := range man.Epochs {
		er := EpochReport{Epoch: e.Epoch, Samples: e.Samples, Shards: len(e.Shards)}
		var counts []int64
		if cols == 4 {
			er.Counts, er.Weights = e.Counts, map[string]string{}
			for _, n := range names {
				er.Weights[n] = string(e.Weights[n])
				counts = append(counts, e.Counts[n])
			}
		}
		shards := slices.Clone(e.Shards)
		sort.Slice(shards, func(a, b int) bool { return shards[a].Shard < shards[b].Shard })
		var held int64
		for _, s := range shards {
			for _, rel := range s.Files {
				p, err := manifests.Join(dir, rel)
				if err != nil {
					return nil, err
				}
				f, fi, err := regfile.Open(p)
				if err != nil {
					return nil, err
				}
				f.Close()
				er.Bytes += fi.Size()
			}
			held += int64(s.Samples)
		}
		if held != e.Samples {
			return nil, fmt.Errorf("%s: epoch %d: the shards hold %d samples, epochs.json says %d", dir, e.Epoch, held, e.Samples)
		}
		// Within --mem (24 bytes a sample, 32 mixed): the whole order, or, for a
		// larger epoch, a stretch of each tenth from its start (the
		// figures say how many samples they measured). A tenth is a
		// tenth of the whole batches (so its figures are over the batches
		// the epoch's are: the remainder is in the last).
		budget := max(int64(10*batch), mem/int64(8*cols))
		per := e.Samples
		if e.Samples > budget {
			per = budget / 10 / int64(batch) * int64(batch)
		}
		unit, units := int64(batch), e.Samples/int64(batch)
		if units < 10 {
			unit, units = 1, e.Samples // (fewer than 10 batches: tenths of the samples)
		}
		var order []manifests.Sample
		for t := int64(0); t < 10; t++ {
			lo, end := units*t/10*unit, units*(t+1)/10*unit
			if t == 9 {
				end = e.Samples
			}
			hi := min(end, lo+per)
			got, err := readRange(dir, man, shards, lo, hi, cols, len(names))
			if err != nil {
				return nil, err
			}
			q := shuffle.Measure(got, min(batch, max(1, len(got))))
			if cols == 4 {
				shuffle.MeasureSources(&q, got, min(batch, max(1, len(got))), names, scaled(counts, e.Samples, int64(len(got))), sourceOf)
			}
			er.Tenths = append(er.Tenths, q)
			order = append(order, got...)
		}
		er.Quality = shuffle.Measure(order, batch)
		if cols == 4 {
			shuffle.MeasureSources(&er.Quality, order, batch, names, scaled(counts, e.Samples, int64(len(order))), sourceOf)
		}
		er.Measured = int64(len(order))
		er.UniformDistinct, er.UniformNeighbours = uniform(order, batch)
		if cols == 4 {
			er.ShareByBatch, er.GroupBatches = shareByBatch(order, batch, names)
		}
		r.Epochs = append(r.Epochs, er)
	}
	if sample != "" {
		if r.Sample, err = sampleReport(dir, man, sample, open); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// uniform is what a uniform shuffle of these samples gives: the expected
// distinct clips in a batch of batch, and the share of same-clip
// neighbours.
func uniform(order []manifests.Sample, batch int) (distinct, neighbours float64) {
	if len(order) == 0 {
		return 0, 0
	}
	per := map[int64]int{}
	for _, smp := range order {
		per[smp.Clip]++
	}
	n := float64(len(order))
	for _, clip := range slices.Sorted(maps.Keys(per)) { // (in order: the same figures from a folder and its bucket)
		p := float64(per[clip]) / n
		distinct += 1 - math.Pow(1-p, float64(batch))
		neighbours += p * p
	}
	return distinct, neighbours
}

// shareByBatch is each source's share of the whole batches of order, in
// points over groups of consecutive batches (at most 100 points), and the
// batches a point is over.
func shareByBatch(order []manifests.Sample, batch int, names []string) (map[string][]float64, int) {
	nb := len(order) / batch
	if nb == 0 {
		return nil, 0
	}
	group := (nb + 99) / 100
	out := map[string][]float64{}
	for g := 0; g*group < nb; g++ {
		counts := make([]int, len(names))
		lo, hi := g*group*batch, min(nb, (g+1)*group)*batch
		for _, smp := range order[lo:hi] {
			if k := sourceOf(smp.Clip); k < len(names) {
				counts[k]++
			}
		}
		for k, n := range names {
			out[n] = append(out[n], float64(counts[k])/float64(hi-lo))
		}
	}
	return out, group
}

// sourceShift puts a mixed sample's source above its clip number in
// Sample.Clip (clips of different sources are different clips to the
// quality figures); sourceOf takes it back out.
const sourceShift = 40

func sourceOf(c int64) int { return int(c >> sourceShift) }

// scaled is the counts of an epoch of n samples, scaled to m of them (the
// shares a measured stretch is held to).
func scaled(counts []int64, n, m int64) []int64 {
	out := make([]int64, len(counts))
	for i, c := range counts {
		if n > 0 {
			out[i] = c * m / n
		}
	}
	return out
}

// readRange reads samples [lo, hi) of an epoch from its shards' samples
// files (of cols columns; a mixed folder's source, below sources, in
// Clip's bits from sourceShift up).
func readRange(dir string, man *manifests.Epochs, shards []manifests.ShardEntry, lo, hi int64, cols, sources int) ([]manifests.Sample, error) {
	var out []manifests.Sample
	for _, s := range shards {
		a, b := max(lo, s.First), min(hi, s.First+int64(s.Samples))
		if a >= b {
			continue
		}
		got, err := readSamples(dir, man, s, cols, sources)
		if err != nil {
			return nil, err
		}
		out = append(out, got[a-s.First:b-s.First]...)
	}
	return out, nil
}

// readSamples reads a shard's samples file (int64 [S, cols]).
func readSamples(dir string, man *manifests.Epochs, s manifests.ShardEntry, cols, sources int) ([]manifests.Sample, error) {
	p, err := manifests.Join(dir, s.Files["samples"])
	if err != nil {
		return nil, err
	}
	off, err := shardData(p, "<i8", []int{s.Samples, cols})
	if err != nil {
		return nil, err
	}
	f, _, err := regfile.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rec := 8 * cols
	buf := make([]byte, s.Samples*rec)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	out := make([]manifests.Sample, s.Samples)
	field := func(i, c int) int64 { return int64(binary.LittleEndian.Uint64(buf[i*rec+8*c:])) }
	if err := man.CheckSamples(s.Samples, field); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	for i := range out {
		out[i] = manifests.Sample{Clip: field(i, 0), Start: field(i, 1), Valid: field(i, 2)}
		if cols == 4 {
			src := field(i, 3)
			if src < 0 || src >= int64(sources) || out[i].Clip < 0 || out[i].Clip >= 1<<sourceShift {
				return nil, fmt.Errorf("%s: sample %d: clip %d of source %d; epochs.json lists %d sources", p, i, out[i].Clip, src, sources)
			}
			out[i].Clip |= src << sourceShift
		}
	}
	return out, nil
}

// shardData checks a shard file's .npy header against the manifest and
// returns where its data starts.
func shardData(p, descr string, shape []int) (int64, error) {
	f, fi, err := regfile.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	head := make([]byte, min(fi.Size(), 1<<16))
	if _, err := io.ReadFull(f, head); err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	h, err := npy.ParseHeader(head, fi.Size())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	if h.Descr != descr || h.Fortran || !slices.Equal(h.Shape, shape) {
		return 0, fmt.Errorf("%s: holds %s %v, epochs.json says %s %v", p, h.Descr, h.Shape, descr, shape)
	}
	if fi.Size() != h.DataOffset+h.DataSize {
		return 0, fmt.Errorf("%s: %d bytes, its header makes %d", p, fi.Size(), h.DataOffset+h.DataSize)
	}
	return h.DataOffset, nil
}

func sampleReport(dir string, man *manifests.Epochs, spec string, open opener) (*SampleReport, error) {
	es, is, ok := strings.Cut(spec, ":")
	e, err1 := strconv.Atoi(es)
	i, err2 := strconv.ParseInt(is, 10, 64)
	if !ok || err1 != nil || err2 != nil || i < 0 {
		return nil, usageError{fmt.Sprintf("--sample %q: want EPOCH:INDEX (e.g. 0:17)", spec)}
	}
	entry := man.Entry(e)
	if entry == nil {
		return nil, usageError{fmt.Sprintf("--sample %q: %s has no epoch %d", spec, dir, e)}
	}
	for _, s := range entry.Shards {
		if i < s.First || i >= s.First+int64(s.Samples) {
			continue
		}
		got, err := readSamples(dir, man, s, man.SampleCols(), len(man.Sources))
		if err != nil {
			return nil, err
		}
		k := i - s.First
		smp := got[k]
		dsDir := man.Dataset.Dir
		rep := &SampleReport{Epoch: e, Index: i, Clip: smp.Clip, Start: smp.Start, Valid: smp.Valid, Shard: s.Files["samples"]}
		if man.SampleCols() == 4 {
			src := man.Sources[sourceOf(smp.Clip)]
			rep.Clip &= 1<<sourceShift - 1
			rep.Source, dsDir = src.Name, src.Dir
		}
		if ids, err := readIDs(filepath.Join(dsDir, "clips.txt")); err == nil && rep.Clip >= 0 && rep.Clip < int64(len(ids)) {
			rep.ClipID = ids[rep.Clip]
		}
		for _, m := range man.Modalities {
			p, err := manifests.Join(dir, s.Files[m.Name])
			if err != nil {
				return nil, err
			}
			shape := append([]int{s.Samples}, m.SampleShape()...)
			off, err := shardData(p, m.DType, shape)
			if err != nil {
				return nil, err
			}
			frame := m.FrameShape
			rows := int64(m.WindowRows)
			first := k * rows
			if m.PerClip {
				rows, first = 1, k
			}
			fr, err := featureStats(p, m.Name, m.DType, frame, off, first, rows, open)
			if err != nil {
				return nil, err
			}
			rep.Modalities = append(rep.Modalities, *fr)
		}
		return rep, nil
	}
	return nil, usageError{fmt.Sprintf("--sample %q: epoch %d has %d samples", spec, e, entry.Samples)}
}
