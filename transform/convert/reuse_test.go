package convert

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
)

// rewriteNPY rewrites the .npy at path (as little-endian, C order) with
// its rows cut to rows (-1: all) and, if flip, one value changed; its
// mtime moves on.
func rewriteNPY(t *testing.T, path string, rows int, flip bool) {
	t.Helper()
	a, err := npy.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rows >= 0 {
		a.Data = a.Data[:len(a.Data)/a.Shape[0]*rows]
		a.Shape[0] = rows
	}
	if flip {
		a.Data[len(a.Data)/2] ^= 0x10
	}
	hdr, err := npy.EncodeHeader(a.DType.Descr(), false, a.Shape, 128)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(hdr, a.Data...), 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(path, future, future)
}

// TestReuseSameBytes: a convert over an existing dataset copies the rows
// of the clips whose sources are unchanged, decodes the rest, and writes
// exactly what a full rebuild writes, whatever changed: a source, the
// modalities, a clip's length, the clip list, the dtype kept.
func TestReuseSameBytes(t *testing.T) {
	defer func(a, b int64) { minStreamBytes, pieceBytes = a, b }(minStreamBytes, pieceBytes)
	shape, _ := ParseModality("shape@clip=motion/{clip}.pkl:shape")
	withShape := func(o *Options) { o.Modalities = append(o.Modalities, shape) }
	cases := []struct {
		name           string
		before, after  func(o *Options)
		prep, change   func(t *testing.T, src string)
		damage         func(t *testing.T, prev string)
		reused, partly int
		refused        string // in Result.ReuseRefused
		streamed       bool
		wantErr        string
		broken, dst    string // a testdata/convert file copied over a demo source first
	}{
		{name: "one source changed", before: withShape, after: withShape, reused: 11, partly: 1,
			change: func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "whisper", "clip005.npy"), -1, true) }},
		{name: "streamed copies", before: withShape, after: withShape, reused: 11, partly: 1, streamed: true,
			change: func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "whisper", "clip005.npy"), -1, true) }},
		{name: "modality added", before: func(o *Options) { o.Modalities = o.Modalities[:2] }, partly: 12},
		{name: "modality removed", after: func(o *Options) { o.Modalities = slices.Delete(o.Modalities, 1, 2) }, reused: 12},
		{name: "per-clip modality added", after: withShape, partly: 12},
		// clip005 has 37 frames.
		{name: "length changed, trimmed", before: func(o *Options) { o.Align = "trim" }, after: func(o *Options) { o.Align = "trim" }, reused: 11,
			change: func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "emotion", "clip005.npy"), 36, false) }},
		{name: "trimmed clip, all unchanged", before: func(o *Options) { o.Align = "trim" }, after: func(o *Options) { o.Align = "trim" }, reused: 11, partly: 1,
			// whisper@2 one row short: clip005 is trimmed by a frame, and
			// reused as it was; clip002's emotion is touched.
			prep: func(t *testing.T, src string) {
				rewriteNPY(t, filepath.Join(src, "whisper", "clip005.npy"), 2*37-1, false)
			},
			change: func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "emotion", "clip002.npy"), -1, false) }},
		{name: "clip list changed", reused: 11, change: func(t *testing.T, src string) {
			ids := []string{"clip011", "clip002", "clip000", "clip001", "clip004", "clip005", "clip006", "clip007", "clip008", "clip009", "clip010"}
			os.WriteFile(filepath.Join(src, "clips.txt"), []byte(strings.Join(ids, "\n")+"\n"), 0o644)
		}},
		{name: "dtype kept now", after: func(o *Options) { o.Modalities[2].KeepDType = true }, partly: 12},
		{name: "max-trim lowered", before: func(o *Options) { o.Align, o.MaxTrim = "trim", 5 }, after: func(o *Options) { o.Align = "trim" },
			prep:    func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "emotion", "clip005.npy"), 34, false) },
			wantErr: "trimming would cut 3 frames, more than --max-trim 2"},
		{name: "nonfinite no longer allowed", before: func(o *Options) { o.AllowNonFinite = true },
			broken: "nan_emotion.npy", dst: "emotion/clip003.npy", wantErr: "first at row 5"},
		{name: "forced", after: func(o *Options) { o.Force = true }},
		// A damaged previous dataset: rows that are not what clips.parquet
		// recorded, and rows it places out of range, are decoded instead.
		{name: "damaged blob", before: withShape, after: withShape, reused: 10, partly: 1, damage: func(t *testing.T, prev string) {
			f, err := os.OpenFile(filepath.Join(prev, "whisper.npy"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte{0x55, 0xaa}, 4096+10) // clip000's rows
			f.Close()
		}, change: func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "whisper", "clip005.npy"), -1, true) }},
		// A damaged manifest (its sum in SHA256SUMS stale, or made to
		// agree): nothing is reused, and the run says why.
		{name: "damaged manifest", refused: "clips.parquet", damage: func(t *testing.T, prev string) {
			b, _ := os.ReadFile(filepath.Join(prev, "clips.parquet"))
			b[200] ^= 0x40
			os.WriteFile(filepath.Join(prev, "clips.parquet"), b, 0o644) // its sum now stale
		}, change: func(t *testing.T, src string) { rewriteNPY(t, filepath.Join(src, "emotion", "clip011.npy"), -1, false) }},
		{name: "damaged manifest, sums updated", refused: "index.npy", damage: func(t *testing.T, prev string) {
			clitest.EditClips(t, prev, func(rows []manifests.ClipRow) {
				rows[1].Length = 1 << 40
				rows[2].Start = -5
				rows[3].Sources[1].XXH64++
			})
		}},
		// #26.2: dataset.json edited (a frame shape [8] -> [2, 4]) with
		// SHA256SUMS to match and the clip list reordered: before, every
		// clip was reused and the new blob had shape (599, 2, 4).
		{name: "edited frame shape, sums updated", refused: "header shape", damage: func(t *testing.T, prev string) {
			clitest.EditDataset(t, prev, func(d *manifests.Dataset) { d.Modalities[2].FrameShape = []int{2, 4} })
		}, change: func(t *testing.T, src string) {
			ids := []string{"clip011", "clip002", "clip000", "clip001", "clip003", "clip004", "clip005", "clip006", "clip007", "clip008", "clip009", "clip010"}
			os.WriteFile(filepath.Join(src, "clips.txt"), []byte(strings.Join(ids, "\n")+"\n"), 0o644)
		}},
		{name: "edited dtype, sums updated", refused: "header dtype", damage: func(t *testing.T, prev string) {
			clitest.EditDataset(t, prev, func(d *manifests.Dataset) { d.Modalities[0].DType = "<f4" })
		}, after: func(o *Options) { o.Modalities[0].KeepDType = true }},
		// #26.3: a NaN allowed before, its count edited to 0 in clips.parquet
		// and dataset.json (sums to match): the rows' audit finds it, the
		// clip is decoded and refused as a full rebuild refuses it. Before,
		// it was reused, exit 0, with a NaN in the output.
		{name: "nan laundered", before: func(o *Options) { o.AllowNonFinite = true },
			broken: "nan_emotion.npy", dst: "emotion/clip003.npy", wantErr: "first at row 5", damage: func(t *testing.T, prev string) {
				clitest.EditClips(t, prev, func(rows []manifests.ClipRow) { rows[3].Sources[2].Stats.NaN = 0 })
				clitest.EditDataset(t, prev, func(d *manifests.Dataset) { s := d.Stats["emotion"]; s.NaN = 0; d.Stats["emotion"] = s })
			}},
		{name: "nan laundered, streamed", before: func(o *Options) { o.AllowNonFinite = true }, streamed: true,
			broken: "nan_emotion.npy", dst: "emotion/clip003.npy", wantErr: "first at row 5", damage: func(t *testing.T, prev string) {
				clitest.EditClips(t, prev, func(rows []manifests.ClipRow) { rows[3].Sources[2].Stats.NaN = 0 })
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			minStreamBytes, pieceBytes = 1<<40, 4<<20
			if c.streamed {
				minStreamBytes, pieceBytes = 0, 300
			}
			src := demoCopy(t, c.broken, c.dst)
			if c.prep != nil {
				c.prep(t, src)
			}
			opts := func(out string, edit func(*Options)) Options {
				o := demoOptions(t, src, out)
				o.Budget = 1
				if edit != nil {
					edit(&o)
				}
				return o
			}
			inc := filepath.Join(t.TempDir(), "inc")
			if _, err := Run(context.Background(), opts(inc, c.before)); err != nil {
				t.Fatal(err)
			}
			if c.damage != nil {
				c.damage(t, inc)
			}
			if c.change != nil {
				c.change(t, src)
			}
			res, err := Run(context.Background(), opts(inc, c.after))
			if c.wantErr != "" {
				// A clip the previous run accepted and this one refuses:
				// the error of a full rebuild.
				_, ferr := Run(context.Background(), opts(filepath.Join(t.TempDir(), "full"), c.after))
				cut := func(err error) string { s, _, _ := strings.Cut(err.Error(), " (the clips done"); return s }
				if err == nil || ferr == nil || cut(err) != cut(ferr) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("errors: incremental %v, full %v; want both %q", err, ferr, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Reused != c.reused || res.ReusedPart != c.partly {
				t.Errorf("reused %d whole and %d in part, want %d and %d", res.Reused, res.ReusedPart, c.reused, c.partly)
			}
			if c.refused == "" && res.ReuseRefused != "" || !strings.Contains(res.ReuseRefused, c.refused) {
				t.Errorf("reuse refused %q, want %q", res.ReuseRefused, c.refused)
			}
			full := filepath.Join(t.TempDir(), "full")
			fo := opts(full, c.after)
			fo.Force = true
			if _, err := Run(context.Background(), fo); err != nil {
				t.Fatal(err)
			}
			clitest.SameTree(t, clitest.Tree(t, full), clitest.Tree(t, inc), "incremental vs full rebuild")
		})
	}
}

// TestCopyReusedChanged: rows of the previous dataset that no longer hash
// to what the worker checked (the file changed between the two reads)
// fail the write with one line naming the file, and a short file too.
func TestCopyReusedChanged(t *testing.T) {
	defer func(b int64) { pieceBytes = b }(pieceBytes)
	pieceBytes = 100
	path := filepath.Join(t.TempDir(), "w.npy")
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte(i)
	}
	os.WriteFile(path, data, 0o644)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	j := &job{}
	var got []byte
	write := func(p []byte) error { got = append(got, p...); return nil }
	mo := &modOut{size: 900, xxh: xxhash.Sum64(data[100:]), reuse: &reused{f: f, off: 100}}
	if err := j.copyReused(context.Background(), mo, write); err != nil || !bytes.Equal(got, data[100:]) {
		t.Fatalf("intact rows: %v, %d bytes", err, len(got))
	}
	mo.xxh++
	if err := j.copyReused(context.Background(), mo, nil); err == nil || !strings.Contains(err.Error(), path+" changed during the run") {
		t.Fatalf("changed rows: %v", err)
	}
	mo.size = 2000
	if err := j.copyReused(context.Background(), mo, nil); err == nil || !strings.Contains(err.Error(), "reading the previous dataset's "+path) {
		t.Fatalf("short file: %v", err)
	}
}
