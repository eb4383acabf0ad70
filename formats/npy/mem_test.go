package npy_test

import "runtime"

// runtimeMem measures bytes allocated between start and since.
type runtimeMem struct{ before uint64 }

func (m *runtimeMem) start() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.before = s.TotalAlloc
}

func (m *runtimeMem) since() uint64 {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	return s.TotalAlloc - m.before
}
