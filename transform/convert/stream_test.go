package convert

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/clitest"
)

// fortranCopy rewrites the 2-d .npy at path in Fortran order (same values).
func fortranCopy(t *testing.T, path string) {
	t.Helper()
	a, err := npy.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rows, cols, size := a.Shape[0], a.Shape[1], a.DType.Size
	hdr, err := npy.EncodeHeader(a.DType.Descr(), true, a.Shape, 128)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, len(a.Data))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			copy(data[(c*rows+r)*size:], a.Data[(r*cols+c)*size:(r*cols+c+1)*size])
		}
	}
	if err := os.WriteFile(path, append(hdr, data...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStreamedSameBytes: .npy sources converted a piece at a time (forced
// here for every clip, in pieces of a few rows) give the bytes, stats and
// errors of sources loaded whole: little- and big-endian, float16/32/64,
// Fortran order, --keep-dtype, --align trim.
func TestStreamedSameBytes(t *testing.T) {
	defer func(a, b int64) { minStreamBytes, pieceBytes = a, b }(minStreamBytes, pieceBytes)
	cases := []struct {
		name, broken, dst string
		edit              func(o *Options)
		wantErr           string
	}{
		{name: "demo"},
		{name: "keep dtype", edit: func(o *Options) { o.Modalities[2].KeepDType = true }},
		{name: "fortran whisper", dst: "fortran"},
		{name: "trim", broken: "short_emotion.npy", dst: "emotion/clip003.npy", edit: func(o *Options) { o.Align = "trim" }},
		{name: "nan", broken: "nan_emotion.npy", dst: "emotion/clip003.npy", wantErr: "first at row 5"},
		{name: "overflow", broken: "overflow_emotion.npy", dst: "emotion/clip003.npy", wantErr: "first at row 2"},
		{name: "nan allowed", broken: "nan_emotion.npy", dst: "emotion/clip003.npy", edit: func(o *Options) { o.AllowNonFinite = true }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			broken := c.broken
			src := demoCopy(t, broken, c.dst)
			if c.dst == "fortran" {
				fortranCopy(t, filepath.Join(src, "whisper", "clip003.npy"))
				fortranCopy(t, filepath.Join(src, "whisper", "clip007.npy"))
			}
			run := func(stream bool) (map[string][]byte, error) {
				if stream {
					minStreamBytes, pieceBytes = 0, 300 // a few rows a piece
				} else {
					minStreamBytes, pieceBytes = 1<<40, 4<<20
				}
				out := filepath.Join(t.TempDir(), "ds")
				o := demoOptions(t, src, out)
				o.Budget = 1
				if c.edit != nil {
					c.edit(&o)
				}
				if _, err := Run(context.Background(), o); err != nil {
					return nil, err
				}
				return clitest.Tree(t, out), nil
			}
			whole, err1 := run(false)
			pieces, err2 := run(true)
			if c.wantErr != "" {
				// (up to where each names its own staging folder)
				cut := func(err error) string { s, _, _ := strings.Cut(err.Error(), " (the clips done"); return s }
				if err1 == nil || err2 == nil || cut(err1) != cut(err2) || !strings.Contains(err2.Error(), c.wantErr) {
					t.Fatalf("errors: whole %v, pieces %v; want both %q", err1, err2, c.wantErr)
				}
				return
			}
			if err1 != nil || err2 != nil {
				t.Fatalf("whole: %v, pieces: %v", err1, err2)
			}
			clitest.SameTree(t, whole, pieces, "streamed vs loaded")
		})
	}
}
