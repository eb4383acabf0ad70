package npy_test

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/clipshard/clipshard/formats/npy"
)

// headerFile is a version 2.0 .npy file whose header dict is about n
// bytes of the given filler.
func headerFile(n int, fill func(n int) string) []byte {
	dict := "{'descr': '<f2', 'fortran_order': False, 'shape': (" + fill(n) + "), }"
	for (12+len(dict)+1)%64 != 0 {
		dict += " "
	}
	dict += "\n"
	b := []byte("\x93NUMPY\x02\x00")
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dict)))
	b = append(b, dict...)
	return append(b, 0, 0) // one float16 value
}

// TestHeaderScalesLinearly: headers 4x longer parse in at most 6x the time
// (plus slack), whatever fills them: many dimensions, long numbers,
// spaces, nested parentheses.
func TestHeaderScalesLinearly(t *testing.T) {
	fills := map[string]func(n int) string{
		"ones":     func(n int) string { return strings.Repeat("1, ", n/3) },
		"spaces":   func(n int) string { return "1," + strings.Repeat(" ", n) },
		"long int": func(n int) string { return "1" + strings.Repeat("0", n) + "," },
		"parens":   func(n int) string { return strings.Repeat("(", n/2) + strings.Repeat(")", n/2) },
	}
	parse := func(b []byte) time.Duration {
		best := time.Duration(1 << 62)
		for range 5 {
			runtime.GC()
			t0 := time.Now()
			npy.Read(bytes.NewReader(b), int64(len(b)))
			best = min(best, time.Since(t0))
		}
		return best
	}
	const n = 12 << 10 // 4n stays under MaxHeaderLen
	for name, fill := range fills {
		small, big := headerFile(n, fill), headerFile(4*n, fill)
		ts, tb := parse(small), parse(big)
		for try := 0; try < 3 && tb > 6*ts+2*time.Millisecond; try++ {
			ts, tb = parse(small), parse(big)
		}
		if tb > 6*ts+2*time.Millisecond {
			t.Errorf("%s: %d bytes %v, %d bytes %v (more than 6x)", name, len(small), ts, len(big), tb)
		}
	}
}
