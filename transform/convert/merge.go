// Merge: the parts of a partitioned convert (--part) joined into one
// dataset, blobs copied in order.

package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/manifests"
)

// MergeOptions configure Merge.
type MergeOptions struct {
	Parts   []string // part dataset directories (convert --part), any order
	Out     string
	Workers int
	Now     func() time.Time
	Tool    string
	// Progress, if set, is called with bytes copied so far.
	Progress func(Progress)
	// Segments merges by reference (format 2): each part's blobs become a
	// segment of the merged dataset, hard-linked (copied only where the
	// parts are on another filesystem), and only manifests are written.
	Segments bool
}

// Merge concatenates the datasets of a partitioned convert, in part order,
// into one dataset whose bytes equal those of a single-process convert of
// the whole clip list (the "created" field aside). Every part is verified
// first (structure and sha256); parts of different jobs, missing or
// repeated parts, and mismatched modalities are refused. Blobs are copied
// with copy_file_range where the filesystem offers it (a reflink on
// XFS/btrfs) and hashed from the parts as they are copied, in bounded
// memory. The result replaces Out atomically, like Run.
func Merge(ctx context.Context, o MergeOptions) (*Result, error) {
	began := time.Now()
	if len(o.Parts) == 0 || o.Out == "" {
		return nil, fmt.Errorf("%w: --merge needs part directories and --out", ErrUsage)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	parts := make([]*manifests.Dataset, len(o.Parts))
	dirs := slices.Clone(o.Parts)
	for i, p := range dirs {
		d, err := manifests.LoadDataset(p)
		if err != nil {
			return nil, fmt.Errorf("%w: part %s: %w", ErrInput, p, err)
		}
		if d.Part == nil {
			return nil, fmt.Errorf("%w: %s is not a part (convert --part); nothing to merge", ErrInput, p)
		}
		parts[i] = d
	}
	idx := make([]int, len(parts))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return parts[idx[a]].Part.Index < parts[idx[b]].Part.Index })
	sortedParts := make([]*manifests.Dataset, len(parts))
	sortedDirs := make([]string, len(parts))
	for k, i := range idx {
		sortedParts[k], sortedDirs[k] = parts[i], dirs[i]
	}
	parts, dirs = sortedParts, sortedDirs
	if err := checkParts(parts, dirs); err != nil {
		return nil, err
	}
	for i, p := range dirs {
		r, err := manifests.VerifyDataset(p, manifests.VerifyOptions{Workers: o.Workers})
		if err != nil {
			return nil, fmt.Errorf("%w: part %s: %w", ErrInput, p, err)
		}
		if !r.OK() {
			return nil, fmt.Errorf("%w: part %d (%s) is not intact: %s (run verify on it)", ErrInput, parts[i].Part.Index, p, r.Problems[0])
		}
	}
	if _, err := checkOut(out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, err
	}
	j := &job{opts: Options{Out: out}}
	j.stageBeside(out)
	jf, err := j.lockJournal()
	if err != nil {
		return nil, err
	}
	defer jf.Close()
	defer os.Remove(j.journalPath)
	if err := removeStaging(j.staging); err != nil {
		return nil, err
	}
	if err := os.Mkdir(j.staging, 0o755); err != nil {
		return nil, err
	}

	first := parts[0]
	d := &manifests.Dataset{
		Format: manifests.DatasetFormat, Version: 1, Align: first.Align, Stats: map[string]manifests.Stats{},
		Created: o.Now().UTC().Format(time.RFC3339), Tool: o.Tool, Fingerprint: first.Part.Job,
		Files: manifests.Files{Clips: manifests.ClipsFile, Index: manifests.IndexFile, Sums: manifests.SumsFile},
	}
	names := make([]string, len(first.Modalities))
	for k, m := range first.Modalities {
		names[k] = m.Name
	}
	var rows []manifests.ClipRow
	for i, p := range parts {
		d.Clips += p.Clips
		d.Trimmed += p.Trimmed
		d.Skipped = append(d.Skipped, p.Skipped...)
		pr, err := manifests.ReadClips(filepath.Join(dirs[i], p.Files.Clips), names)
		if err != nil {
			return nil, err
		}
		for _, r := range pr {
			r.Start += d.Frames
			rows = append(rows, r)
		}
		d.Frames += p.Frames
	}
	if len(d.Skipped) == 0 {
		d.Skipped = nil
	}
	res := &Result{Dir: out}
	if o.Segments {
		if err := mergeByReference(ctx, j, d, names, rows, parts, dirs, o, res); err != nil {
			return nil, err
		}
		res.Dataset = d
		res.Converted = int(d.Clips)
		res.Elapsed = time.Since(began)
		return res, nil
	}
	known := map[string]string{}
	for k, m := range first.Modalities {
		mm := m
		mm.Rows, mm.Size, mm.SHA256 = 0, npy.DataAlign, ""
		var descrs []string
		st := manifests.Stats{}
		for _, p := range parts {
			pm := p.Modalities[k]
			mm.Rows += pm.Rows
			mm.Size += pm.Rows * rowBytes(pm)
			descrs = addDescrs(descrs, pm.SourceDType)
			addStats(&st, p.Stats[m.Name])
		}
		mm.SourceDType = strings.Join(descrs, ",")
		d.Stats[m.Name] = st
		sum, n, err := mergeBlob(ctx, filepath.Join(j.staging, mm.File), mm, parts, dirs, k, func(done int64) {
			if o.Progress != nil {
				o.Progress(Progress{Phase: "merge", BytesOut: res.BytesOut + done})
			}
		})
		if err != nil {
			return nil, err
		}
		res.BytesOut += n
		res.BytesIn += n // the parts' rows, read once each
		known[mm.File] = sum
		d.Modalities = append(d.Modalities, mm)
	}
	if len(d.Skipped) == 0 {
		d.Skipped = nil
	}
	if err := writeManifests(j.staging, d, names, rows, func() (map[string]string, error) { return known, nil }, o.Workers); err != nil {
		return nil, err
	}
	if err := j.commit(d); err != nil {
		return nil, err
	}
	res.Dataset = d
	res.Converted = int(d.Clips)
	res.Elapsed = time.Since(began)
	return res, nil
}

func rowBytes(m manifests.Modality) int64 {
	dt, _, err := array.ParseDescr(m.DType)
	if err != nil {
		return 0
	}
	n, _ := array.ByteSize(m.FrameShape, dt.Size)
	return n
}

// checkParts refuses parts that do not make exactly one job.
func checkParts(parts []*manifests.Dataset, dirs []string) error {
	first := parts[0].Part
	if len(parts) != first.Count {
		return fmt.Errorf("%w: %d parts given, the job has %d", ErrInput, len(parts), first.Count)
	}
	next := 0
	for i, p := range parts {
		pp := p.Part
		switch {
		case pp.Job != first.Job || pp.Count != first.Count || pp.TotalClips != first.TotalClips:
			return fmt.Errorf("%w: %s is part of another job (clip list, templates or flags differ from %s)", ErrInput, dirs[i], dirs[0])
		case pp.Index != i:
			if i > 0 && pp.Index == parts[i-1].Part.Index {
				return fmt.Errorf("%w: part %d given twice (%s and %s)", ErrInput, pp.Index, dirs[i-1], dirs[i])
			}
			return fmt.Errorf("%w: part %d of %d is missing", ErrInput, i, first.Count)
		case pp.FirstClip != next:
			return fmt.Errorf("%w: %s starts at clip %d, want %d (overlapping or missing clip ranges)", ErrInput, dirs[i], pp.FirstClip, next)
		case p.Align != parts[0].Align || len(p.Modalities) != len(parts[0].Modalities):
			return fmt.Errorf("%w: %s has other modalities or alignment than %s", ErrInput, dirs[i], dirs[0])
		}
		for k, m := range p.Modalities {
			m0 := parts[0].Modalities[k]
			if m.Name != m0.Name || m.DType != m0.DType || !slices.Equal(m.FrameShape, m0.FrameShape) || m.Rate != m0.Rate || m.PerClip != m0.PerClip ||
				m.Template != m0.Template || m.Keys != m0.Keys || m.DataOffset != npy.DataAlign || m.LabelColumn != m0.LabelColumn || !slices.Equal(m.Labels, m0.Labels) {
				return fmt.Errorf("%w: %s: modality %q (%s %v rate %d) does not match %s (%s %v rate %d)",
					ErrInput, dirs[i], m.Name, m.DType, m.FrameShape, m.Rate, dirs[0], m0.DType, m0.FrameShape, m0.Rate)
			}
		}
		next += pp.ListClips
	}
	if next != first.TotalClips {
		return fmt.Errorf("%w: the parts cover %d of %d clips", ErrInput, next, first.TotalClips)
	}
	return nil
}

// mergeBlob writes the concatenation of the parts' k-th blob to path and
// returns its sha256 and size. The header is known up front (the total of
// rows), so the file is hashed as it is assembled, from the parts' bytes.
func mergeBlob(ctx context.Context, path string, m manifests.Modality, parts []*manifests.Dataset, dirs []string, k int, progress func(int64)) (string, int64, error) {
	dt, _, err := array.ParseDescr(m.DType)
	if err != nil {
		return "", 0, err
	}
	hdr, err := npy.EncodeHeader(dt.Descr(), false, append([]int{int(m.Rows)}, m.FrameShape...), npy.DataAlign)
	if err != nil {
		return "", 0, err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	h.Write(hdr)
	if _, err := f.Write(hdr); err != nil {
		return "", 0, err
	}
	off := int64(len(hdr))
	buf := make([]byte, 4<<20)
	for i, p := range parts {
		pm := p.Modalities[k]
		src, err := os.Open(filepath.Join(dirs[i], pm.File))
		if err != nil {
			return "", 0, err
		}
		n := pm.Rows * rowBytes(pm)
		err = copyHashed(f, off, src, pm.DataOffset, n, h, buf, func(c int64) { progress(off - int64(len(hdr)) + c) })
		src.Close()
		if err != nil {
			return "", 0, fmt.Errorf("merging %s: %w", filepath.Join(dirs[i], pm.File), err)
		}
		off += n
		if ctx.Err() != nil {
			return "", 0, ctx.Err()
		}
	}
	return hex.EncodeToString(h.Sum(nil)), off, nil
}

// copyHashed copies n bytes of src at srcOff to dst at dstOff and hashes
// them. The copy uses copy_file_range (in-kernel, a reflink where the
// filesystem can) with the hash read from the source; without it, a
// buffered read/write copy.
func copyHashed(dst *os.File, dstOff int64, src *os.File, srcOff, n int64, h hash.Hash, buf []byte, progress func(int64)) error {
	useCFR := true
	for done := int64(0); done < n; {
		chunk := min(int64(len(buf)), n-done)
		b := buf[:chunk]
		if _, err := src.ReadAt(b, srcOff+done); err != nil && !(errors.Is(err, io.EOF) && int64(len(b)) == chunk) {
			return err
		}
		h.Write(b)
		wrote := false
		if useCFR {
			ro, wo := srcOff+done, dstOff+done
			left := chunk
			for left > 0 {
				c, err := unix.CopyFileRange(int(src.Fd()), &ro, int(dst.Fd()), &wo, int(left), 0)
				if err != nil || c == 0 {
					useCFR = false
					break
				}
				left -= int64(c)
			}
			wrote = left == 0
		}
		if !wrote {
			if _, err := dst.WriteAt(b, dstOff+done); err != nil {
				return err
			}
		}
		done += chunk
		progress(done)
	}
	return nil
}

// mergeByReference writes the merged dataset d (its clip rows, rows) into
// j's staging folder as version 1 of format 2: part i's blobs are segment
// i, hard-linked from the part (copied where the link is refused: another
// filesystem), and where.npy points each clip at its part's rows; then
// commits it as Merge does. The parts were verified (their bytes' sha256)
// before.
func mergeByReference(ctx context.Context, j *job, d *manifests.Dataset, names []string, rows []manifests.ClipRow, parts []*manifests.Dataset, dirs []string, o MergeOptions, res *Result) error {
	first := parts[0]
	d.Version, d.DatasetVersion = 2, 1
	where := manifests.NewWhere(len(rows), len(names))
	for k, m := range first.Modalities {
		mm := m
		mm.File, mm.DataOffset, mm.Size, mm.SHA256, mm.Rows = "", 0, 0, "", 0
		mm.Blobs = []manifests.Blob{}
		var descrs []string
		st := manifests.Stats{}
		for _, p := range parts {
			pm := p.Modalities[k]
			mm.Rows += pm.Rows
			descrs = addDescrs(descrs, pm.SourceDType)
			addStats(&st, p.Stats[m.Name])
		}
		mm.SourceDType = strings.Join(descrs, ",")
		d.Stats[m.Name] = st
		d.Modalities = append(d.Modalities, mm)
	}
	clip := 0
	for i, p := range parts {
		blobs := map[string]string{}
		for _, pm := range p.Modalities {
			blobs[pm.Name+".npy"] = pm.SHA256
		}
		seg := manifests.SegmentID(blobs)
		sdir := filepath.Join(j.staging, manifests.SegmentsDir, seg)
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return err
		}
		for k, pm := range p.Modalities {
			if err := ctx.Err(); err != nil {
				return err
			}
			src, dst := filepath.Join(dirs[i], pm.File), filepath.Join(sdir, pm.Name+".npy")
			linked, err := linkOrCopy(src, dst)
			if err != nil {
				return fmt.Errorf("merging %s: %w", src, err)
			}
			if !linked {
				res.BytesOut += pm.Size
			}
			d.Modalities[k].Blobs = append(d.Modalities[k].Blobs, manifests.Blob{File: filepath.ToSlash(filepath.Join(manifests.SegmentsDir, seg, pm.Name+".npy")),
				Rows: pm.Rows, DataOffset: pm.DataOffset, Size: pm.Size, SHA256: pm.SHA256})
		}
		for c := int64(0); c < p.Clips; c++ {
			r := rows[clip]
			for k := range p.Modalities {
				pk := &p.Modalities[k]
				first, _ := pk.ClipRows(int(c), r.Start-rowsBefore(rows, clip, c), r.Length)
				where.Set(clip, k, i, first)
			}
			clip++
		}
		if err := atomicfile.Sync(sdir); err != nil {
			return err
		}
	}
	vdir := filepath.Join(j.staging, filepath.FromSlash(manifests.VersionDir(1)))
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	if err := writeSmallManifests(vdir, d, rows, names); err != nil {
		return err
	}
	if err := manifests.WriteWhere(filepath.Join(vdir, manifests.WhereFile), where); err != nil {
		return err
	}
	v := manifests.VersionDir(1)
	d.Files = manifests.Files{Clips: v + "/" + manifests.ClipsFile, Index: v + "/" + manifests.IndexFile, Sums: v + "/" + manifests.SumsFile,
		IDs: v + "/" + manifests.IDsFile, Where: v + "/" + manifests.WhereFile}
	small := []string{manifests.IndexFile, manifests.ClipsFile, manifests.IDsFile, manifests.WhereFile}
	if len(d.Skipped) > 0 {
		d.Files.Skipped = v + "/" + manifests.SkippedFile
		small = append(small, manifests.SkippedFile)
	}
	hs, err := hashAndSync(vdir, small, nil, o.Workers)
	if err != nil {
		return err
	}
	sums := map[string]string{}
	for n, h := range hs {
		sums[v+"/"+n] = h
	}
	for _, m := range d.Modalities {
		for _, b := range m.Blobs {
			sums[b.File] = b.SHA256
		}
	}
	js, err := manifests.MarshalJSON(d)
	if err != nil {
		return err
	}
	h := sha256.Sum256(js)
	sums[manifests.VersionFile(1)] = hex.EncodeToString(h[:])
	if err := manifests.WriteSums(filepath.Join(vdir, manifests.SumsFile), sums); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(vdir, manifests.DatasetFile), js); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(j.staging, manifests.DatasetFile), js); err != nil {
		return err
	}
	for _, dir := range []string{vdir, filepath.Dir(vdir), j.staging} {
		if err := atomicfile.Sync(dir); err != nil {
			return err
		}
	}
	return j.commit(d)
}

// rowsBefore returns the frames of the merged clips before clip (the
// c-th of its part): the part's first clip's merged start.
func rowsBefore(rows []manifests.ClipRow, clip int, c int64) int64 {
	return rows[clip-int(c)].Start
}

// linkOrCopy makes dst the file src: a hard link (no byte written), or,
// where the filesystem refuses one (the parts on another one), a copy,
// synced. It reports whether it linked.
func linkOrCopy(src, dst string) (bool, error) {
	if err := os.Link(src, dst); err == nil {
		return true, nil
	} else if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EMLINK) {
		return false, err
	}
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return false, err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return false, err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return false, err
	}
	return false, out.Close()
}

// addStats adds a part's stats of a modality to st.
func addStats(st *manifests.Stats, ps manifests.Stats) {
	st.NaN += ps.NaN
	st.InfIn += ps.InfIn
	st.Overflow += ps.Overflow
	st.Underflow += ps.Underflow
	st.MaxAbs = max(st.MaxAbs, ps.MaxAbs)
}

// addDescrs adds the source dtypes of a part's source_dtype (comma-
// separated) not in descrs yet, in order.
func addDescrs(descrs []string, sourceDType string) []string {
	for _, s := range strings.Split(sourceDType, ",") {
		if s != "" && !slices.Contains(descrs, s) {
			descrs = append(descrs, s)
		}
	}
	return descrs
}
