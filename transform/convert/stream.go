// A large .npy source converted a piece at a time, each piece written as
// soon as it is converted.

package convert

import (
	"context"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/f16"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// convertPiece converts src (rows of frameElems elements of dt, C order,
// little-endian) into dst as convert writes them (float16, or a copy with
// keep), and returns what it found; row0 is the clip row of src's first.
func convertPiece(dst, src []byte, dt array.DType, keep bool, frameElems int, row0 int64) (converted, error) {
	c := converted{firstBad: -1, firstOverflw: -1}
	if keep {
		copy(dst, src)
		// Audit only: NaN/Inf counts and the largest magnitude.
		scratch := getBuf(2 * (len(src) / dt.Size))
		err := f16.Convert(*scratch, src, dt, &c.stats)
		putBuf(scratch)
		if err != nil {
			return c, err
		}
		c.stats.Overflow, c.stats.Underflow = 0, 0
		dst = dst[:len(src)]
	} else {
		dst = dst[:2*(len(src)/dt.Size)]
		if err := f16.Convert(dst, src, dt, &c.stats); err != nil {
			return c, err
		}
	}
	if c.stats.NaN+c.stats.InfIn > 0 {
		c.firstBad = row0 + int64(firstRow(src, dt, frameElems, isNonFinite))
	}
	if c.stats.Overflow > 0 {
		c.firstOverflw = row0 + int64(firstRow(src, dt, frameElems, overflows))
	}
	c.xxh = xxhash.Sum64(dst)
	c.size = int64(len(dst))
	return c, nil
}

// pieceBytes is about how much of a source convertStream reads at a time.
var pieceBytes int64 = 4 << 20

// convertStream reads rows [0, rows) of s a piece at a time, converts
// each, and hands it to write (if not nil); it returns what it found over
// all pieces. It checks ctx between pieces.
func (j *job) convertStream(ctx context.Context, s *formats.NPYRows, rows int64, keep bool, write func([]byte) error) (converted, error) {
	all := converted{firstBad: -1, firstOverflw: -1}
	h := xxhash.New()
	step := max(1, pieceBytes/s.RowBytes())
	raw, dst := getBuf(0), getBuf(0)
	defer putBuf(raw)
	defer putBuf(dst)
	dt := s.Header.DType
	outSize := 2
	if keep {
		outSize = dt.Size
	}
	out := getBuf(int(step * s.RowBytes() / int64(dt.Size) * int64(outSize)))
	defer putBuf(out)
	frameElems := int(s.RowBytes()) / dt.Size
	for r := int64(0); r < rows; r += step {
		if err := ctx.Err(); err != nil {
			return all, err
		}
		faults.Point("convert.piece")
		src, err := s.Read(r, min(rows, r+step), raw, dst)
		if err != nil {
			return all, err
		}
		c, err := convertPiece(*out, src, dt, keep, frameElems, r)
		if err != nil {
			return all, err
		}
		piece := (*out)[:c.size]
		h.Write(piece)
		all.stats.Add(c.stats)
		all.size += c.size
		if all.firstBad < 0 {
			all.firstBad = c.firstBad
		}
		if all.firstOverflw < 0 {
			all.firstOverflw = c.firstOverflw
		}
		if write != nil {
			if err := write(piece); err != nil {
				return all, err
			}
		}
	}
	all.xxh = h.Sum64()
	return all, nil
}

// writeStream appends a streamed modality of a clip (see processClip) to
// w: the source is read and converted again, a piece at a time, and must
// give the bytes the worker hashed.
func (j *job) writeStream(ctx context.Context, mo *modOut, keep bool, write func([]byte) error) error {
	s, err := formats.OpenNPYRows(&j.dirs, mo.src.Path)
	if err != nil {
		return err
	}
	defer s.Close()
	if d := mo.src.Stamp().Differs(manifests.StampOf(mo.src.Path, s.Info)); d != "" {
		return fmt.Errorf("%w: %s changed while it was being converted (%s; run again)", ErrInput, mo.src.Path, d)
	}
	c, err := j.convertStream(ctx, s, mo.rows, keep, write)
	if err != nil {
		return err
	}
	if c.xxh != mo.xxh || c.size != mo.size {
		return fmt.Errorf("%w: %s changed while it was being converted (its bytes differ from a moment ago; run again)", ErrInput, mo.src.Path)
	}
	return nil
}
