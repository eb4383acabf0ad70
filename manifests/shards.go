// An epoch's shard files opened and checked against epochs.json (each
// file's .npy header) and its samples files read (rows range-checked).

package manifests

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
)

// shardLayout is the dtype and shape epochs.json gives shard s's file of
// name (a modality, or "samples").
func (m *Epochs) shardLayout(s ShardEntry, name string) (string, []int, error) {
	if name == "samples" {
		return "<i8", []int{s.Samples, m.SampleCols()}, nil
	}
	for i := range m.Modalities {
		if md := &m.Modalities[i]; md.Name == name {
			return md.DType, append([]int{s.Samples}, md.SampleShape()...), nil
		}
	}
	return "", nil, fmt.Errorf("%w: epochs.json has no modality %q", ErrManifest, name)
}

// ShardFile opens shard s's file of name (a modality, or "samples") in
// the epochs folder dir and checks its .npy header against epochs.json:
// the dtype, the shape [samples, ...], the data 4096-aligned and the
// file's size the header's. A problem of the file's content is a
// *FileError; one opening it names the path itself.
func (m *Epochs) ShardFile(dir string, s ShardEntry, name string) (*os.File, *npy.Header, error) {
	descr, shape, err := m.shardLayout(s, name)
	if err != nil {
		return nil, nil, err
	}
	p, err := Join(dir, s.Files[name])
	if err != nil {
		return nil, nil, fmt.Errorf("%w: shard %d's %s file: %w", ErrManifest, s.Shard, name, err)
	}
	f, st, err := regfile.Open(p)
	if err != nil {
		return nil, nil, err
	}
	h, err := npy.ReadHeader(f, st.Size())
	if err == nil && (h.Descr != descr || h.Fortran || !slices.Equal(h.Shape, shape) || h.DataOffset%npy.DataAlign != 0) {
		err = fmt.Errorf("header %s %s at offset %d, epochs.json says %s %s (4096-aligned)",
			h.Descr, array.FormatShape(h.Shape), h.DataOffset, descr, array.FormatShape(shape))
	}
	if err != nil {
		f.Close()
		return nil, nil, &FileError{Path: p, Err: err}
	}
	return f, h, nil
}

// ReadShardRows reads the rows of shard s's samples file as they are:
// Samples rows of SampleCols() int64 (header checked, values not).
func (m *Epochs) ReadShardRows(dir string, s ShardEntry) ([]int64, error) {
	f, h, err := m.ShardFile(dir, s, "samples")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, h.DataSize)
	if _, err := f.ReadAt(buf, h.DataOffset); err != nil {
		return nil, &FileError{Path: f.Name(), Err: err}
	}
	rows := make([]int64, len(buf)/8)
	for i := range rows {
		rows[i] = int64(binary.LittleEndian.Uint64(buf[8*i:]))
	}
	return rows, nil
}

// ReadShardSamples reads shard s's samples, checked (CheckSamples): each
// sample and, in a mixed folder, the index of its source (nil unmixed).
func (m *Epochs) ReadShardSamples(dir string, s ShardEntry) ([]Sample, []int, error) {
	rows, err := m.ReadShardRows(dir, s)
	if err != nil {
		return nil, nil, err
	}
	cols := m.SampleCols()
	if err := m.CheckSamples(s.Samples, func(i, c int) int64 { return rows[i*cols+c] }); err != nil {
		p, _ := Join(dir, s.Files["samples"])
		return nil, nil, &FileError{Path: p, Err: err}
	}
	out := make([]Sample, s.Samples)
	var srcs []int
	if cols == 4 {
		srcs = make([]int, s.Samples)
	}
	for i := range out {
		r := rows[i*cols:]
		out[i] = Sample{Clip: r[0], Start: r[1], Valid: r[2]}
		if cols == 4 {
			srcs[i] = int(r[3])
		}
	}
	return out, srcs, nil
}
