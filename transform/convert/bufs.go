// Buffers of converted clips, pooled by power-of-two size class.

package convert

import (
	"math/bits"

	"sync"
)

// bufPools recycle byte buffers between clips, by size class: class c
// holds buffers of a capacity of at least classSize(c), so that a buffer
// taken for n bytes is large enough without a new allocation (whose first
// touch costs a page fault and the zeroing of every 4 KiB: 10 % of a
// convert's cycles when one pool handed out buffers of any size).
var bufPools [64 * 4]sync.Pool

// sizeClass returns the smallest class whose size is >= n: four classes
// per power of two (a buffer is at most 19 % larger than asked), and
// classSize its size.
func sizeClass(n int) int {
	if n <= 64 {
		return 0
	}
	e := bits.Len(uint(n-1)) - 1 // 2^e < n <= 2^(e+1)
	q := (n - 1 - 1<<e) >> (e - 2)
	return 4*e + q + 1 - 4*6 + 4 // class 0 is 64 bytes
}

func classSize(c int) int {
	if c == 0 {
		return 64
	}
	c += 4*6 - 4 - 1
	e, q := c/4, c%4
	return 1<<e + (q+1)<<(e-2)
}

func getBuf(n int) *[]byte {
	c := sizeClass(n)
	b, _ := bufPools[c].Get().(*[]byte)
	if b == nil {
		b = new([]byte)
		*b = make([]byte, n, classSize(c))
	}
	*b = (*b)[:n]
	return b
}

// putBuf returns b to the class its capacity fills (a buffer grown by a
// reader goes to its new class).
func putBuf(b *[]byte) {
	if b == nil || cap(*b) < 64 {
		return
	}
	c := sizeClass(cap(*b))
	if classSize(c) > cap(*b) {
		c--
	}
	bufPools[c].Put(b)
}
