package main_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	// internal/ui is imported so that the test cache is keyed on it (the
	// binary under test is built from it).
	"github.com/clipshard/clipshard/formats/array"
	"github.com/clipshard/clipshard/internal/clitest"
	_ "github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/convert"
	"github.com/clipshard/clipshard/transform/shuffle"
)

var bin string

func TestMain(m *testing.M) { clitest.Main(m, "verify", &bin) }

// demoDataset converts a copy of testdata/demo and returns (sources, dataset).
func demoDataset(t *testing.T) (string, string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo"), src)
	var mods []convert.Modality
	for _, s := range []string{"motion=motion/{clip}.pkl:exp+pose", "shape@clip=motion/{clip}.pkl:shape", "whisper@2=whisper/{clip}.npy", "emotion=emotion/{clip}.npy"} {
		m, err := convert.ParseModality(s)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, m)
	}
	out := filepath.Join(t.TempDir(), "ds")
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: filepath.Join(src, "clips.txt"), Out: out, Modalities: mods}); err != nil {
		t.Fatal(err)
	}
	return src, out
}

func verify(t *testing.T, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, nil, append([]string{"--quiet"}, args...)...)
}

// clipRange returns the byte range of clip i in a modality's blob.
func clipRange(t *testing.T, dir string, i int, name string) (int64, int64) {
	d, err := manifests.LoadDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := d.Modality(name)
	starts, lengths, err := manifests.ReadIndex(filepath.Join(dir, "index.npy"))
	if err != nil {
		t.Fatal(err)
	}
	fb := int64(2)
	for _, x := range m.FrameShape {
		fb *= int64(x)
	}
	return m.DataOffset + starts[i]*int64(m.Rate)*fb, lengths[i] * int64(m.Rate) * fb
}

func flipByte(t *testing.T, path string, off int64) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, off)
	b[0] ^= 0x40
	f.WriteAt(b, off)
}

func TestIntact(t *testing.T) {
	_, dir := demoDataset(t)
	for _, args := range [][]string{{dir}, {"--deep", dir}, {"--deep", "--sources", dir}} {
		r := verify(t, args...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "ok: ") {
			t.Fatalf("%v: exit %d: %s %s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
	r := verify(t, "--json", "--deep", dir)
	var rep manifests.Report
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || rep.Files != 8 || rep.Clips != 12 || len(rep.Problems) != 0 {
		t.Fatalf("json: %v %+v", err, rep)
	}
}

// TestCorruption: each mutation, its exit code, and the culprit named.
func TestCorruption(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, src, dir string)
		args   []string
		code   int
		want   []string
	}{
		{"flipped byte, default names the file", func(t *testing.T, src, dir string) {
			off, _ := clipRange(t, dir, 4, "whisper")
			flipByte(t, filepath.Join(dir, "whisper.npy"), off+10)
		}, nil, 1, []string{"whisper.npy: sha256 mismatch"}},
		{"flipped byte, --deep names the clip", func(t *testing.T, src, dir string) {
			off, _ := clipRange(t, dir, 4, "whisper")
			flipByte(t, filepath.Join(dir, "whisper.npy"), off+10)
		}, []string{"--deep"}, 1, []string{`whisper.npy: clip "clip004": xxh64 mismatch`}},
		{"truncated blob", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "motion.npy")
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-100)
		}, nil, 1, []string{"motion.npy: size", "truncated"}},
		{"missing file", func(t *testing.T, src, dir string) {
			os.Remove(filepath.Join(dir, "index.npy"))
		}, nil, 1, []string{"index.npy: missing"}},
		{"extra file", func(t *testing.T, src, dir string) {
			os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("hi"), 0o644)
		}, nil, 1, []string{"notes.txt: unexpected file"}},
		{"edited parquet row, sums updated", func(t *testing.T, src, dir string) {
			d, _ := manifests.LoadDataset(dir)
			names := []string{}
			for _, m := range d.Modalities {
				names = append(names, m.Name)
			}
			p := filepath.Join(dir, "clips.parquet")
			rows, err := manifests.ReadClips(p, names)
			if err != nil {
				t.Fatal(err)
			}
			rows[7].Length++
			if err := manifests.WriteClips(p, names, rows); err != nil {
				t.Fatal(err)
			}
			sums, _ := manifests.ReadSums(filepath.Join(dir, "SHA256SUMS"))
			sums["clips.parquet"], _ = manifests.HashFile(p)
			manifests.WriteSums(filepath.Join(dir, "SHA256SUMS"), sums)
		}, nil, 1, []string{`clips.parquet: clip "clip007": row 7: start`, "index.npy says"}},
		{"edited parquet, sums stale", func(t *testing.T, src, dir string) {
			flipByte(t, filepath.Join(dir, "clips.parquet"), 200)
		}, nil, 1, []string{"clips.parquet"}},
		{"dataset.json points outside", func(t *testing.T, src, dir string) {
			d, _ := manifests.LoadDataset(dir)
			d.Modalities[0].File = "../../etc/passwd"
			d.Write(dir)
		}, nil, 2, []string{"escapes the dataset directory", "../../etc/passwd"}},
		{"absolute path in dataset.json", func(t *testing.T, src, dir string) {
			d, _ := manifests.LoadDataset(dir)
			d.Files.Index = "/etc/passwd"
			d.Write(dir)
		}, nil, 2, []string{"/etc/passwd", "absolute"}},
		{"unreadable dataset.json", func(t *testing.T, src, dir string) {
			os.WriteFile(filepath.Join(dir, "dataset.json"), []byte(`{"format": "clipshard.dataset", "version": `), 0o644)
		}, nil, 2, []string{"dataset.json"}},
		{"source changed after conversion", func(t *testing.T, src, dir string) {
			p := filepath.Join(src, "emotion", "clip010.npy") // little-endian float64
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 0x80 // negate the last value, same size
			os.WriteFile(p, b, 0o644)
			future := time.Now().Add(time.Hour)
			os.Chtimes(p, future, future)
		}, []string{"--sources"}, 1, []string{"emotion/clip010.npy", `clip "clip010"`, "content drift", "changed since conversion"}},
		{"blob tampered, dataset.json and SHA256SUMS edited to match", func(t *testing.T, src, dir string) {
			off, _ := clipRange(t, dir, 5, "emotion")
			p := filepath.Join(dir, "emotion.npy")
			flipByte(t, p, off+3)
			sum, _ := manifests.HashFile(p)
			d, _ := manifests.LoadDataset(dir)
			d.Modality("emotion").SHA256 = sum
			d.Write(dir)
			rewriteSums(t, dir, "emotion.npy", "dataset.json")
			if r := verify(t, dir); r.Code != 0 {
				t.Fatalf("the edit is not consistent: %s", r.Stdout)
			}
		}, []string{"--sources"}, 1, []string{`emotion/clip005.npy: clip "clip005": content drift`, "emotion.npy rows"}},
		{"blob is a FIFO", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "whisper.npy")
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"--deep", "--sources"}, 1, []string{"whisper.npy", "not a regular file (a FIFO)"}},
		{"blob is a symlink to its bytes out of the folder", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "motion.npy")
			to := filepath.Join(t.TempDir(), "motion.npy")
			os.Rename(p, to)
			os.Symlink(to, p) // (before: "intact", where shuffle and the readers refuse it)
		}, []string{"--deep", "--sources"}, 1, []string{"motion.npy: a symbolic link to ", "out of the folder", "move what it points to here"}},
		{"blob is a symlink to /dev/zero", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "motion.npy")
			os.Remove(p)
			os.Symlink("/dev/zero", p)
		}, []string{"--deep", "--sources"}, 1, []string{"motion.npy", "not a regular file (a character device)"}},
		{"blob is a symlink to a FIFO", func(t *testing.T, src, dir string) {
			fifo := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "emotion.npy")
			os.Remove(p)
			os.Symlink(fifo, p)
		}, []string{"--deep"}, 1, []string{"emotion.npy", "not a regular file (a FIFO)"}},
		{"SHA256SUMS is a FIFO", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "SHA256SUMS")
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, nil, 1, []string{"SHA256SUMS", "not a regular file (a FIFO)"}},
		{"dataset.json is a FIFO", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "dataset.json")
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, nil, 2, []string{"dataset.json", "not a regular file (a FIFO)"}},
		{"clip ids swapped, sums updated", func(t *testing.T, src, dir string) {
			p := filepath.Join(dir, "clips.txt")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(strings.Replace(string(b), "clip001\n", "X\n", 1), "clip002\n", "clip001\n", 1)), 0o644)
			rewriteSums(t, dir, "clips.txt")
		}, nil, 1, []string{`clips.txt: clip "clip001": line 2 says "X", clips.parquet row 1 is "clip001"`}},
		// #26.4: recorded figures edited consistently with SHA256SUMS
		// (before, all passed --deep --sources).
		{"dataset.json nan edited, sums updated", func(t *testing.T, src, dir string) {
			clitest.EditDataset(t, dir, func(d *manifests.Dataset) { s := d.Stats["emotion"]; s.NaN = 3; d.Stats["emotion"] = s })
		}, []string{"--deep"}, 1, []string{`dataset.json: stats of "emotion": nan 3`, "add up to 0"}},
		{"dataset.json max_abs edited, sums updated", func(t *testing.T, src, dir string) {
			clitest.EditDataset(t, dir, func(d *manifests.Dataset) { s := d.Stats["motion"]; s.MaxAbs = 7; d.Stats["motion"] = s })
		}, []string{"--deep"}, 1, []string{`dataset.json: stats of "motion"`, "max_abs 7"}},
		{"dataset.json source_dtype edited, sums updated", func(t *testing.T, src, dir string) {
			clitest.EditDataset(t, dir, func(d *manifests.Dataset) { d.Modality("emotion").SourceDType = "<f4" })
		}, []string{"--deep"}, 1, []string{`modality "emotion": source_dtype "<f4"`, `">f8,<f8"`}},
		{"dataset.json align and trimmed edited, sums updated", func(t *testing.T, src, dir string) {
			clitest.EditDataset(t, dir, func(d *manifests.Dataset) { d.Align, d.Trimmed = "diagonal", 4 })
		}, []string{"--deep"}, 1, []string{`align "diagonal"`, "trimmed 4, the clips of clips.parquet add up to 0"}},
		{"clips.parquet audit and totals edited together, sums updated", func(t *testing.T, src, dir string) {
			clitest.EditClips(t, dir, func(rows []manifests.ClipRow) { rows[4].Sources[3].Stats.NaN = 2 })
			clitest.EditDataset(t, dir, func(d *manifests.Dataset) { s := d.Stats["emotion"]; s.NaN = 2; d.Stats["emotion"] = s })
		}, []string{"--deep"}, 1, []string{`clips.parquet: clip "clip004": modality "emotion": recorded nan 2, the rows hold 0`}},
		{"clips.parquet max_abs edited within float16 rounding: --sources sees it", func(t *testing.T, src, dir string) {
			clitest.EditClips(t, dir, func(rows []manifests.ClipRow) {
				rows[4].Sources[0].Stats.MaxAbs = math.Nextafter(rows[4].Sources[0].Stats.MaxAbs, 0)
			})
			if r := verify(t, "--deep", dir); r.Code != 0 {
				t.Fatalf("--deep sees what the blob cannot tell: %s", r.Stdout)
			}
		}, []string{"--sources"}, 1, []string{`clips.parquet: clip "clip004": modality "motion": recorded nan 0`, "its source converts with"}},
		{"clips.parquet source dtype edited: --sources", func(t *testing.T, src, dir string) {
			clitest.EditClips(t, dir, func(rows []manifests.ClipRow) { rows[2].Sources[2].Descr = ">f2" })
		}, []string{"--sources"}, 1, []string{`clip "clip002": modality "whisper": recorded source dtype >f2, the source's is <f2`}},
		{"source gone", func(t *testing.T, src, dir string) {
			os.Remove(filepath.Join(src, "motion", "clip010.pkl"))
		}, []string{"--sources"}, 1, []string{"motion/clip010.pkl", `clip "clip010"`, "gone"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, dir := demoDataset(t)
			c.mutate(t, src, dir)
			r := verify(t, append(c.args, dir)...)
			out := r.Stdout + r.Stderr
			if r.Code != c.code {
				t.Fatalf("exit %d, want %d: %s", r.Code, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			// Each problem once (#26.10: a FIFO was reported twice).
			seen := map[string]bool{}
			for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
				if seen[line] {
					t.Errorf("reported twice: %q", line)
				}
				seen[line] = true
			}
			if c.code == 2 && strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
				t.Errorf("want one line on stderr: %q", r.Stderr)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	if r := verify(t); r.Code != 2 {
		t.Fatalf("no args: %d", r.Code)
	}
	if r := verify(t, t.TempDir()); r.Code != 2 || !strings.Contains(r.Stderr, "no dataset.json") {
		t.Fatalf("empty dir: %d %q", r.Code, r.Stderr)
	}
	if r := verify(t, "--help"); r.Code != 0 || !strings.Contains(r.Stdout, "Exit status") {
		t.Fatalf("--help: %d", r.Code)
	}
	missing := filepath.Join(t.TempDir(), "nope")
	if r := verify(t, missing); r.Code != 2 || !strings.Contains(r.Stderr, missing+" does not exist") {
		t.Fatalf("missing dir: %d %q", r.Code, r.Stderr)
	}
	// Flags after the directory.
	_, ds := demoDataset(t)
	if r := clitest.Run(t, bin, nil, ds, "--deep", "--quiet"); r.Code != 0 || !strings.Contains(r.Stdout, "structure+sha256+deep") {
		t.Fatalf("DIR --deep: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
}

func shuffleDemo(t *testing.T, ds string, seed uint64) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "ep")
	o := shuffle.Options{Dataset: ds, Out: out, EpochStart: 0, EpochEnd: 2, Seed: seed, ShardSize: 4,
		Sampling: manifests.Sampling{Window: 15, Mode: "tile", Short: "skip"}}
	if _, err := shuffle.Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	return out
}

// rewriteSums recomputes SHA256SUMS of dir for the listed files, so that a
// mutation is invisible to the default level.
func rewriteSums(t *testing.T, dir string, files ...string) { clitest.Resum(t, dir, files...) }

func TestEpochCorruption(t *testing.T) {
	_, ds := demoDataset(t)
	ep := shuffleDemo(t, ds, 7)
	if r := verify(t, "--deep", ep); r.Code != 0 || !strings.Contains(r.Stdout, "samples)") {
		t.Fatalf("intact: %d %s", r.Code, r.Stdout)
	}
	shard := "epoch-0001/shard-00002"
	swap := func(t *testing.T, dir string) {
		// Swap samples 0 and 1 of a shard: every modality and the samples file.
		for _, what := range []string{"motion", "shape", "whisper", "emotion", "samples"} {
			p := filepath.Join(dir, shard+"."+what+".npy")
			b, _ := os.ReadFile(p)
			n := (len(b) - 4096) / 4
			rec0 := append([]byte{}, b[4096:4096+n]...)
			copy(b[4096:4096+n], b[4096+n:4096+2*n])
			copy(b[4096+n:4096+2*n], rec0)
			os.WriteFile(p, b, 0o644)
		}
	}
	t.Run("swapped samples, default names the shard", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		swap(t, dir)
		r := verify(t, dir)
		if r.Code != 1 || !strings.Contains(r.Stdout, shard+".samples.npy: sha256 mismatch") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
	})
	t.Run("swapped samples, --deep names the sample", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		swap(t, dir)
		var files []string
		for _, what := range []string{"motion", "shape", "whisper", "emotion", "samples"} {
			files = append(files, shard+"."+what+".npy")
		}
		rewriteSums(t, dir, files...)
		if r := verify(t, dir); r.Code != 0 {
			t.Fatalf("default should pass with sums rewritten: %s", r.Stdout)
		}
		r := verify(t, "--deep", dir)
		if r.Code != 1 || !strings.Contains(r.Stdout, shard+".samples.npy: clip") || !strings.Contains(r.Stdout, "sample 0 is") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
	})
	t.Run("a per-clip value changed, --deep names the sample's clip", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		f := shard + ".shape.npy" // [S, 100] float16: sample 1's clip row
		flipByte(t, filepath.Join(dir, f), 4096+200+6)
		rewriteSums(t, dir, f)
		r := verify(t, "--deep", dir)
		if r.Code != 1 || !strings.Contains(r.Stdout, f+": clip") || !strings.Contains(r.Stdout, "sample 1 (clip") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
	})
	t.Run("shard from another seed, --deep", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		other := shuffleDemo(t, ds, 8)
		var files []string
		for _, what := range []string{"motion", "shape", "whisper", "emotion", "samples"} {
			f := "epoch-0000/shard-00000." + what + ".npy"
			b, err := os.ReadFile(filepath.Join(other, f))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
			files = append(files, f)
		}
		rewriteSums(t, dir, files...)
		r := verify(t, "--deep", dir)
		if r.Code != 1 || !strings.Contains(r.Stdout, "epoch-0000/shard-00000.samples.npy") || !strings.Contains(r.Stdout, "seed 7 says") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
	})
	t.Run("an epoch's folder is a link out of the folder", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		p := filepath.Join(dir, "epoch-0000")
		to := filepath.Join(t.TempDir(), "epoch-0000")
		if err := os.Rename(p, to); err != nil {
			t.Fatal(err)
		}
		os.Symlink(to, p)
		r := verify(t, "--deep", dir)
		if r.Code != 1 || !strings.Contains(r.Stdout, "epoch-0000: a symbolic link to "+to+", out of the folder") || strings.Contains(r.Stdout, "missing") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
	})
	t.Run("shard is a FIFO, or a link to /dev/zero", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		p := filepath.Join(dir, shard+".whisper.npy")
		os.Remove(p)
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		q := filepath.Join(dir, shard+".motion.npy")
		os.Remove(q)
		os.Symlink("/dev/zero", q)
		r := verify(t, "--deep", dir)
		if r.Code != 1 || !strings.Contains(r.Stdout, shard+".whisper.npy: "+p+": not a regular file (a FIFO)") ||
			!strings.Contains(r.Stdout, shard+".motion.npy: "+q+": not a regular file (a character device)") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
	})
	// #26.5: shards.parquet is checked against epochs.json row by row
	// (before, garbage or another folder's file, sums updated, passed
	// --deep).
	t.Run("shards.parquet garbage or another folder's, sums updated", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		p := filepath.Join(dir, "shards.parquet")
		os.WriteFile(p, []byte("PAR1 not a table PAR1"), 0o644)
		rewriteSums(t, dir, "shards.parquet")
		if r := verify(t, "--deep", dir); r.Code != 1 || !strings.Contains(r.Stdout, "shards.parquet: ") {
			t.Fatalf("garbage: %d %s", r.Code, r.Stdout)
		}
		other := filepath.Join(t.TempDir(), "ep")
		o := shuffle.Options{Dataset: ds, Out: other, EpochStart: 0, EpochEnd: 2, Seed: 7, ShardSize: 5,
			Sampling: manifests.Sampling{Window: 15, Mode: "tile", Short: "skip"}}
		if _, err := shuffle.Run(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(other, "shards.parquet"))
		os.WriteFile(p, b, 0o644)
		rewriteSums(t, dir, "shards.parquet")
		if r := verify(t, "--deep", dir); r.Code != 1 || !strings.Contains(r.Stdout, "shards.parquet: ") || !strings.Contains(r.Stdout, "epochs.json") {
			t.Fatalf("another folder's: %d %s", r.Code, r.Stdout)
		}
	})
	t.Run("missing shard and unreadable manifest", func(t *testing.T) {
		dir := shuffleDemo(t, ds, 7)
		os.Remove(filepath.Join(dir, shard+".whisper.npy"))
		if r := verify(t, dir); r.Code != 1 || !strings.Contains(r.Stdout, shard+".whisper.npy: missing") {
			t.Fatalf("%d %s", r.Code, r.Stdout)
		}
		os.WriteFile(filepath.Join(dir, "epochs.json"), []byte("{"), 0o644)
		if r := verify(t, dir); r.Code != 2 {
			t.Fatalf("unreadable: %d %s %s", r.Code, r.Stdout, r.Stderr)
		}
	})
}

// TestKeptDTypeEpochs: --deep compares the shards of a --keep-dtype
// modality (float64 rows, not float16) with the dataset row for row; it
// used to read them as 2-byte rows and report every sample.
func TestKeptDTypeEpochs(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	clitest.CopyTree(t, filepath.Join("..", "..", "testdata", "demo"), src)
	var mods []convert.Modality
	for _, s := range []string{"motion=motion/{clip}.pkl:exp+pose", "emotion=emotion/{clip}.npy"} {
		m, err := convert.ParseModality(s)
		if err != nil {
			t.Fatal(err)
		}
		m.KeepDType = m.Name == "emotion"
		mods = append(mods, m)
	}
	ds := filepath.Join(t.TempDir(), "ds")
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: filepath.Join(src, "clips.txt"), Out: ds, Modalities: mods}); err != nil {
		t.Fatal(err)
	}
	ep := shuffleDemo(t, ds, 7)
	if r := verify(t, "--deep", ep); r.Code != 0 {
		t.Fatalf("intact epochs of a kept float64 modality: %d %s", r.Code, r.Stdout)
	}
	f := "epoch-0000/shard-00001.emotion.npy" // [4, 15, 8] float64
	flipByte(t, filepath.Join(ep, f), 4096+15*8*8+3*8+7)
	rewriteSums(t, ep, f)
	if r := verify(t, "--deep", ep); r.Code != 1 || !strings.Contains(r.Stdout, f+": clip") || !strings.Contains(r.Stdout, "sample 1 (clip") {
		t.Fatalf("a changed float64 value: %d %s", r.Code, r.Stdout)
	}
}

// TestSourcesStreamed (#26.8): a .npy source larger than an eighth of
// --mem is compared a piece at a time, and still finds drift (naming the
// piece's rows) and edited figures.
func TestSourcesStreamed(t *testing.T) {
	list := clitest.ClipSet(t, "f", array.Float32, 256, 100, 3000, 50) // 3 MiB in the middle
	m, err := convert.ParseModality("f=f/{clip}.npy")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ds")
	if _, err := convert.Run(context.Background(), convert.Options{ClipList: list, Out: out, Modalities: []convert.Modality{m}}); err != nil {
		t.Fatal(err)
	}
	if r := verify(t, "--sources", "--mem", "1MiB", out); r.Code != 0 {
		t.Fatalf("intact: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	clitest.EditClips(t, out, func(rows []manifests.ClipRow) { rows[1].Sources[0].Stats.MaxAbs = 3 })
	if r := verify(t, "--sources", "--mem", "1MiB", out); r.Code != 1 || !strings.Contains(r.Stdout, `clip "c1": modality "f": recorded nan 0, inf_in 0, overflow 0, underflow 0, max_abs 3`) {
		t.Fatalf("edited max_abs: %d %s", r.Code, r.Stdout)
	}
	p := filepath.Join(filepath.Dir(list), "f", "c1.npy")
	b, _ := os.ReadFile(p)
	b[4096+2500*256*4+2] ^= 0x10 // row 2500
	os.WriteFile(p, b, 0o644)
	r := verify(t, "--sources", "--mem", "1MiB", out)
	if r.Code != 1 || !strings.Contains(r.Stdout, `c1.npy: clip "c1": content drift: the converted source differs from f.npy rows 100..3100 (in rows 2148..3100)`) {
		t.Fatalf("drift: %d %s", r.Code, r.Stdout)
	}
	if r := verify(t, "--sources", "--mem", "0", out); r.Code != 2 || !strings.Contains(r.Stderr, "--mem") {
		t.Fatalf("--mem 0: %d %s", r.Code, r.Stderr)
	}
}
