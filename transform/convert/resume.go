// Resume: the staging directory of an earlier run of the same inputs is
// taken over clip by clip, as far as its journal's records verify against
// the staged blobs and the sources are unchanged.

package convert

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/blob"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/manifests"
)

// prepare sets up the staging directory: it resumes from a journal of the
// same inputs, keeping every clip whose bytes verify, or starts afresh.
func (j *job) prepare(jf *os.File) (*writer, error) {
	w := &writer{job: j, mods: make([]*modState, len(j.opts.Modalities))}
	for k := range w.mods {
		w.mods[k] = &modState{}
	}
	var recs []journalRecord
	if !j.opts.Force && !j.segmented { // (a segmented run starts over: it writes only the change)
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
		if m.w, err = blob.OpenMem(j.blobPath(k), m.dtype, m.frameShape, m.rows, j.blobMem); err != nil {
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
			if m.Path == "" {
				continue // a label: no file (the journal's fingerprint covers the labels)
			}
			if st := (manifests.SourceStamp{Path: m.Path, Size: m.Size, MtimeNS: m.MtimeNS, CtimeNS: m.CtimeNS, Ino: m.Ino}); st.Racy() || manifests.Stamp(m.Path) != st {
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
		if m.Label != "" {
			// A pickle key's label: its code again, in the same order
			// (the journal's records are verified against the blobs).
			if k >= len(w.job.codeOf) || w.job.codeOf[k] == nil {
				return fmt.Errorf("convert: the journal %s gives clip %q a label where this run has none (run convert --clean --out DIR, then again)", w.job.journalPath, r.Clip)
			}
			code, err := w.job.labelCode(k, m.Label)
			if err != nil {
				return err
			}
			var mo modOut
			fillLabel(&mo, code)
			if mo.xxh != x {
				return fmt.Errorf("convert: resuming clip %q: label %q has code %d now, another when it was journaled in %s (run convert --clean --out DIR, then again)", r.Clip, m.Label, code, w.job.journalPath)
			}
		}
		st.rows += m.Rows
		if !slices.Contains(st.descrs, m.SourceDescr) {
			st.descrs = append(st.descrs, m.SourceDescr)
		}
		s, err := decodeStats(m.Stats)
		if err != nil {
			return err
		}
		st.stats.Add(f16.Stats(s))
		row.Sources[k] = manifests.ClipSource{XXH64: x, Path: m.Path, Size: m.Size, MtimeNS: m.MtimeNS, CtimeNS: m.CtimeNS, Ino: m.Ino, Stamped: m.Path != "",
			Audited: true, Descr: m.SourceDescr, Stats: s}
	}
	w.rows = append(w.rows, row)
	w.frames += r.Length
	w.trimmed += r.Trimmed
	w.next++
	return nil
}
