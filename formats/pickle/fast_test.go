package pickle

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
)

// fixtureFiles returns the pickle fixtures made by testdata/formats/gen.py
// with numpy 1.x and 2.x (also the fuzz seeds, through SeedFiles in
// export_test.go).
func fixtureFiles(tb testing.TB) map[string][]byte {
	paths, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "formats", "pickle", "*.pkl"))
	np2, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "formats-numpy2", "pickle", "*.pkl"))
	paths = append(paths, np2...)
	if len(paths) == 0 {
		tb.Fatal("no pickle fixtures")
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		out[p] = b
	}
	return out
}

// sameAsGopickle checks that where fastDecode succeeds, it built what
// gopickle builds from the same bytes. It reports whether it did.
func sameAsGopickle(t *testing.T, name string, data []byte) bool {
	if scan(bytes.NewReader(data), int64(len(data)), data) != nil {
		return false
	}
	fast, ok := fastDecode(data, false)
	if !ok {
		return false
	}
	// Aliasing data (DecodeIn) builds the same objects.
	if aliased, ok := fastDecode(bytes.Clone(data), true); !ok || !sameObject(fast, aliased) {
		t.Fatalf("%s: the fast path aliasing its buffer built otherwise (ok %v)", name, ok)
	}
	slow, err := slowDecode(bytes.NewReader(data), int64(len(data)), nil)
	if err != nil {
		t.Fatalf("%s: fast path decoded what gopickle refuses (%v)", name, err)
	}
	if !sameObject(fast, slow) {
		t.Fatalf("%s: fast path and gopickle differ:\nfast %#v\nslow %#v", name, fast, slow)
	}
	return true
}

// sameObject is reflect.DeepEqual, except that floats are compared by
// their bits (NaN equals NaN). Containers may hold themselves (a pickle can
// append a list to itself through the memo): a pair of containers already
// being compared is taken as equal, as reflect.DeepEqual does.
func sameObject(a, b any) bool { return sameObj(a, b, map[[2]any]bool{}) }

func sameObj(a, b any, seen map[[2]any]bool) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case *types.Dict, *types.Tuple, *types.List:
		if seen[[2]any{a, b}] {
			return true
		}
		seen[[2]any{a, b}] = true
	}
	switch x := a.(type) {
	case *types.Dict:
		y, ok := b.(*types.Dict)
		if !ok || len(*x) != len(*y) {
			return false
		}
		for i := range *x {
			if !sameObj((*x)[i].Key, (*y)[i].Key, seen) || !sameObj((*x)[i].Value, (*y)[i].Value, seen) {
				return false
			}
		}
		return true
	case *types.Tuple:
		y, ok := b.(*types.Tuple)
		return ok && sameSlice(*x, *y, seen)
	case *types.List:
		y, ok := b.(*types.List)
		return ok && sameSlice(*x, *y, seen)
	case *Scalar:
		y, ok := b.(*Scalar)
		return ok && reflect.DeepEqual(x.DType, y.DType) && sameObj(x.Value, y.Value, seen)
	}
	return reflect.DeepEqual(a, b)
}

func sameSlice(a, b []any, seen map[[2]any]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameObj(a[i], b[i], seen) {
			return false
		}
	}
	return true
}

// TestFastMatchesGopickle runs both decoders on every fixture (protocols
// 2-5, numpy 1.x and 2.x names, byte orders, Fortran order, scalars,
// nested containers, hostile files).
func TestFastMatchesGopickle(t *testing.T) {
	fast := 0
	files := fixtureFiles(t)
	for name, b := range files {
		if sameAsGopickle(t, name, b) {
			fast++
		}
	}
	t.Logf("%d of %d fixtures took the fast path", fast, len(files))
	if fast < len(files)/2 {
		t.Fatalf("only %d of %d fixtures took the fast path", fast, len(files))
	}
}

// FuzzFast: on any input that passes the scan, the fast path either gives
// up or builds exactly what gopickle builds; it never panics.
func FuzzFast(f *testing.F) {
	for _, b := range fixtureFiles(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sameAsGopickle(t, "input", data)
	})
}
