// Select: arrays picked out of a decoded pickle by key path.

package pickle

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nlpodyssey/gopickle/types"

	"github.com/clipshard/clipshard/formats/array"
)

// Select picks an array out of a decoded pickle by a key expression:
//
//	""            the pickle holds a bare ndarray
//	"exp"         dict key
//	"params/exp"  nested dict keys (a list or tuple may be indexed: "clips/0")
//	"exp+pose"    several paths, concatenated along the last axis in order
//
// Errors wrap ErrKey, name the missing key and list the keys that exist.
func Select(root any, keys string) (*array.Array, error) {
	return SelectIn(root, keys, nil)
}

// SelectIn is Select with the array concatenated from several paths made
// in a buffer of alloc (nil: a new slice), as array.ConcatLastAxisIn.
func SelectIn(root any, keys string, alloc func(n int) []byte) (*array.Array, error) {
	if keys == "" {
		return asArray(root, "")
	}
	var parts []*array.Array
	for _, path := range strings.Split(keys, "+") {
		a, err := selectPath(root, path)
		if err != nil {
			return nil, err
		}
		parts = append(parts, a)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	a, err := array.ConcatLastAxisIn(parts, alloc)
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", keys, err)
	}
	return a, nil
}

func selectPath(root any, path string) (*array.Array, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: empty key in key expression", ErrKey)
	}
	cur := root
	steps := strings.Split(path, "/")
	for i, k := range steps {
		where := strings.Join(steps[:i], "/")
		next, err := child(cur, k, where)
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return asArray(cur, path)
}

func child(v any, key, where string) (any, error) {
	in := "the top level"
	if where != "" {
		in = strconv.Quote(where)
	}
	switch c := v.(type) {
	case *types.Dict:
		for _, e := range *c {
			if s, ok := e.Key.(string); ok && s == key {
				return e.Value, nil
			}
		}
		keys := make([]any, len(*c))
		for i, e := range *c {
			keys[i] = e.Key
		}
		return nil, fmt.Errorf("%w %q not found in %s; keys there: %s", ErrKey, key, in, listKeys(keys))
	case *types.OrderedDict:
		if val, ok := c.Map[key]; ok {
			return val.Value, nil
		}
		keys := make([]any, 0, c.List.Len())
		for e := c.List.Front(); e != nil; e = e.Next() {
			keys = append(keys, e.Value.(*types.OrderedDictEntry).Key)
		}
		return nil, fmt.Errorf("%w %q not found in %s; keys there: %s", ErrKey, key, in, listKeys(keys))
	case *types.List, *types.Tuple:
		items := seqItems(c)
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(items) {
			return nil, fmt.Errorf("%w %q: %s is a %s of %d items; use an index 0..%d", ErrKey, key, in, typeName(v), len(items), len(items)-1)
		}
		return items[i], nil
	}
	return nil, fmt.Errorf("%w %q: %s is a %s, not a dict", ErrKey, key, in, typeName(v))
}

func asArray(v any, path string) (*array.Array, error) {
	what := "the pickle"
	if path != "" {
		what = fmt.Sprintf("key %q", path)
	}
	nd, ok := v.(*NDArray)
	if !ok {
		if a, ok, err := valueArray(v); ok {
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			return a, nil
		}
		hint := ""
		if keys := topKeys(v); keys != "" {
			hint = "; select one with :KEY, keys: " + keys
		}
		if _, ok := v.(string); ok {
			hint = "; a string per clip (a speaker, a class) is a label: convert --label NAME=TEMPLATE.pkl:KEY codes it"
		}
		return nil, fmt.Errorf("%w: %s holds a %s, not a numpy array%s", ErrKey, what, typeName(v), hint)
	}
	a, err := nd.Array()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return a, nil
}

func topKeys(v any) string {
	switch c := v.(type) {
	case *types.Dict:
		keys := make([]any, len(*c))
		for i, e := range *c {
			keys[i] = e.Key
		}
		return listKeys(keys)
	case *types.OrderedDict:
		keys := make([]any, 0, c.List.Len())
		for e := c.List.Front(); e != nil; e = e.Next() {
			keys = append(keys, e.Value.(*types.OrderedDictEntry).Key)
		}
		return listKeys(keys)
	}
	return ""
}

// listKeys formats dict keys for an error message, sorted, at most 20.
func listKeys(keys []any) string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		switch kk := k.(type) {
		case string:
			out = append(out, strconv.Quote(kk))
		case int:
			out = append(out, strconv.Itoa(kk))
		case *big.Int:
			out = append(out, "<big int>")
		default:
			out = append(out, "<"+typeName(k)+">")
		}
	}
	sort.Strings(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("... (%d more)", len(out)-20))
	}
	if len(out) == 0 {
		return "(none)"
	}
	return strings.Join(out, ", ")
}

// valueArray turns a number into a 0-d array, and a flat list or tuple of
// numbers into a 1-D one (ok false for anything else): a numpy scalar
// keeps its dtype; a Python float is float64, an int int64 (an int
// beyond int64 is an error), a bool bool; a list of floats (or of floats
// and ints) is float64, of ints int64, of bools bool. Per-clip values
// (fps, a speaker id, identity coefficients) are often stored so.
func valueArray(v any) (*array.Array, bool, error) {
	switch x := v.(type) {
	case *Scalar:
		if x.DType.err != nil {
			return nil, true, x.DType.err
		}
		data, ok := toBytes(x.Value)
		if !ok {
			return nil, true, fmt.Errorf("%w: numpy scalar data is %s, not bytes", ErrFormat, typeName(x.Value))
		}
		a, err := array.NewFrom(x.DType.Descr(), []int{}, false, data)
		return a, true, err
	case bool, int, *big.Int, float64:
		a, err := numbersArray([]any{x}, []int{})
		return a, true, err
	case *types.List, *types.Tuple:
		items := seqItems(x)
		if len(items) == 0 {
			return nil, false, nil
		}
		for _, it := range items {
			switch it.(type) {
			case bool, int, *big.Int, float64:
			default:
				return nil, false, nil
			}
		}
		a, err := numbersArray(items, []int{len(items)})
		return a, true, err
	}
	return nil, false, nil
}

// numbersArray packs Python numbers into an array of shape: bool if all
// are bools, int64 if all are ints (or bools), float64 otherwise.
func numbersArray(items []any, shape []int) (*array.Array, error) {
	kind := "|b1"
	for _, it := range items {
		switch it.(type) {
		case float64:
			kind = "<f8"
		case int, *big.Int:
			if kind == "|b1" {
				kind = "<i8"
			}
		}
	}
	size := 8
	if kind == "|b1" {
		size = 1
	}
	data := make([]byte, 0, size*len(items))
	for _, it := range items {
		var f float64
		var i int64
		switch n := it.(type) {
		case bool:
			if n {
				f, i = 1, 1
			}
		case int:
			f, i = float64(n), int64(n)
		case *big.Int:
			if !n.IsInt64() {
				return nil, fmt.Errorf("%w: int %s does not fit int64", array.ErrDType, n)
			}
			i = n.Int64()
			f, _ = new(big.Float).SetInt(n).Float64()
		case float64:
			f = n
		}
		switch kind {
		case "<f8":
			data = binary.LittleEndian.AppendUint64(data, math.Float64bits(f))
		case "<i8":
			data = binary.LittleEndian.AppendUint64(data, uint64(i))
		default:
			data = append(data, byte(i))
		}
	}
	return array.New(kind, shape, false, data)
}

// seqItems returns the items of a list or tuple (nil for anything else).
func seqItems(v any) []any {
	switch c := v.(type) {
	case *types.List:
		return *c
	case *types.Tuple:
		return *c
	}
	return nil
}

// SelectLabel picks a label out of a decoded pickle by one key path (no
// "+"): a str, or an int (a Python int, a numpy integer scalar or 0-d
// array), written in decimal. Anything else is an error wrapping ErrKey
// that says what the key holds.
func SelectLabel(root any, path string) (string, error) {
	if path == "" || strings.Contains(path, "+") {
		return "", fmt.Errorf("%w %q: a label is at one key path (a/b/c), not several joined by +", ErrKey, path)
	}
	cur := root
	steps := strings.Split(path, "/")
	for i, k := range steps {
		next, err := child(cur, k, strings.Join(steps[:i], "/"))
		if err != nil {
			return "", err
		}
		cur = next
	}
	switch x := cur.(type) {
	case string:
		return x, nil
	case int:
		return strconv.Itoa(x), nil
	case *big.Int:
		return x.String(), nil
	case *Scalar:
		if s, ok := unicodeScalar(x); ok {
			return s, nil
		}
		a, err := asArray(x, path)
		if err == nil && len(a.Shape) == 0 && (a.DType.Kind == array.Int || a.DType.Kind == array.Uint) {
			if v, ok := intValue(a); ok {
				return v, nil
			}
		}
	case *NDArray:
		a, err := asArray(x, path)
		if err == nil && len(a.Shape) == 0 && (a.DType.Kind == array.Int || a.DType.Kind == array.Uint) {
			if v, ok := intValue(a); ok {
				return v, nil
			}
		}
	}
	return "", fmt.Errorf("%w %q holds a %s: a label is a str or an int", ErrKey, path, typeName(cur))
}

// intValue is the decimal text of a 0-d integer array's one value.
func intValue(a *array.Array) (string, bool) {
	if len(a.Data) != a.DType.Size || a.DType.Size > 8 {
		return "", false
	}
	var u uint64
	for i := a.DType.Size - 1; i >= 0; i-- {
		u = u<<8 | uint64(a.Data[i])
	}
	if a.DType.Kind == array.Uint {
		return strconv.FormatUint(u, 10), true
	}
	shift := 64 - 8*uint(a.DType.Size)
	return strconv.FormatInt(int64(u<<shift)>>shift, 10), true
}

// unicodeScalar is a numpy str_ scalar's text (dtype U<n>: UTF-32 code
// points, trailing NULs dropped), or false.
func unicodeScalar(x *Scalar) (string, bool) {
	if x.DType == nil || !strings.HasPrefix(x.DType.typestr, "U") {
		return "", false
	}
	data, ok := toBytes(x.Value)
	if !ok || len(data)%4 != 0 {
		return "", false
	}
	order := binary.ByteOrder(binary.LittleEndian)
	if x.DType.endian == ">" {
		order = binary.BigEndian
	}
	var b strings.Builder
	for i := 0; i < len(data); i += 4 {
		r := rune(order.Uint32(data[i:]))
		if r == 0 {
			break
		}
		if !utf8.ValidRune(r) {
			return "", false
		}
		b.WriteRune(r)
	}
	return b.String(), true
}
