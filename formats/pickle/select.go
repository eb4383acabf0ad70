// Select: arrays picked out of a decoded pickle by key path.

package pickle

import (
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"

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
	a, err := array.ConcatLastAxis(parts)
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
		var items []any
		if l, ok := c.(*types.List); ok {
			items = *l
		} else {
			items = *c.(*types.Tuple)
		}
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
		hint := ""
		if keys := topKeys(v); keys != "" {
			hint = "; select one with :KEY, keys: " + keys
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
