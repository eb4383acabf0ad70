package f16

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestAudit16AVX2: the AVX2 screen agrees with the word-at-a-time one
// (and so with the value-by-value audit, TestAudit16) on every float16
// bit pattern in every lane position, and on random blocks; Audit16 gives
// the same stats with the kernel and without.
func TestAudit16AVX2(t *testing.T) {
	if !useAsm {
		t.Skip("the CPU has no AVX2/F16C: the portable path is the one TestAudit16 checks")
	}
	r := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 64)
	for v := 0; v < 1<<16; v++ {
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], uint16(r.IntN(0x7c00))|uint16(r.IntN(2))<<15)
		}
		binary.LittleEndian.PutUint16(b[2*(v%32):], uint16(v))
		m1, ok1 := audit16Words(b)
		m2, special := audit16AVX2(&b[0], len(b))
		if ok1 != !special || (ok1 && m1 != m2) {
			t.Fatalf("value %#04x at lane %d: words (%#x, %v), AVX2 (%#x, special %v)", v, v%32, m1, ok1, m2, special)
		}
	}
	for n := 0; n < 2000; n++ {
		b := make([]byte, 32*(1+r.IntN(100)))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if n%2 == 0 {
			for i := 1; i < len(b); i += 2 {
				b[i] &= 0x7b | 0x80
			}
		}
		m1, ok1 := audit16Words(b)
		m2, special := audit16AVX2(&b[0], len(b))
		if ok1 != !special || (ok1 && m1 != m2) {
			t.Fatalf("%d bytes: words (%#x, %v), AVX2 (%#x, special %v)", len(b), m1, ok1, m2, special)
		}
	}
	// Audit16 whole, with the kernel and without, on blocks with and
	// without NaN/Inf, of every length parity.
	defer func() { useAsm = true }()
	for n := 0; n < 300; n++ {
		b := make([]byte, r.IntN(20000))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if n%3 != 0 {
			for i := 1; i < len(b); i += 2 {
				b[i] &= 0x7b | 0x80
			}
		}
		var on, off Stats
		useAsm = true
		Audit16(b, &on)
		useAsm = false
		Audit16(b, &off)
		if on != off {
			t.Fatalf("%d bytes: with AVX2 %+v, without %+v", len(b), on, off)
		}
	}
}
