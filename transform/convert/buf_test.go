package convert

import "testing"

// TestSizeClass: a class is the smallest whose size holds n, and at most
// 26 % larger than n (above 64 bytes); a buffer handed back goes to a
// class getBuf of its size takes from.
func TestSizeClass(t *testing.T) {
	for n := 0; n < 1<<34; n += 1 + n/1000 {
		c := sizeClass(n)
		if classSize(c) < n || (c > 0 && classSize(c-1) >= n) || (n > 64 && float64(classSize(c)) > 1.26*float64(n)) {
			t.Fatalf("n %d: class %d of size %d (the one below: %d)", n, c, classSize(c), classSize(c-1))
		}
	}
	for _, n := range []int{64, 100, 4096, 5000, 1 << 20, 3<<20 + 7} {
		b := getBuf(n)
		if len(*b) != n || cap(*b) < n {
			t.Fatalf("getBuf(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		putBuf(b)
		if c := getBuf(n); cap(*c) < n {
			t.Fatalf("getBuf(%d) after putBuf: cap %d", n, cap(*c))
		}
	}
}
