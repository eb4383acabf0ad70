package convert

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestAppendRecord: the hand-written encoding of a converted clip's
// journal record is byte-identical to encoding/json's, for plain and
// awkward strings (quotes, controls, non-ASCII, invalid UTF-8, HTML
// characters), zero and non-zero optional fields, nil and empty shapes.
func TestAppendRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	strs := []string{"", "clip000", `a"b`, `back\slash`, "tab\there", "é-ü", "\xff\xfe", "<&>", "new\nline", "/data/x/{clip}.npy"}
	pick := func() string { return strs[rng.IntN(len(strs))] }
	for i := range 2000 {
		r := journalRecord{Index: i, Clip: pick(), Length: int64(rng.IntN(3)) * 1000, Trimmed: int64(rng.IntN(2)) * 7}
		for range rng.IntN(4) {
			m := journalMod{XXH64: "00ff00ff00ff00ff", Path: pick(), Size: rng.Int64(), MtimeNS: -rng.Int64N(5), Rows: int64(rng.IntN(100)),
				DType: "<f2", SourceDescr: pick(), Stats: [5]string{"0", "1", pick(), "3", "1e+300"}, Label: pick()}
			switch rng.IntN(3) {
			case 0:
				m.FrameShape = []int{}
			case 1:
				m.FrameShape = []int{64, 3}
			}
			r.Mods = append(r.Mods, m)
		}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRecord(nil, &r); !bytes.Equal(got, want) {
			t.Fatalf("record %d:\n got %s\nwant %s", i, got, want)
		}
	}
}
