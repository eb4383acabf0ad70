// clips.parquet: the per-clip offset manifest, and Parquet tables in
// general (arrow-go column writers).

package manifests

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/schema"

	"github.com/clipshard/clipshard/formats/atomicfile"
	"github.com/clipshard/clipshard/formats/regfile"
)

// ClipRow is one row of clips.parquet.
type ClipRow struct {
	Clip    string
	Start   int64
	Length  int64
	Trimmed int64
	// Per modality, in the dataset's modality order.
	Sources []ClipSource
}

// ClipSource is one modality's part of a ClipRow.
type ClipSource struct {
	XXH64   uint64 // xxHash64 (seed 0) of the clip's converted bytes
	Path    string // source path as resolved
	Size    int64
	MtimeNS int64
}

type colKind int

const (
	colString colKind = iota
	colInt64
	colUint64
)

type column struct {
	name string
	kind colKind
	get  func(r *ClipRow) any
}

func clipColumns(modalities []string) []column {
	cols := []column{
		{"clip", colString, func(r *ClipRow) any { return r.Clip }},
		{"start", colInt64, func(r *ClipRow) any { return r.Start }},
		{"length", colInt64, func(r *ClipRow) any { return r.Length }},
		{"trimmed", colInt64, func(r *ClipRow) any { return r.Trimmed }},
	}
	for i, m := range modalities {
		i := i
		cols = append(cols,
			column{m + "_xxh64", colUint64, func(r *ClipRow) any { return r.Sources[i].XXH64 }},
			column{m + "_source", colString, func(r *ClipRow) any { return r.Sources[i].Path }},
			column{m + "_source_size", colInt64, func(r *ClipRow) any { return r.Sources[i].Size }},
			column{m + "_source_mtime_ns", colInt64, func(r *ClipRow) any { return r.Sources[i].MtimeNS }},
		)
	}
	return cols
}

func parquetSchema(cols []column) (*schema.GroupNode, error) {
	fields := make(schema.FieldList, len(cols))
	for i, c := range cols {
		var err error
		switch c.kind {
		case colString:
			fields[i], err = schema.NewPrimitiveNodeLogical(c.name, parquet.Repetitions.Required, schema.StringLogicalType{}, parquet.Types.ByteArray, -1, -1)
		case colInt64:
			fields[i], err = schema.NewPrimitiveNodeLogical(c.name, parquet.Repetitions.Required, schema.NewIntLogicalType(64, true), parquet.Types.Int64, -1, -1)
		case colUint64:
			fields[i], err = schema.NewPrimitiveNodeLogical(c.name, parquet.Repetitions.Required, schema.NewIntLogicalType(64, false), parquet.Types.Int64, -1, -1)
		}
		if err != nil {
			return nil, err
		}
	}
	return schema.NewGroupNode("schema", parquet.Repetitions.Required, fields, -1)
}

// WriteClips writes clips.parquet atomically: the columns of docs/FORMAT.md
// for the given modality names, one row group.
func WriteClips(path string, modalities []string, rows []ClipRow) error {
	cols := clipColumns(modalities)
	table := make([]Column, len(cols))
	for ci, c := range cols {
		table[ci] = Column{Name: c.name, Unsigned: c.kind == colUint64}
		for i := range rows {
			switch v := c.get(&rows[i]).(type) {
			case string:
				table[ci].Strings = append(table[ci].Strings, v)
			case int64:
				table[ci].Ints = append(table[ci].Ints, v)
			case uint64:
				table[ci].Ints = append(table[ci].Ints, int64(v))
			}
		}
		if c.kind == colString && table[ci].Strings == nil {
			table[ci].Strings = []string{}
		}
	}
	return WriteTable(path, table)
}

// Column is one column of a table for WriteTable: Strings for a string
// column, else Ints (int64, or uint64 bits when Unsigned).
type Column struct {
	Name     string
	Strings  []string
	Ints     []int64
	Unsigned bool
}

// WriteTable writes a Parquet file atomically: required columns, one row
// group, zstd, written with arrow-go's column writers.
func WriteTable(path string, table []Column) (err error) {
	cols := make([]column, len(table))
	for i, c := range table {
		cols[i] = column{name: c.Name, kind: colInt64}
		switch {
		case c.Strings != nil:
			cols[i].kind = colString
		case c.Unsigned:
			cols[i].kind = colUint64
		}
	}
	sc, err := parquetSchema(cols)
	if err != nil {
		return err
	}
	f, err := atomicfile.Create(path)
	if err != nil {
		return err
	}
	defer f.Abort()
	props := parquet.NewWriterProperties(
		parquet.WithCompression(compress.Codecs.Zstd),
		// Clip ids and paths are unique: a dictionary costs time and saves nothing.
		parquet.WithDictionaryDefault(false),
		parquet.WithCreatedBy("clipshard"),
		parquet.WithStats(true),
	)
	w, err := file.NewParquetWriterWithError(f, sc, file.WithWriterProps(props))
	if err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil && err == nil {
			err = fmt.Errorf("manifests: writing %s: %v", path, r)
		}
	}()
	rg, err := w.AppendRowGroupChecked()
	if err != nil {
		return err
	}
	for i, c := range table {
		cw, err := rg.NextColumn()
		if err != nil {
			return err
		}
		if cols[i].kind == colString {
			vals := make([]parquet.ByteArray, len(c.Strings))
			for k, v := range c.Strings {
				vals[k] = parquet.ByteArray(v)
			}
			_, err = cw.(*file.ByteArrayColumnChunkWriter).WriteBatch(vals, nil, nil)
		} else {
			_, err = cw.(*file.Int64ColumnChunkWriter).WriteBatch(c.Ints, nil, nil)
		}
		if err != nil {
			return err
		}
		if err := cw.Close(); err != nil {
			return err
		}
	}
	if err := rg.Close(); err != nil {
		return err
	}
	if err := w.FlushWithFooter(); err != nil {
		return err
	}
	return f.Commit()
}

// ReadClips reads clips.parquet and checks that it has the columns of the
// given modalities.
func ReadClips(path string, modalities []string) (rows []ClipRow, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrManifest, path, r)
		}
	}()
	f, _, err := regfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	defer f.Close()
	rd, err := file.NewParquetReader(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, path, err)
	}
	defer rd.Close()
	cols := clipColumns(modalities)
	sch := rd.MetaData().Schema
	idx := make([]int, len(cols))
	for i, c := range cols {
		idx[i] = sch.ColumnIndexByName(c.name)
		if idx[i] < 0 {
			return nil, fmt.Errorf("%w: %s: no column %q", ErrManifest, path, c.name)
		}
	}
	n := rd.NumRows()
	if err := checkRowCount(path, n); err != nil {
		return nil, err
	}
	rows = make([]ClipRow, n)
	for i := range rows {
		rows[i].Sources = make([]ClipSource, len(modalities))
	}
	base := 0
	for g := 0; g < rd.NumRowGroups(); g++ {
		rg := rd.RowGroup(g)
		m := int(rg.NumRows())
		if base+m > len(rows) {
			return nil, fmt.Errorf("%w: %s: row groups hold more rows than the footer says", ErrManifest, path)
		}
		for ci, c := range cols {
			cr, err := rg.Column(idx[ci])
			if err != nil {
				return nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, c.name, err)
			}
			if err := readColumn(cr, c, rows[base:base+m], ci, len(modalities)); err != nil {
				return nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, c.name, err)
			}
		}
		base += m
	}
	if base != len(rows) {
		return nil, fmt.Errorf("%w: %s: %d rows read, footer says %d", ErrManifest, path, base, len(rows))
	}
	return rows, nil
}

func readColumn(cr file.ColumnChunkReader, c column, rows []ClipRow, ci, nmod int) error {
	set := func(r *ClipRow, v any) {
		switch ci {
		case 0:
			r.Clip = v.(string)
		case 1:
			r.Start = v.(int64)
		case 2:
			r.Length = v.(int64)
		case 3:
			r.Trimmed = v.(int64)
		default:
			s := &r.Sources[(ci-4)/4]
			switch (ci - 4) % 4 {
			case 0:
				s.XXH64 = uint64(v.(int64))
			case 1:
				s.Path = v.(string)
			case 2:
				s.Size = v.(int64)
			case 3:
				s.MtimeNS = v.(int64)
			}
		}
	}
	n := len(rows)
	switch c.kind {
	case colString:
		r, ok := cr.(*file.ByteArrayColumnChunkReader)
		if !ok {
			return errors.New("not a string column")
		}
		vals, err := readValues(n, func(b int64, v []parquet.ByteArray, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) })
		if err != nil {
			return err
		}
		for i := range rows {
			set(&rows[i], string(vals[i]))
		}
	default:
		r, ok := cr.(*file.Int64ColumnChunkReader)
		if !ok {
			return errors.New("not an int64 column")
		}
		vals, err := readValues(n, func(b int64, v []int64, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) })
		if err != nil {
			return err
		}
		for i := range rows {
			set(&rows[i], vals[i])
		}
	}
	return nil
}

// readValues reads the n values of a column chunk through its typed
// ReadBatch; a column with nulls (fewer values than rows) is an error.
func readValues[T any](n int, batch func(int64, []T, []int16) (int64, int, error)) ([]T, error) {
	vals := make([]T, n)
	def := make([]int16, n)
	off := 0
	for off < n {
		_, k, err := batch(int64(n-off), vals[off:], def[off:])
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if k == 0 {
			return nil, fmt.Errorf("%d of %d values (nulls?)", off, n)
		}
		off += k
	}
	return vals, nil
}

// checkRowCount bounds the row count a Parquet footer declares before
// anything is allocated for it: at most maxRows, and at most 1024 rows per
// byte of file (hostile footers declare billions).
func checkRowCount(path string, n int64) error {
	const maxRows = 1 << 27
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if n < 0 || n > maxRows || n > 1024*st.Size() {
		return fmt.Errorf("%w: %s: footer declares %d rows for a %d-byte file", ErrManifest, path, n, st.Size())
	}
	return nil
}
