package shuffle

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

// TestReadChunksPerClip: with short clips and large per-clip values, a
// run of pass 1 holds at most its limit of per-clip rows (the frames'
// bytes alone would let one run take every clip), the runs tile the
// frames in order, and each holds the rows of the clips its samples
// start in.
func TestReadChunksPerClip(t *testing.T) {
	const clips, length, clipRow, limit = 2000, 2, 4096, 64 << 10
	dir := t.TempDir()
	frames := make([]byte, clips*length*8)
	values := make([]byte, clips*clipRow)
	for c := range clips {
		binary.LittleEndian.PutUint64(values[c*clipRow:], uint64(c))
	}
	os.WriteFile(filepath.Join(dir, "f.npy"), frames, 0o644)
	os.WriteFile(filepath.Join(dir, "p.npy"), values, 0o644)
	j := &job{o: Options{Dataset: dir, Sampling: manifests.Sampling{Window: 3}}}
	j.srcs = []srcInfo{{dir: dir, ds: &manifests.Dataset{Frames: clips * length, Clips: clips},
		files: []srcFile{{path: filepath.Join(dir, "f.npy")}, {path: filepath.Join(dir, "p.npy")}}}}
	j.runs = []runInfo{{clip0: 0, frame0: 0, clips: clips, frames: clips * length, files: j.srcs[0].files}}
	for c := range clips {
		j.starts = append(j.starts, int64(c*length))
		j.lengths = append(j.lengths, length)
	}
	j.mods = []modInfo{
		{name: "f", rate: 1, rowBytes: 8, winBytes: 24},
		{name: "p", perClip: true, rowBytes: clipRow, winBytes: clipRow},
	}
	chunks, stop, err := j.readChunks(limit)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	next := int64(0)
	for ch := range chunks {
		if ch.err != nil {
			t.Fatal(ch.err)
		}
		if ch.g0 != next || ch.g1 <= ch.g0 {
			t.Fatalf("run [%d, %d) after %d", ch.g0, ch.g1, next)
		}
		next = ch.g1
		if n := len(ch.rows[1]); n > limit+clipRow {
			t.Fatalf("run [%d, %d): %d bytes of per-clip rows, limit %d", ch.g0, ch.g1, n, limit)
		}
		c0, c1 := ch.g0/length, (ch.g1-1)/length
		if ch.first[1] != c0 || int64(len(ch.rows[1])) != (c1-c0+1)*clipRow {
			t.Fatalf("run [%d, %d): per-clip rows from %d, %d bytes; want clips %d..%d", ch.g0, ch.g1, ch.first[1], len(ch.rows[1]), c0, c1)
		}
		for c := c0; c <= c1; c++ {
			if got := binary.LittleEndian.Uint64(ch.rows[1][(c-c0)*clipRow:]); got != uint64(c) {
				t.Fatalf("clip %d's row holds %d", c, got)
			}
		}
		ch.release()
	}
	if next != clips*length {
		t.Fatalf("runs end at %d, want %d", next, clips*length)
	}
}
