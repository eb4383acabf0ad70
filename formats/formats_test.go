package formats_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats"
	"github.com/clipshard/clipshard/internal/numpytest"
)

const fixtures = "../testdata/formats"

type fixtureCase struct {
	File        string `json:"file"`
	Keys        string `json:"keys"`
	Expect      string `json:"expect"`
	DType       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	SourceDescr string `json:"source_descr"`
	Fortran     bool   `json:"fortran"`
	Error       string `json:"error"`
}

func loadCases(t *testing.T, dir string) []fixtureCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []fixtureCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 100 {
		t.Fatalf("only %d cases in %s", len(doc.Cases), dir)
	}
	return doc.Cases
}

// runCases checks every fixture case of dir: good files decode to exactly
// numpy's bytes, shape and dtype; broken ones fail naming the file and the
// reason.
func runCases(t *testing.T, dir string) {
	for _, c := range loadCases(t, dir) {
		t.Run(c.File+":"+c.Keys, func(t *testing.T) {
			path := filepath.Join(dir, c.File)
			a, err := formats.Load(path, c.Keys)
			// Read into buffers of the caller's (filled with garbage; or
			// too small, and grown), the same array or error.
			for _, part := range []int64{1, 2} {
				bufFor := func(n int64) *[]byte {
					b := bytes.Repeat([]byte{0xa5}, int(n/part))
					return &b
				}
				b, _, rows, err2 := formats.LoadOrRows(nil, path, c.Keys, bufFor, -1)
				if rows != nil || (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() ||
					err == nil && (a.String() != b.String() || a.SourceDescr != b.SourceDescr || !bytes.Equal(a.Data, b.Data)) {
					t.Fatalf("LoadOrRows: %v %v %v; Load: %v %v", b, rows, err2, a, err)
				}
			}
			if f, _ := formats.FormatOf(path); f == formats.NPY && c.Error == "" {
				// Above 0 bytes: open as rows, the array described alike.
				b, info, rows, err := formats.LoadOrRows(nil, path, "", nil, 0)
				if err != nil || b != nil || info != nil || rows == nil {
					t.Fatalf("LoadOrRows above 0: %v %v %v %v", b, info, rows, err)
				}
				if r := rows.Array(); r.DType != a.DType || !reflect.DeepEqual(r.Shape, a.Shape) {
					t.Fatalf("LoadOrRows above 0: %v, Load %v", r, a)
				}
				rows.Close()
			}
			if c.Error != "" {
				if err == nil {
					t.Fatalf("decoded %v, want error containing %q", a, c.Error)
				}
				msg := err.Error()
				if !strings.Contains(msg, c.Error) || !strings.Contains(msg, path) {
					t.Fatalf("error %q: want it to name %q and contain %q", msg, path, c.Error)
				}
				if strings.Contains(msg, "\n") {
					t.Fatalf("error spans lines: %q", msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(dir, c.Expect))
			if err != nil {
				t.Fatal(err)
			}
			if a.DType.String() != c.DType || !reflect.DeepEqual(append([]int{}, a.Shape...), append([]int{}, c.Shape...)) {
				t.Fatalf("got %s%v, numpy says %s%v", a.DType, a.Shape, c.DType, c.Shape)
			}
			if !strings.Contains(c.Keys, "+") && (a.SourceDescr != c.SourceDescr || a.SourceFortran != c.Fortran) {
				t.Errorf("source %s fortran=%v, numpy says %s fortran=%v", a.SourceDescr, a.SourceFortran, c.SourceDescr, c.Fortran)
			}
			if !bytes.Equal(a.Data, want) {
				t.Fatalf("data differs from numpy's .tobytes() (%d vs %d bytes)", len(a.Data), len(want))
			}
		})
	}
}

func TestFixtures(t *testing.T) { runCases(t, fixtures) }

// TestFixturesNumpy2 (#27.4): the same table over the fixtures that the
// real numpy 2.x wrote (testdata/formats-numpy2, made by
// testdata/formats/gen_numpy2.sh): its pickles name numpy._core.
func TestFixturesNumpy2(t *testing.T) {
	dir := "../testdata/formats-numpy2"
	b, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Numpy string `json:"numpy"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || !strings.HasPrefix(doc.Numpy, "2.") {
		t.Fatalf("%s/cases.json: made with numpy %q (%v), want 2.x", dir, doc.Numpy, err)
	}
	pkls, _ := filepath.Glob(filepath.Join(dir, "pickle", "*.pkl"))
	native := 0
	for _, p := range pkls {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte("numpy.core.")) {
			t.Errorf("%s: names numpy.core, not numpy 2's numpy._core", p)
		}
		if bytes.Contains(data, []byte("numpy._core")) {
			native++
		}
	}
	if native < 20 {
		t.Fatalf("only %d of %d pickles in %s name numpy._core", native, len(pkls), dir)
	}
	runCases(t, dir)
}

// TestFixturesFromNumpy regenerates the fixtures with the numpy installed
// here and runs the same table over them, so the committed files cannot
// drift from what real numpy writes.
func TestFixturesFromNumpy(t *testing.T) {
	dir := t.TempDir()
	numpytest.Run(t, filepath.Join(fixtures, "gen.py"), dir)
	runCases(t, dir)
}

func TestUnknownExtension(t *testing.T) {
	_, err := formats.Load("clip.h5", "")
	if !errors.Is(err, formats.ErrUnknownFormat) || !strings.Contains(err.Error(), "clip.h5") {
		t.Fatalf("got %v", err)
	}
	_, err = formats.Load(filepath.Join(fixtures, "npy/f16.npy"), "exp")
	if err == nil || !strings.Contains(err.Error(), "holds one array") {
		t.Fatalf("keys on .npy: got %v", err)
	}
	_, err = formats.Load(filepath.Join(fixtures, "npy/missing.npy"), "")
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: got %v", err)
	}
}

// TestNotRegular: a FIFO, a directory or a missing file is an error naming
// the path, and opening a FIFO does not block (whole loads and the
// piece-at-a-time reader alike).
func TestNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "c.npy")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "d.pkl"), 0o755)
	for _, p := range []string{fifo, filepath.Join(dir, "d.pkl"), filepath.Join(dir, "missing.npy")} {
		done := make(chan error, 1)
		go func() { _, _, err := formats.LoadInto(p, "", nil); done <- err }()
		// The piece-at-a-time reader of large .npy sources too.
		go func() { _, err := formats.OpenNPYRows(nil, p); done <- err }()
		for range 2 {
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), p) {
					t.Errorf("%s: error %v, want one naming the path", p, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: LoadInto or OpenNPYRows blocked", p)
			}
		}
	}
}

// TestDirs loads and stats files of more folders than Dirs keeps open
// (the rest are opened by full path) and checks that errors still name
// the full path.
func TestDirs(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(fixtures, "npy", "f32_2d.npy"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var dirs formats.Dirs
	defer dirs.Close()
	// The files are written first and left alone for a quiet window: one
	// written just before its load is read twice, a quiet window apart.
	for i := range 70 {
		d := filepath.Join(root, fmt.Sprintf("d%02d", i))
		os.Mkdir(d, 0o755)
		if err := os.WriteFile(filepath.Join(d, "x.npy"), src, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Symlink("x.npy", filepath.Join(d, "link.npy"))
		if err := syscall.Mkfifo(filepath.Join(d, "fifo.npy"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(formats.QuietWindow + 50*time.Millisecond)
	for i := range 70 {
		d := filepath.Join(root, fmt.Sprintf("d%02d", i))
		p := filepath.Join(d, "x.npy")
		a, _, err := formats.LoadIntoDirs(&dirs, p, "", nil)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		b, _ := formats.Load(p, "")
		if !bytes.Equal(a.Data, b.Data) {
			t.Fatalf("%s: differs from Load", p)
		}
		missing := filepath.Join(d, "missing.npy")
		if _, _, err := formats.LoadIntoDirs(&dirs, missing, "", nil); err == nil || !strings.Contains(err.Error(), missing) {
			t.Fatalf("missing file: %v", err)
		}
		// LoadOrRows, from a kept folder or (past 64) by full path: a
		// file larger than above comes back as rows, one not larger is
		// read (a symbolic link followed); a folder or a FIFO is refused,
		// and nothing waits for a writer.
		for _, name := range []string{"x.npy", "link.npy"} {
			for _, above := range []int64{int64(len(src)) - 1, int64(len(src))} {
				a, _, rows, err := formats.LoadOrRows(&dirs, filepath.Join(d, name), "", nil, above)
				if err != nil || (rows != nil) != (above < int64(len(src))) || (a != nil) == (rows != nil) {
					t.Fatalf("%s above %d: %v %v %v", name, above, a, rows, err)
				}
				if rows != nil {
					rows.Close()
				}
			}
		}
		for _, name := range []string{".", "fifo.npy", "missing.npy"} {
			p := filepath.Join(d, name)
			if _, _, _, err := formats.LoadOrRows(&dirs, p, "", nil, 0); err == nil || !strings.Contains(err.Error(), p) {
				t.Fatalf("LoadOrRows %s: %v", name, err)
			}
		}
	}
	if _, _, err := formats.LoadIntoDirs(&dirs, filepath.Join(root, "nodir", "x.npy"), "", nil); err == nil || !strings.Contains(err.Error(), "nodir/x.npy") {
		t.Fatalf("missing folder: %v", err)
	}
}

// TestNPYRows: every readable .npy fixture (byte orders, Fortran order,
// 1-d to 3-d), read a few rows at a time, gives the bytes Load gives.
func TestNPYRows(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(fixtures, "npy", "*.npy"))
	read := 0
	for _, p := range paths {
		want, err := formats.Load(p, "")
		if err != nil || len(want.Shape) == 0 {
			continue
		}
		s, err := formats.OpenNPYRows(nil, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		a := s.Array()
		if a.DType != want.DType || !reflect.DeepEqual(a.Shape, want.Shape) || a.SourceDescr != want.SourceDescr {
			t.Errorf("%s: %v, Load says %v", p, a, want)
		}
		for _, step := range []int64{1, 2, 3, 1000} {
			var raw, dst []byte
			var got []byte
			rows := int64(want.Shape[0])
			for r := int64(0); r < rows; r += step {
				b, err := s.Read(r, min(rows, r+step), &raw, &dst)
				if err != nil {
					t.Fatalf("%s rows %d+%d: %v", p, r, step, err)
				}
				got = append(got, b...)
			}
			if !bytes.Equal(got, want.Data) {
				t.Errorf("%s, %d rows at a time: bytes differ from Load", p, step)
			}
		}
		s.Close()
		read++
	}
	if read < 8 {
		t.Fatalf("only %d fixtures read", read)
	}
}
