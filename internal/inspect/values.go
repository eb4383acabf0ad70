// A blob's values, sampled: rows read evenly across it, histogrammed.

package inspect

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/manifests"
)

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

// rowsAt locates up to n of a modality's rows from its row first (in clip
// order): the blob's path, the byte offset and how many rows lie there one
// after the other (at least 1 if n is).
type rowsAt func(first, n int64) (path string, off int64, rows int64, err error)

// sampleValues reads up to maxRows rows of the modality m, in 64 runs
// spread evenly over its rows in clip order (at), and histograms their
// values (two passes over what was read: range, then counts).
func sampleValues(blob string, m manifests.Modality, at rowsAt, maxRows int, open Opener) (int64, Histogram, error) {
	dec, size, err := decoder(m.DType)
	if err != nil {
		return 0, Histogram{}, fmt.Errorf("%s: %w", blob, err)
	}
	per := 1
	for _, x := range m.FrameShape {
		per *= x
	}
	rowBytes := int64(per * size)
	files := map[string]ReaderAt{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
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
		for n > 0 { // (in pieces where the rows lie in several blobs)
			path, off, got, err := at(first, n)
			if err != nil {
				return 0, Histogram{}, err
			}
			f := files[path]
			if f == nil {
				if f, err = open(path); err != nil {
					return 0, Histogram{}, err
				}
				files[path] = f
			}
			buf := make([]byte, got*rowBytes)
			if _, err := f.ReadAt(buf, off); err != nil {
				return 0, Histogram{}, fmt.Errorf("%s: rows %d..%d: %w", path, first, first+got, err)
			}
			read += got
			first, n = first+got, n-got
			for j := 0; j < int(got)*per; j++ {
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
