package blob

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/formats/directio"
	"github.com/clipshard/clipshard/formats/npy"
)

// expected returns the blob file for rows rows of data.
func expected(t *testing.T, frame []int, data []byte, rows int64) []byte {
	t.Helper()
	hdr, err := npy.EncodeHeader(array.Float16.Descr(), false, append([]int{int(rows)}, frame...), npy.DataAlign)
	if err != nil {
		t.Fatal(err)
	}
	return append(hdr, data...)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestWriter writes blobs in pieces of random sizes (some spanning
// several chunks), flushing and predicting at various points, through
// O_DIRECT and through the page cache, and checks the file and the sum.
func TestWriter(t *testing.T) {
	frame := []int{3, 5} // 30-byte rows: rows straddle pages and chunks
	const fb = 30
	cases := []struct {
		name      string
		rows      int64
		predictAt int // piece index before which Predict is called; -1: never
		predict   int64
		flushes   bool
	}{
		{"empty, predicted", 0, 0, 0, false},
		{"one row", 1, 0, 1, false},
		{"predicted first", 400_000, 0, 400_000, false},
		{"predicted after chunks were written (read back)", 1_000_000, 40, 1_000_000, true},
		{"predicted at the end", 200_000, 1 << 30, 200_000, true},
		{"wrong prediction", 200_000, 0, 200_001, true},
		{"never predicted", 300_000, -1, 0, true},
	}
	for _, direct := range []bool{true, false} {
		for _, c := range cases {
			for _, retain := range []int{RetainBytes, 2 * ChunkSize, 0} {
				t.Run(fmt.Sprintf("%s/direct=%v/retain=%d", c.name, direct, retain), func(t *testing.T) {
					defer func(d bool, r int) { directio.Enabled, RetainBytes = d, r }(directio.Enabled, RetainBytes)
					directio.Enabled, RetainBytes = direct, retain
					rng := rand.New(rand.NewPCG(uint64(c.rows), 7))
					data := make([]byte, c.rows*fb)
					for i := range data {
						data[i] = byte(rng.Uint32())
					}
					path := filepath.Join(t.TempDir(), "b.npy")
					w, err := Open(path, array.Float16, frame, 0)
					if err != nil {
						t.Fatal(err)
					}
					if direct && !w.d.Direct() {
						t.Logf("the filesystem of %s refuses O_DIRECT: testing the fallback only", path)
					}
					p, piece := data, 0
					for {
						if piece == c.predictAt {
							if c.flushes && piece > 0 && w.cur.off == npy.DataAlign {
								t.Fatal("no chunk was written before Predict: nothing to read back")
							}
							if err := w.Predict(c.predict); err != nil {
								t.Fatal(err)
							}
						}
						if len(p) == 0 {
							break
						}
						n := min(len(p), 1+rng.IntN(3*ChunkSize/40)) // up to 7.5% of a chunk
						if rng.IntN(50) == 0 {
							n = min(len(p), ChunkSize+rng.IntN(ChunkSize)) // spans chunks
						}
						if _, err := w.Write(p[:n]); err != nil {
							t.Fatal(err)
						}
						p = p[n:]
						piece++
						if c.flushes && rng.IntN(20) == 0 {
							if err := w.Flush(); err != nil {
								t.Fatal(err)
							}
							st, _ := os.Stat(path)
							if want := int64(npy.DataAlign + len(data) - len(p)); st.Size() != want {
								t.Fatalf("after Flush: file has %d bytes, want %d", st.Size(), want)
							}
						}
					}
					if c.predictAt > piece && c.predictAt != 1<<30 {
						t.Fatalf("test case never predicts (%d pieces)", piece)
					}
					if c.predictAt == 1<<30 {
						if err := w.Predict(c.predict); err != nil {
							t.Fatal(err)
						}
					}
					if w.Rows() != c.rows {
						t.Fatalf("Rows() = %d, want %d", w.Rows(), c.rows)
					}
					if early := c.predictAt >= 0 && c.predict == c.rows; w.HashedWhileWriting() != early {
						t.Fatalf("HashedWhileWriting() = %v, want %v", w.HashedWhileWriting(), early)
					}
					got, err := w.Finish()
					if err != nil {
						t.Fatal(err)
					}
					file, err := os.ReadFile(path)
					if err != nil {
						t.Fatal(err)
					}
					want := expected(t, frame, data, c.rows)
					if !bytes.Equal(file, want) {
						t.Fatalf("file differs from header + data (%d vs %d bytes)", len(file), len(want))
					}
					if got != sum(want) {
						t.Fatalf("Finish sum %q, want %q", got, sum(want))
					}
				})
			}
		}
	}
}

// TestResume reopens a blob at row counts that end mid-page and
// mid-chunk, appends the rest, and predicts after reopening (everything
// before is read back for the sum).
func TestResume(t *testing.T) {
	frame := []int{7}
	const fb = 14
	const rows = 700_000
	data := make([]byte, rows*fb)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	want := expected(t, frame, data, rows)
	for _, at := range []int64{0, 1, 292, 299_593, rows} {
		for _, predict := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d/predict=%v", at, predict), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "b.npy")
				w, err := Open(path, array.Float16, frame, 0)
				if err != nil {
					t.Fatal(err)
				}
				// Write more than is kept: the reopened blob drops it.
				if _, err := w.Write(data[:min(len(data), int(at+1000)*fb)]); err != nil {
					t.Fatal(err)
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				if w, err = Open(path, array.Float16, frame, at); err != nil {
					t.Fatal(err)
				}
				if predict {
					if err := w.Predict(rows); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := w.Write(data[at*fb:]); err != nil {
					t.Fatal(err)
				}
				got, err := w.Finish()
				if err != nil {
					t.Fatal(err)
				}
				file, _ := os.ReadFile(path)
				if !bytes.Equal(file, want) {
					t.Fatalf("resumed at %d: file differs (%d vs %d bytes)", at, len(file), len(want))
				}
				if got != sum(want) {
					t.Fatalf("resumed at %d: sum %q, want %q", at, got, sum(want))
				}
			})
		}
	}
	t.Run("short file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "b.npy")
		if err := os.WriteFile(path, make([]byte, npy.DataAlign+10*fb), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(path, array.Float16, frame, 11); err == nil {
			t.Fatal("Open at 11 rows of a 10-row file succeeded")
		}
	})
}

func TestPartialRow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.npy")
	w, err := Open(path, array.Float16, []int{4}, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 8+3))
	if _, err := w.Finish(); err == nil {
		t.Fatal("Finish with 3 bytes of a partial row succeeded")
	}
	if w.Rows() != 1 {
		t.Fatalf("Rows() = %d, want 1", w.Rows())
	}
	if err := w.Predict(1); err == nil {
		t.Fatal("Predict after Finish succeeded")
	}
}

// TestCreate: blobs of known row counts, small (one chunk smaller than
// ChunkSize) and large, written one after the other so that chunk buffers
// come back from the pool, give the file and its sum; a blob given fewer
// rows than announced is still finished right (the sum is computed again).
func TestCreate(t *testing.T) {
	frame := []int{3, 5}
	const fb = 30
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	for i, c := range []struct{ rows, write int64 }{
		{5, 5}, {300000, 300000}, {5, 5}, {300000, 300000}, {7, 6}, {0, 0},
	} {
		path := filepath.Join(dir, fmt.Sprint(i))
		w, err := Create(path, array.Float16, frame, c.rows)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, c.write*fb)
		for k := range data {
			data[k] = byte(r.Uint32())
		}
		for p := data; len(p) > 0; {
			n := min(len(p), 1+r.IntN(100000))
			if _, err := w.Write(p[:n]); err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
		got, err := w.Finish()
		if err != nil {
			t.Fatal(err)
		}
		want := expected(t, frame, data, c.write)
		file, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(file, want) || got != sum(want) {
			t.Fatalf("case %d (%d rows of %d): file or sum differ", i, c.write, c.rows)
		}
	}
	ReleaseBuffers()
}

// TestBuffersFor: a Writer's buffers stay within the memory it is given
// (at least MinChunk chunks), in aligned chunks, and a blob written by
// OpenMem with little memory is what Open writes.
func TestBuffersFor(t *testing.T) {
	for _, mem := range []int64{0, 100 << 10, 320 << 10, 1 << 20, 2 << 20, 5 << 20, 16 << 20, 64 << 20, 1 << 30} {
		size, retain := BuffersFor(mem)
		use := int64(chunks)*int64(size) + 2*int64(retain)
		if size < MinChunk || size > ChunkSize || size%align != 0 || retain%size != 0 || retain > RetainBytes ||
			use > max(mem, int64(chunks)*MinChunk) {
			t.Errorf("mem %d: chunk %d, retain %d: %d bytes", mem, size, retain, use)
		}
	}
	if size, retain := BuffersFor(1 << 30); size != ChunkSize || retain != RetainBytes {
		t.Errorf("ample memory: chunk %d retain %d, want %d and %d", size, retain, ChunkSize, RetainBytes)
	}
}
