// Clip lists: the --clips file (text, CSV or Parquet) read and checked.

package manifests

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"

	"github.com/clipshard/clipshard/internal/textsafe"
)

// ErrClipList marks a clip list that cannot be used; ErrUnsafeID, also
// wrapped, one with an id holding what a terminal would act on.
var (
	ErrClipList = errors.New("manifests: bad clip list")
	ErrUnsafeID = errors.New("an unsafe clip id")
)

// ReadClipList reads the clip ids of a clip list, in order: a .csv or
// .parquet file with a "clip" column, or text with one id per line (blank
// lines and lines starting with # are ignored, surrounding space trimmed).
// Duplicate or empty ids are an error naming the line (or row).
func ReadClipList(path string) ([]string, error) { return ReadClipListChecked(path, nil) }

// ReadClipListChecked is ReadClipList that also refuses an id for which
// check (if not nil) returns an error, naming the line (or row).
func ReadClipListChecked(path string, check func(id string) error) ([]string, error) {
	var ids []string
	var where []string
	var err error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".csv":
		ids, err = readCSVClips(path)
	case ".parquet":
		ids, err = readParquetClips(path)
	default:
		ids, where, err = readTextClips(path)
	}
	if err != nil {
		return nil, err
	}
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		loc := fmt.Sprintf("row %d", i+1)
		if where != nil {
			loc = where[i]
		}
		if id == "" {
			return nil, fmt.Errorf("%w: %s: %s: empty clip id", ErrClipList, path, loc)
		}
		if r, at, bad := textsafe.First(id); bad {
			return nil, fmt.Errorf("%w: %s: %s: clip id %q holds %U at byte %d: a control character (tab, newline, NUL, ESC...), a bidi control or a byte that is not UTF-8, which ids may not hold (%w)", ErrClipList, path, loc, id, r, at, ErrUnsafeID)
		}
		if check != nil {
			if err := check(id); err != nil {
				return nil, fmt.Errorf("%w: %s: %s: clip id %q: %w", ErrClipList, path, loc, id, err)
			}
		}
		if j, dup := seen[id]; dup {
			prev := fmt.Sprintf("row %d", j+1)
			if where != nil {
				prev = where[j]
			}
			return nil, fmt.Errorf("%w: %s: %s: duplicate clip id %q (first at %s)", ErrClipList, path, loc, id, prev)
		}
		seen[id] = i
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: %s: no clip ids", ErrClipList, path)
	}
	return ids, nil
}

// InsideRoot returns an error for a clip id that, put into a template,
// could name a file outside the root folder: an absolute id, or one with
// a ".." component.
func InsideRoot(id string) error {
	if strings.HasPrefix(id, "/") || filepath.IsAbs(id) {
		return errors.New("is an absolute path: ids are joined to --root (--allow-outside-root accepts it)")
	}
	for _, part := range strings.Split(id, "/") {
		if part == ".." {
			return errors.New(`has a ".." component, which leads outside --root (--allow-outside-root accepts it)`)
		}
	}
	return nil
}

func readTextClips(path string) (ids, where []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		ids = append(ids, s)
		where = append(where, fmt.Sprintf("line %d", line))
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
	}
	return ids, where, nil
}

func readCSVClips(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
	}
	col := -1
	for i, h := range header {
		if strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")) == "clip" {
			col = i
		}
	}
	if col < 0 {
		return nil, fmt.Errorf("%w: %s: no \"clip\" column in header %q", ErrClipList, path, header)
	}
	var ids []string
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
		}
		if col >= len(rec) {
			line, _ := r.FieldPos(0)
			return nil, fmt.Errorf("%w: %s: line %d has no clip field", ErrClipList, path, line)
		}
		ids = append(ids, strings.TrimSpace(rec[col]))
	}
	return ids, nil
}

func readParquetClips(path string) (ids []string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrClipList, path, r)
		}
	}()
	rd, err := file.OpenParquetFile(path, false)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
	}
	defer rd.Close()
	ci := rd.MetaData().Schema.ColumnIndexByName("clip")
	if ci < 0 {
		return nil, fmt.Errorf("%w: %s: no \"clip\" column", ErrClipList, path)
	}
	for g := 0; g < rd.NumRowGroups(); g++ {
		rg := rd.RowGroup(g)
		cr, err := rg.Column(ci)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
		}
		br, ok := cr.(*file.ByteArrayColumnChunkReader)
		if !ok {
			return nil, fmt.Errorf("%w: %s: column \"clip\" is not a string column", ErrClipList, path)
		}
		if err := checkRowCount(path, rg.NumRows()); err != nil {
			return nil, err
		}
		vals, err := readValues(int(rg.NumRows()), func(b int64, v []parquet.ByteArray, d []int16) (int64, int, error) { return br.ReadBatch(b, v, d, nil) })
		if err != nil {
			return nil, fmt.Errorf("%w: %s: column \"clip\": %w", ErrClipList, path, err)
		}
		for _, v := range vals {
			ids = append(ids, string(v))
		}
	}
	return ids, nil
}
