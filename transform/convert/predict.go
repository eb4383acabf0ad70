// Predict: the blobs' row counts read ahead from the .npy headers, so that
// their sha256 can be taken while they are written.

package convert

import (
	"context"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/formats/regfile"
)

// predictMinClipBytes is the float16 output per clip, of the modality the
// prediction reads, below which predictRows does not run: reading a header
// costs an open, about what hashing 64 KiB costs.
var predictMinClipBytes int64 = 256 << 10

// predictRows predicts the rows each modality's blob will have from the
// headers of one .npy modality (an open and a 4 KiB read per clip), so
// that the blobs' sha256 can be computed while they are written (see
// blob.Writer.Predict) rather than in a pass at the end. It returns nil
// when there is no .npy modality, when clips are small (reading the
// headers would cost more than it saves) or on any error: the pipeline
// reports errors, and a wrong prediction only costs the pass at the end.
// Only clips from index from on are read (earlier ones are in the
// journal); base is the clip frames those hold.
func (j *job) predictRows(ctx context.Context, from int, base int64) []int64 {
	src := -1
	for k, m := range j.opts.Modalities {
		if f, _ := formats.FormatOf(m.Template); f == formats.NPY && !m.PerClip {
			src = k
			break
		}
	}
	if src < 0 {
		return nil
	}
	m := j.opts.Modalities[src]
	frames := base
	for i := from; i < len(j.clips); i++ {
		if ctx.Err() != nil {
			return nil
		}
		rows, frameElems, ok := npyRows(m.Path(j.root, j.clips[i]))
		if !ok {
			return nil
		}
		if i == from && 2*rows*frameElems < predictMinClipBytes {
			return nil
		}
		frames += rows / int64(m.Rate)
	}
	pred := make([]int64, len(j.opts.Modalities))
	for k, m := range j.opts.Modalities {
		pred[k] = frames * int64(m.Rate)
		if m.PerClip {
			pred[k] = int64(len(j.clips)) // one row a clip (unless clips are skipped)
		}
	}
	return pred
}

// npyRows returns the leading dimension and the elements per row of the
// .npy file at path.
func npyRows(path string) (rows, frameElems int64, ok bool) {
	f, st, err := regfile.Open(path) // a FIFO is not waited on
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	h, err := npy.ReadHeader(f, st.Size())
	if err != nil || len(h.Shape) == 0 {
		return 0, 0, false
	}
	frameElems = 1
	for _, d := range h.Shape[1:] {
		frameElems *= int64(d)
	}
	return int64(h.Shape[0]), frameElems, true
}
