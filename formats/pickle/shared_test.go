package pickle_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/clipshard/clipshard/formats/pickle"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// TestSharedPayload: arrays normalise big-endian and Fortran-ordered data
// in place, so arrays of a pickle that share one payload (a memoized bytes
// object, which numpy never writes but a pickle may hold) must not change
// each other: every one reads as numpy reads it, on every protocol.
func TestSharedPayload(t *testing.T) {
	out := numpytest.Run(t, "-c", `
import json, pickle, sys
import numpy as np
rebuild = np.zeros(1).__reduce__()[0]  # numpy(._)core.multiarray._reconstruct
payload = np.arange(6, dtype=">f4").tobytes()
class Shared:
    def __init__(self, dt, fortran): self.dt, self.fortran = dt, fortran
    def __reduce__(self):
        return (rebuild, (np.ndarray, (0,), b"b"), (1, (2, 3), np.dtype(self.dt), self.fortran, payload))
obj = {"c": Shared(">f4", False), "f": Shared(">f4", True), "f2": Shared(">f4", True), "u": Shared(">u4", False)}
res = {}
for proto in (2, 3, 4, 5):
    data = pickle.dumps(obj, protocol=proto)
    back = pickle.loads(data)
    res[proto] = {"pickle": data.hex(), "want": {k: np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes().hex() for k, v in back.items()}}
print(json.dumps(res))
`)
	var cases map[string]struct {
		Pickle string
		Want   map[string]string
	}
	if err := json.Unmarshal(out, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) != 4 {
		t.Fatalf("%d protocols", len(cases))
	}
	for proto, c := range cases {
		data, _ := hex.DecodeString(c.Pickle)
		obj, err := pickle.Decode(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("protocol %s: %v", proto, err)
		}
		for _, key := range []string{"c", "f", "f2", "u", "c"} {
			a, err := pickle.Select(obj, key)
			if err != nil {
				t.Fatalf("protocol %s, %s: %v", proto, key, err)
			}
			if got := hex.EncodeToString(a.Data); got != c.Want[key] {
				t.Errorf("protocol %s, %s: %s, numpy reads %s", proto, key, got, c.Want[key])
			}
		}
	}
}
