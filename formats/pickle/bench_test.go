package pickle_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clipshard/clipshard/formats/pickle"
	"github.com/clipshard/clipshard/internal/numpytest"
)

// BenchmarkDecodeFile decodes a 32 MiB motion-style pickle (dict of float32
// arrays) written by real numpy, from the page cache.
func BenchmarkDecodeFile(b *testing.B) {
	for _, proto := range []string{"2", "4", "5"} {
		b.Run("protocol"+proto, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "motion.pkl")
			numpytest.Run(b, "-c", `
import sys, pickle, numpy as np
rng = np.random.default_rng(1)
d = {"exp": rng.standard_normal((8192, 900), dtype=np.float32),
     "pose": rng.standard_normal((8192, 124), dtype=np.float32), "fps": 30}
open(sys.argv[1], "wb").write(pickle.dumps(d, protocol=int(sys.argv[2])))`, path, proto)
			st, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(st.Size())
			for b.Loop() {
				obj, err := pickle.DecodeFile(path)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := pickle.Select(obj, "exp"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
