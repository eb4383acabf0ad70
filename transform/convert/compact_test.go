package convert

import (
	"bytes"
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

// TestCompactStreamed: convert --compact copies the rows of the clips it
// keeps a piece at a time, as it copies a clip of gigabytes (here every
// clip, 300 bytes a piece), each piece checked: the one segment it makes
// holds, modality by modality, the bytes of a full convert's blob.
func TestCompactStreamed(t *testing.T) {
	defer func(a, b int64) { minStreamBytes, pieceBytes = a, b }(minStreamBytes, pieceBytes)
	src := demoCopy(t, "", "")
	all, err := os.ReadFile(filepath.Join(src, "clips.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range strings.Split(string(all), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			ids = append(ids, l)
		}
	}
	list := func(name string, ids []string) string {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(strings.Join(ids, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first, whole := list("first.txt", ids[:7]), list("whole.txt", ids)
	out, full := filepath.Join(t.TempDir(), "ds"), filepath.Join(t.TempDir(), "full")
	run := func(clips, out string, segments, compact bool) *Result {
		t.Helper()
		o := demoOptions(t, src, out)
		o.ClipList, o.Segments, o.Compact = clips, segments, compact
		o.Budget = 1 // (the streaming bound is then minStreamBytes)
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	minStreamBytes, pieceBytes = 1<<40, 4<<20
	run(first, out, false, false)
	run(whole, out, true, false)
	run(whole, full, false, false)
	minStreamBytes, pieceBytes = 0, 300
	if res := run(whole, out, true, true); !res.Compacted || res.Reused != len(ids) {
		t.Fatalf("compacted %v: %d clips copied; want all %d", res.Compacted, res.Reused, len(ids))
	}
	d, err := manifests.LoadDataset(out)
	if err != nil {
		t.Fatal(err)
	}
	f, err := manifests.LoadDataset(full)
	if err != nil {
		t.Fatal(err)
	}
	var seg string
	for _, m := range d.Modalities {
		bl := m.BlobList()
		if len(bl) != 1 || (seg != "" && path.Dir(bl[0].File) != seg) {
			t.Fatalf("modality %s in %+v, want one blob of the one new segment", m.Name, bl)
		}
		seg = path.Dir(bl[0].File)
		got, err := os.ReadFile(filepath.Join(out, filepath.FromSlash(bl[0].File)))
		if err != nil {
			t.Fatal(err)
		}
		fm := f.Modality(m.Name)
		want, err := os.ReadFile(filepath.Join(full, fm.File))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[bl[0].DataOffset:], want[fm.DataOffset:]) {
			t.Fatalf("modality %s: the compacted rows differ from a full convert's", m.Name)
		}
	}
	if r, err := manifests.VerifyDataset(out, manifests.VerifyOptions{Deep: true}); err != nil || !r.OK() {
		t.Fatalf("verify: %v %v", err, r.Problems)
	}
}
