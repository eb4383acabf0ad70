// Journal: the record of the clips written so far, which a resumed run
// takes over.

package convert

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/clipshard/clipshard/manifests"
)

// The journal is a JSON-lines file next to the staging directory: a header
// line with the fingerprint of the inputs, then one line per finished clip
// in clip-list order, written after the clip's bytes were appended to the
// blobs. A resumed run keeps the longest prefix of records whose bytes it
// can verify (by xxHash64) in the staged blobs.

type journalHeader struct {
	Journal     string `json:"journal"`
	Fingerprint string `json:"fingerprint"`
}

type journalRecord struct {
	Index   int          `json:"i"`
	Clip    string       `json:"clip"`
	Length  int64        `json:"len,omitempty"`
	Trimmed int64        `json:"trim,omitempty"`
	Skip    string       `json:"skip,omitempty"`
	Mods    []journalMod `json:"m,omitempty"`
	// Sources of a skipped clip (size -1: missing), for the no-op check.
	SkipSources []manifests.SourceStamp `json:"ss,omitempty"`
}

type journalMod struct {
	XXH64       string    `json:"x"` // hex: JSON numbers lose uint64 bits
	Path        string    `json:"p"`
	Size        int64     `json:"s"`
	MtimeNS     int64     `json:"t"`
	CtimeNS     int64     `json:"c"`
	Ino         uint64    `json:"n"`
	Rows        int64     `json:"r"`
	DType       string    `json:"d"`
	SourceDescr string    `json:"sd"`
	FrameShape  []int     `json:"fs"`
	Stats       [5]string `json:"st"` // nan, inf, overflow, underflow, max_abs (exact text)
	// Label is a pickle key's label (convert --label NAME=T.pkl:KEY), for
	// a resumed run to give the labels their codes in the same order.
	Label string `json:"l,omitempty"`
}

const journalMagic = "clipshard.convert.journal/1"

func encodeStats(s manifests.Stats) [5]string {
	return [5]string{
		strconv.FormatInt(s.NaN, 10), strconv.FormatInt(s.InfIn, 10),
		strconv.FormatInt(s.Overflow, 10), strconv.FormatInt(s.Underflow, 10),
		strconv.FormatFloat(s.MaxAbs, 'g', -1, 64),
	}
}

func decodeStats(v [5]string) (manifests.Stats, error) {
	var s manifests.Stats
	var err error
	ints := []*int64{&s.NaN, &s.InfIn, &s.Overflow, &s.Underflow}
	for i, p := range ints {
		if *p, err = strconv.ParseInt(v[i], 10, 64); err != nil {
			return s, err
		}
	}
	s.MaxAbs, err = strconv.ParseFloat(v[4], 64)
	return s, err
}

// readJournal reads a journal file. It returns the fingerprint and the
// records up to the first line that does not parse (a torn last write).
func readJournal(path string) (string, []journalRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var hdr journalHeader
	line, err := r.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &hdr) != nil || hdr.Journal != journalMagic {
		return "", nil, fmt.Errorf("convert: %s: not a journal", path)
	}
	var recs []journalRecord
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF || (err == nil && len(bytes.TrimSpace(line)) == 0) {
			break
		}
		if err != nil {
			return "", nil, err
		}
		var rec journalRecord
		if json.Unmarshal(line, &rec) != nil || rec.Index != len(recs) {
			break
		}
		recs = append(recs, rec)
	}
	return hdr.Fingerprint, recs, nil
}

// journal appends records to a journal file, buffered: a record reaches
// the file only once the bytes it describes are in the blobs (flush, or
// flushPrefix for the records of an earlier checkpoint).
type journal struct {
	f       *os.File
	pending []byte // encoded records not yet written
	buf     []byte // for records encoded here
}

func createJournal(f *os.File, fingerprint string) (*journal, error) {
	if err := f.Truncate(0); err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	j := &journal{f: f}
	if err := j.write(journalHeader{Journal: journalMagic, Fingerprint: fingerprint}); err != nil {
		return nil, err
	}
	return j, j.flush()
}

// truncateJournal keeps the header and the first n records of f.
func truncateJournal(f *os.File, fingerprint string, recs []journalRecord) (*journal, error) {
	j, err := createJournal(f, fingerprint)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if err := j.write(r); err != nil {
			return nil, err
		}
	}
	return j, j.flush()
}

func (j *journal) write(v any) error {
	var b []byte
	if r, ok := v.(journalRecord); ok && r.Skip == "" && len(r.SkipSources) == 0 {
		// The record of every converted clip: encoded by hand, a fifth of
		// encoding/json's time on sets of thousands of small clips.
		b = appendRecord(j.buf[:0], &r)
		j.buf = b
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			return err
		}
	}
	return j.writeRaw(b)
}

// writeRaw appends an encoded record (see appendRecord) and its newline.
func (j *journal) writeRaw(b []byte) error {
	j.pending = append(append(j.pending, b...), '\n')
	return nil
}

// size returns the bytes of records not yet written.
func (j *journal) size() int { return len(j.pending) }

// flushPrefix writes the first n bytes of the pending records.
func (j *journal) flushPrefix(n int) error {
	if n == 0 {
		return nil
	}
	_, err := j.f.Write(j.pending[:n])
	j.pending = j.pending[:copy(j.pending, j.pending[n:])]
	return err
}

func (j *journal) flush() error { return j.flushPrefix(len(j.pending)) }

// appendRecord appends the JSON of a converted clip's record, as
// json.Marshal would write it (TestAppendRecord compares them).
func appendRecord(b []byte, r *journalRecord) []byte {
	b = append(b, `{"i":`...)
	b = strconv.AppendInt(b, int64(r.Index), 10)
	b = append(b, `,"clip":`...)
	b = appendJSONString(b, r.Clip)
	if r.Length != 0 {
		b = append(b, `,"len":`...)
		b = strconv.AppendInt(b, r.Length, 10)
	}
	if r.Trimmed != 0 {
		b = append(b, `,"trim":`...)
		b = strconv.AppendInt(b, r.Trimmed, 10)
	}
	if len(r.Mods) > 0 {
		b = append(b, `,"m":[`...)
		for i, m := range r.Mods {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"x":`...)
			b = appendJSONString(b, m.XXH64)
			b = append(b, `,"p":`...)
			b = appendJSONString(b, m.Path)
			b = append(b, `,"s":`...)
			b = strconv.AppendInt(b, m.Size, 10)
			b = append(b, `,"t":`...)
			b = strconv.AppendInt(b, m.MtimeNS, 10)
			b = append(b, `,"c":`...)
			b = strconv.AppendInt(b, m.CtimeNS, 10)
			b = append(b, `,"n":`...)
			b = strconv.AppendUint(b, m.Ino, 10)
			b = append(b, `,"r":`...)
			b = strconv.AppendInt(b, m.Rows, 10)
			b = append(b, `,"d":`...)
			b = appendJSONString(b, m.DType)
			b = append(b, `,"sd":`...)
			b = appendJSONString(b, m.SourceDescr)
			b = append(b, `,"fs":`...)
			if m.FrameShape == nil {
				b = append(b, "null"...)
			} else {
				b = append(b, '[')
				for k, d := range m.FrameShape {
					if k > 0 {
						b = append(b, ',')
					}
					b = strconv.AppendInt(b, int64(d), 10)
				}
				b = append(b, ']')
			}
			b = append(b, `,"st":[`...)
			for k, v := range m.Stats {
				if k > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, v)
			}
			b = append(b, ']')
			if m.Label != "" {
				b = append(b, `,"l":`...)
				b = appendJSONString(b, m.Label)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string: plain ASCII directly,
// anything else through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
