package units

import "testing"

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536: "1.5KiB", 1 << 20: "1.0MiB",
		5<<30 + 1<<29: "5.5GiB", 128 << 30: "128.0GiB", -1: "-1B"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
