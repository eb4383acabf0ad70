// clips.parquet: the per-clip offset manifest, and Parquet tables in
// general (arrow-go column writers).

package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"unsafe"

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

// Stamp is the source's stamp as recorded.
func (s *ClipSource) Stamp() SourceStamp {
	return SourceStamp{Path: s.Path, Size: s.Size, MtimeNS: s.MtimeNS, CtimeNS: s.CtimeNS, Ino: s.Ino}
}

// ClipSource is one modality's part of a ClipRow.
type ClipSource struct {
	XXH64   uint64 // xxHash64 (seed 0) of the clip's converted bytes
	Path    string // source path as resolved
	Size    int64
	MtimeNS int64
	// CtimeNS and Ino complete the source's stamp (see SourceStamp);
	// Stamped is false for a clips.parquet written before these columns.
	CtimeNS int64
	Ino     uint64
	Stamped bool
	// The conversion's audit of the clip's rows: the source dtype and the
	// stats over the rows kept (what an incremental convert needs to
	// reuse the rows without decoding the source again). Audited is false
	// for a clips.parquet written before these columns existed.
	Audited bool
	Descr   string
	Stats   Stats
}

type colKind int

const (
	colString colKind = iota
	colInt64
	colUint64
	colDouble
)

type column struct {
	name     string
	kind     colKind
	get      func(r *ClipRow) any
	set      func(r *ClipRow, v any)
	audit    int // the modality whose audit the column holds, plus one (0: not an audit column)
	stamp    int // the modality whose ctime or inode the column holds, plus one
	optional bool
}

func clipColumns(modalities []string) []column {
	cols := []column{
		{name: "clip", kind: colString, get: func(r *ClipRow) any { return r.Clip }, set: func(r *ClipRow, v any) { r.Clip = v.(string) }},
		{name: "start", kind: colInt64, get: func(r *ClipRow) any { return r.Start }, set: func(r *ClipRow, v any) { r.Start = v.(int64) }},
		{name: "length", kind: colInt64, get: func(r *ClipRow) any { return r.Length }, set: func(r *ClipRow, v any) { r.Length = v.(int64) }},
		{name: "trimmed", kind: colInt64, get: func(r *ClipRow) any { return r.Trimmed }, set: func(r *ClipRow, v any) { r.Trimmed = v.(int64) }},
	}
	for i, m := range modalities {
		src := func(r *ClipRow) *ClipSource { return &r.Sources[i] }
		cols = append(cols,
			column{name: m + "_xxh64", kind: colUint64, get: func(r *ClipRow) any { return src(r).XXH64 }, set: func(r *ClipRow, v any) { src(r).XXH64 = uint64(v.(int64)) }},
			column{name: m + "_source", kind: colString, get: func(r *ClipRow) any { return src(r).Path }, set: func(r *ClipRow, v any) { src(r).Path = v.(string) }},
			column{name: m + "_source_size", kind: colInt64, get: func(r *ClipRow) any { return src(r).Size }, set: func(r *ClipRow, v any) { src(r).Size = v.(int64) }},
			column{name: m + "_source_mtime_ns", kind: colInt64, get: func(r *ClipRow) any { return src(r).MtimeNS }, set: func(r *ClipRow, v any) { src(r).MtimeNS = v.(int64) }},
		)
		audit := []column{
			{name: m + "_source_dtype", kind: colString, get: func(r *ClipRow) any { return src(r).Descr }, set: func(r *ClipRow, v any) { src(r).Descr = v.(string) }},
			{name: m + "_nan", kind: colInt64, get: func(r *ClipRow) any { return src(r).Stats.NaN }, set: func(r *ClipRow, v any) { src(r).Stats.NaN = v.(int64) }},
			{name: m + "_inf_in", kind: colInt64, get: func(r *ClipRow) any { return src(r).Stats.InfIn }, set: func(r *ClipRow, v any) { src(r).Stats.InfIn = v.(int64) }},
			{name: m + "_overflow", kind: colInt64, get: func(r *ClipRow) any { return src(r).Stats.Overflow }, set: func(r *ClipRow, v any) { src(r).Stats.Overflow = v.(int64) }},
			{name: m + "_underflow", kind: colInt64, get: func(r *ClipRow) any { return src(r).Stats.Underflow }, set: func(r *ClipRow, v any) { src(r).Stats.Underflow = v.(int64) }},
			{name: m + "_max_abs", kind: colDouble, get: func(r *ClipRow) any { return src(r).Stats.MaxAbs }, set: func(r *ClipRow, v any) { src(r).Stats.MaxAbs = v.(float64) }},
		}
		for k := range audit {
			audit[k].audit, audit[k].optional = i+1, true
		}
		cols = append(cols, audit...)
		cols = append(cols,
			column{name: m + "_source_ctime_ns", kind: colInt64, stamp: i + 1, optional: true,
				get: func(r *ClipRow) any { return src(r).CtimeNS }, set: func(r *ClipRow, v any) { src(r).CtimeNS = v.(int64) }},
			column{name: m + "_source_inode", kind: colUint64, stamp: i + 1, optional: true,
				get: func(r *ClipRow) any { return src(r).Ino }, set: func(r *ClipRow, v any) { src(r).Ino = uint64(v.(int64)) }},
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
		case colDouble:
			fields[i], err = schema.NewPrimitiveNode(c.name, parquet.Repetitions.Required, parquet.Types.Double, -1, -1)
		}
		if err != nil {
			return nil, err
		}
	}
	return schema.NewGroupNode("schema", parquet.Repetitions.Required, fields, -1)
}

// WriteClips writes clips.parquet atomically: the columns of docs/FORMAT.md
// for the given modality names, one row group. A modality's audit columns
// are written when every row's source is Audited.
func WriteClips(path string, modalities []string, rows []ClipRow) error {
	var cols []column
	for _, c := range clipColumns(modalities) {
		if c.audit > 0 && slices.ContainsFunc(rows, func(r ClipRow) bool { return !r.Sources[c.audit-1].Audited }) {
			continue
		}
		if c.stamp > 0 && slices.ContainsFunc(rows, func(r ClipRow) bool { return !r.Sources[c.stamp-1].Stamped }) {
			continue
		}
		cols = append(cols, c)
	}
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
			case float64:
				table[ci].Floats = append(table[ci].Floats, v)
			}
		}
		if c.kind == colString && table[ci].Strings == nil {
			table[ci].Strings = []string{}
		}
		if c.kind == colDouble && table[ci].Floats == nil {
			table[ci].Floats = []float64{}
		}
	}
	return WriteTable(path, table)
}

// Column is one column of a table for WriteTable: Strings for a string
// column, Floats for a double one, else Ints (int64, or uint64 bits when
// Unsigned).
type Column struct {
	Name     string
	Strings  []string
	Floats   []float64
	Ints     []int64
	Unsigned bool
}

// WriteTable writes a Parquet file atomically: required columns, one row
// group, zstd, written with arrow-go's column writers.
func WriteTable(path string, table []Column) error {
	f, err := atomicfile.Create(path)
	if err != nil {
		return err
	}
	defer f.Abort()
	if err := encodeTable(f, path, table); err != nil {
		return err
	}
	return f.Commit()
}

// TableBytes is the bytes of the Parquet file WriteTable writes, made in
// memory (nothing written anywhere).
func TableBytes(name string, table []Column) ([]byte, error) {
	var b bytes.Buffer
	if err := encodeTable(&b, name, table); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// encodeTable writes table to w as a Parquet file (name: for errors).
func encodeTable(w io.Writer, name string, table []Column) (err error) {
	cols := make([]column, len(table))
	for i, c := range table {
		cols[i] = column{name: c.Name, kind: colInt64}
		switch {
		case c.Strings != nil:
			cols[i].kind = colString
		case c.Floats != nil:
			cols[i].kind = colDouble
		case c.Unsigned:
			cols[i].kind = colUint64
		}
	}
	sc, err := parquetSchema(cols)
	if err != nil {
		return err
	}
	props := parquet.NewWriterProperties(
		// zstd's fastest level: a clips.parquet is written at the end of
		// every convert, and the default level cost a 5000-clip convert
		// ~10 % of its time for 1 % less size.
		parquet.WithCompression(compress.Codecs.Zstd),
		parquet.WithCompressionLevel(1),
		// Clip ids and paths are unique: a dictionary costs time and saves nothing.
		parquet.WithDictionaryDefault(false),
		parquet.WithCreatedBy("clipshard"),
		parquet.WithStats(true),
	)
	pw, err := file.NewParquetWriterWithError(w, sc, file.WithWriterProps(props))
	if err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil && err == nil {
			err = fmt.Errorf("manifests: writing %s: %v", name, r)
		}
	}()
	rg, err := pw.AppendRowGroupChecked()
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
				vals[k] = parquet.ByteArray(unsafe.Slice(unsafe.StringData(v), len(v))) // read only
			}
			_, err = cw.(*file.ByteArrayColumnChunkWriter).WriteBatch(vals, nil, nil)
		} else if cols[i].kind == colDouble {
			_, err = cw.(*file.Float64ColumnChunkWriter).WriteBatch(c.Floats, nil, nil)
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
	return pw.FlushWithFooter()
}

// ReadClips reads clips.parquet and checks that it has the columns of the
// given modalities. A modality's audit columns are optional (earlier
// versions did not write them): without all of them, its sources are not
// Audited.
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
	audited := make([]bool, len(modalities))
	stamped := make([]bool, len(modalities))
	for i := range audited {
		audited[i], stamped[i] = true, true
	}
	for i, c := range cols {
		idx[i] = sch.ColumnIndexByName(c.name)
		if idx[i] < 0 && !c.optional {
			return nil, fmt.Errorf("%w: %s: no column %q", ErrManifest, path, c.name)
		}
		switch {
		case idx[i] >= 0:
		case c.audit > 0:
			audited[c.audit-1] = false
		case c.stamp > 0:
			stamped[c.stamp-1] = false
		}
	}
	n := rd.NumRows()
	if err := checkRowCount(path, n); err != nil {
		return nil, err
	}
	rows = make([]ClipRow, n)
	for i := range rows {
		rows[i].Sources = make([]ClipSource, len(modalities))
		for k := range modalities {
			rows[i].Sources[k].Audited, rows[i].Sources[k].Stamped = audited[k], stamped[k]
		}
	}
	base := 0
	for g := 0; g < rd.NumRowGroups(); g++ {
		rg := rd.RowGroup(g)
		m := int(rg.NumRows())
		if base+m > len(rows) {
			return nil, fmt.Errorf("%w: %s: row groups hold more rows than the footer says", ErrManifest, path)
		}
		for ci, c := range cols {
			if c.audit > 0 && !audited[c.audit-1] || c.stamp > 0 && !stamped[c.stamp-1] {
				continue
			}
			cr, err := rg.Column(idx[ci])
			if err != nil {
				return nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, c.name, err)
			}
			if err := readColumn(cr, c, rows[base:base+m]); err != nil {
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

func readColumn(cr file.ColumnChunkReader, c column, rows []ClipRow) error {
	set := c.set
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
	case colDouble:
		r, ok := cr.(*file.Float64ColumnChunkReader)
		if !ok {
			return errors.New("not a double column")
		}
		vals, err := readValues(n, func(b int64, v []float64, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) })
		if err != nil {
			return err
		}
		for i := range rows {
			set(&rows[i], vals[i])
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

// ReadTable reads the named int64 and string columns of a Parquet file
// (any others are ignored), every row group, with the row count bounded
// as for clips.parquet. A missing column or a null is an error.
func ReadTable(path string, ints, strs []string) (iv map[string][]int64, sv map[string][]string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrManifest, path, r)
		}
	}()
	f, _, err := regfile.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	defer f.Close()
	rd, err := file.NewParquetReader(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrManifest, path, err)
	}
	defer rd.Close()
	if err := checkRowCount(path, rd.NumRows()); err != nil {
		return nil, nil, err
	}
	iv, sv = map[string][]int64{}, map[string][]string{}
	sch := rd.MetaData().Schema
	for _, names := range [][]string{ints, strs} {
		for _, name := range names {
			if sch.ColumnIndexByName(name) < 0 {
				return nil, nil, fmt.Errorf("%w: %s: no column %q", ErrManifest, path, name)
			}
		}
	}
	for g := 0; g < rd.NumRowGroups(); g++ {
		rg := rd.RowGroup(g)
		n := int(rg.NumRows())
		if n < 0 || int64(n) > rd.NumRows() {
			return nil, nil, fmt.Errorf("%w: %s: row group %d declares %d rows", ErrManifest, path, g, n)
		}
		for _, name := range ints {
			cr, err := rg.Column(sch.ColumnIndexByName(name))
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, name, err)
			}
			r, ok := cr.(*file.Int64ColumnChunkReader)
			if !ok {
				return nil, nil, fmt.Errorf("%w: %s: column %q: not an int64 column", ErrManifest, path, name)
			}
			vals, err := readValues(n, func(b int64, v []int64, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) })
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, name, err)
			}
			iv[name] = append(iv[name], vals...)
		}
		for _, name := range strs {
			cr, err := rg.Column(sch.ColumnIndexByName(name))
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, name, err)
			}
			r, ok := cr.(*file.ByteArrayColumnChunkReader)
			if !ok {
				return nil, nil, fmt.Errorf("%w: %s: column %q: not a string column", ErrManifest, path, name)
			}
			vals, err := readValues(n, func(b int64, v []parquet.ByteArray, d []int16) (int64, int, error) { return r.ReadBatch(b, v, d, nil) })
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s: column %q: %w", ErrManifest, path, name, err)
			}
			for _, v := range vals {
				sv[name] = append(sv[name], string(v))
			}
		}
	}
	return iv, sv, nil
}
