// Clip lists: the --clips file (text, CSV or Parquet) read and checked.

package manifests

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"

	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/internal/textsafe"
	"github.com/clipshard/clipshard/internal/ui"
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
	f, _, err := regfile.Open(path) // (a FIFO or device is refused, not waited on)
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
	cols, err := readCSVColumns(path, []string{"clip"}, "")
	return cols["clip"], err
}

func readParquetClips(path string) ([]string, error) {
	cols, err := readParquetColumns(path, []string{"clip"}, "", false)
	return cols["clip"], err
}

// MaxLabelBytes bounds one label's length (convert --label).
const MaxLabelBytes = 1024

// ReadClipLabels reads the columns cols of a .csv or .parquet clip list,
// one value per clip in the order ReadClipList gives the ids: the labels
// of convert --label. A text list has no columns; a missing column, an
// empty value (or a Parquet null), a value longer than MaxLabelBytes or
// holding what a terminal would act on is an error naming the row and
// column. Parquet columns may be strings or integers (written in
// decimal).
func ReadClipLabels(path string, cols []string) (map[string][]string, error) {
	var out map[string][]string
	var err error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".csv":
		out, err = readCSVColumns(path, cols, " for --label")
	case ".parquet":
		out, err = readParquetColumns(path, cols, " for --label", true)
	default:
		return nil, fmt.Errorf("%w: %s: labels come from a column of a .csv or .parquet clip list (a header line \"clip,%s\" and a row per clip); a text list has one id a line and no columns", ErrClipList, path, strings.Join(cols, ","))
	}
	if err != nil {
		return nil, err
	}
	for _, c := range cols {
		for i, v := range out[c] {
			if err := CheckLabel(v); err != nil {
				return nil, fmt.Errorf("%w: %s: row %d: column %q: %w", ErrClipList, path, i+1, c, err)
			}
		}
	}
	return out, nil
}

// CheckLabel refuses a label that is empty, longer than MaxLabelBytes or
// holds what a terminal would act on (a control or bidi character, a byte
// that is not UTF-8).
func CheckLabel(v string) error {
	switch {
	case v == "":
		return errors.New("the label is empty: every clip needs one (fill it in, or leave the clip out of the list)")
	case len(v) > MaxLabelBytes:
		return fmt.Errorf("the label holds %d bytes: a label is at most %d", len(v), MaxLabelBytes)
	}
	if r, at, bad := textsafe.First(v); bad {
		return fmt.Errorf("label %q holds %U at byte %d: a control character, a bidi control or a byte that is not UTF-8, which labels may not hold", v, r, at)
	}
	return nil
}

// readCSVColumns reads columns cols of a CSV file with a header line
// (their values trimmed); why says what wants them, in the error for a
// missing one.
func readCSVColumns(path string, cols []string, why string) (map[string][]string, error) {
	f, _, err := regfile.Open(path) // (a FIFO or device is refused, not waited on)
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
	at := map[string]int{}
	for i, h := range header {
		at[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	idx := make([]int, len(cols))
	for k, c := range cols {
		i, ok := at[c]
		if !ok {
			return nil, fmt.Errorf("%w: %s: no %q column%s in header %q%s", ErrClipList, path, c, why, header, meant(c, slices.Collect(maps.Keys(at))))
		}
		idx[k] = i
	}
	out := map[string][]string{}
	for row := 1; ; row++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
		}
		for k, c := range cols {
			if idx[k] >= len(rec) {
				line, _ := r.FieldPos(0)
				return nil, fmt.Errorf("%w: %s: line %d (row %d) has no %q field", ErrClipList, path, line, row, c)
			}
			out[c] = append(out[c], strings.TrimSpace(rec[idx[k]]))
		}
	}
	return out, nil
}

// readParquetColumns reads columns cols of a Parquet file, every row
// group, as strings: string columns, and with ints (labels) integer
// columns written in decimal. why says what wants them, in the error for
// a missing one.
func readParquetColumns(path string, cols []string, why string, ints bool) (out map[string][]string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrClipList, path, r)
		}
	}()
	f, _, err := regfile.Open(path) // (a FIFO or device is refused, not waited on)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rd, err := file.NewParquetReader(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrClipList, path, err)
	}
	defer rd.Close()
	sch := rd.MetaData().Schema
	for _, c := range cols {
		if sch.ColumnIndexByName(c) < 0 {
			var names []string
			for i := range sch.NumColumns() {
				names = append(names, sch.Column(i).Path())
			}
			return nil, fmt.Errorf("%w: %s: no %q column%s (it has %s)%s", ErrClipList, path, c, why, strings.Join(names, ", "), meant(c, names))
		}
	}
	out = map[string][]string{}
	for g := 0; g < rd.NumRowGroups(); g++ {
		rg := rd.RowGroup(g)
		if err := checkRowCount(path, rg.NumRows()); err != nil {
			return nil, err
		}
		n := int(rg.NumRows())
		for _, c := range cols {
			cr, err := rg.Column(sch.ColumnIndexByName(c))
			if err != nil {
				return nil, fmt.Errorf("%w: %s: column %q: %w", ErrClipList, path, c, err)
			}
			if _, str := cr.(*file.ByteArrayColumnChunkReader); !str && !ints {
				return nil, fmt.Errorf("%w: %s: column %q is not a string column", ErrClipList, path, c)
			}
			var vals []string
			switch r := cr.(type) {
			case *file.ByteArrayColumnChunkReader:
				var v []parquet.ByteArray
				if v, err = readValues(n, func(b int64, v []parquet.ByteArray, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) }); err == nil {
					for _, x := range v {
						vals = append(vals, string(x))
					}
				}
			case *file.Int64ColumnChunkReader:
				var v []int64
				if v, err = readValues(n, func(b int64, v []int64, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) }); err == nil {
					for _, x := range v {
						vals = append(vals, strconv.FormatInt(x, 10))
					}
				}
			case *file.Int32ColumnChunkReader:
				var v []int32
				if v, err = readValues(n, func(b int64, v []int32, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) }); err == nil {
					for _, x := range v {
						vals = append(vals, strconv.FormatInt(int64(x), 10))
					}
				}
			default:
				return nil, fmt.Errorf("%w: %s: column %q is neither strings nor integers: a label column holds one string (or integer) per clip", ErrClipList, path, c)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: %s: column %q: %w (no nulls: every clip needs its value)", ErrClipList, path, c, err)
			}
			out[c] = append(out[c], vals...)
		}
	}
	return out, nil
}

// meant is "; did you mean COLUMN?" for the column of names nearest to a
// misspelt c, or "".
func meant(c string, names []string) string {
	slices.Sort(names)
	if near := ui.Nearest(c, names); near != "" {
		return fmt.Sprintf("; did you mean %q?", near)
	}
	return ""
}
