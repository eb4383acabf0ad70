//go:build !amd64

package f16

const useAsm = false

func fromFloat32Asm(dst []uint16, src []float32, st *Stats) int { return 0 }

func audit16Block(b []byte) (uint16, bool) { return audit16Words(b) }
