//go:build !amd64

package f16

const useAsm = false

func fromFloat32Asm(dst []uint16, src []float32, st *Stats) int { return 0 }
