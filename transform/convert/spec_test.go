package convert_test

import (
	"errors"
	"testing"

	"github.com/clipshard/clipshard/transform/convert"
)

func TestParseModality(t *testing.T) {
	for _, c := range []struct {
		in   string
		want convert.Modality
	}{
		{"motion=motion/{clip}.pkl:exp+pose", convert.Modality{Name: "motion", Rate: 1, Template: "motion/{clip}.pkl", Keys: "exp+pose"}},
		{"whisper@2=/data/w/{clip}.npy", convert.Modality{Name: "whisper", Rate: 2, Template: "/data/w/{clip}.npy"}},
		{"m=a:b/{clip}.PICKLE:params/exp", convert.Modality{Name: "m", Rate: 1, Template: "a:b/{clip}.PICKLE", Keys: "params/exp"}},
		{"bare=x/{clip}.pkl", convert.Modality{Name: "bare", Rate: 1, Template: "x/{clip}.pkl"}},
		{"shape@clip=m/{clip}.pkl:shape", convert.Modality{Name: "shape", Rate: 1, PerClip: true, Template: "m/{clip}.pkl", Keys: "shape"}},
		{"spk@clip=spk/{clip}.npy", convert.Modality{Name: "spk", Rate: 1, PerClip: true, Template: "spk/{clip}.npy"}},
	} {
		got, err := convert.ParseModality(c.in)
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v", c.in, got, err)
		}
	}
	for _, bad := range []string{"", "m", "=a/{clip}.npy", "m=a.npy", "m@0=a/{clip}.npy", "m@x=a/{clip}.npy",
		"index=a/{clip}.npy", "a b=a/{clip}.npy", "m=a/{clip}.txt", "m=a/{clip}.pkl:", "m@clips=a/{clip}.npy", "m@CLIP=a/{clip}.npy", "@clip=a/{clip}.npy"} {
		if _, err := convert.ParseModality(bad); !errors.Is(err, convert.ErrUsage) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
	if p := (convert.Modality{Template: "w/{clip}/{clip}.npy"}).Path("/root", "c1"); p != "/root/w/c1/c1.npy" {
		t.Errorf("Path: %s", p)
	}
}
