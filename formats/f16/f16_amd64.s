#include "textflag.h"

// Audit thresholds on |x| (float32 bits), broadcast into registers.
DATA absmask<>+0(SB)/4, $0x7fffffff
GLOBL absmask<>(SB), RODATA|NOPTR, $4
DATA thnan<>+0(SB)/4, $0x7f800000    // |x| >  this: NaN
GLOBL thnan<>(SB), RODATA|NOPTR, $4
DATA thnonfin<>+0(SB)/4, $0x7f7fffff // |x| >  this: NaN or Inf
GLOBL thnonfin<>(SB), RODATA|NOPTR, $4
DATA thbig<>+0(SB)/4, $0x477fefff    // |x| >  this: |x| >= 65520, rounds to Inf
GLOBL thbig<>(SB), RODATA|NOPTR, $4
DATA thsmall<>+0(SB)/4, $0x33000000  // |x| <= this (and > 0): rounds to 0
GLOBL thsmall<>(SB), RODATA|NOPTR, $4

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// func f32ToF16AVX2(dst *uint16, src *float32, n int, acc *accum)
// n is a positive multiple of 8. Each lane of the accumulators counts, for
// the inputs it saw: |x| > thbig, > thnonfin, > thnan, > 0, > thsmall, and
// keeps the largest finite |x| bits.
TEXT ·f32ToF16AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ acc+24(FP), DX

	VPBROADCASTD absmask<>(SB), Y15
	VPBROADCASTD thnan<>(SB), Y14
	VPBROADCASTD thnonfin<>(SB), Y13
	VPBROADCASTD thbig<>(SB), Y12
	VPBROADCASTD thsmall<>(SB), Y11
	VPXOR Y10, Y10, Y10 // count |x| > thbig
	VPXOR Y9, Y9, Y9    // count |x| > thnonfin
	VPXOR Y8, Y8, Y8    // count |x| > thnan
	VPXOR Y7, Y7, Y7    // count |x| > 0
	VPXOR Y6, Y6, Y6    // count |x| > thsmall
	VPXOR Y5, Y5, Y5    // max finite |x|
	VPXOR Y4, Y4, Y4    // zero

loop:
	VMOVDQU   (SI), Y0
	VCVTPS2PH $0, Y0, X2 // imm 0: round to nearest, ties to even
	VMOVDQU   X2, (DI)
	VPAND     Y15, Y0, Y1
	VPCMPGTD  Y12, Y1, Y3
	VPSUBD    Y3, Y10, Y10
	VPCMPGTD  Y13, Y1, Y3
	VPSUBD    Y3, Y9, Y9
	VPANDN    Y1, Y3, Y2 // finite |x|, else 0
	VPMAXSD   Y2, Y5, Y5
	VPCMPGTD  Y14, Y1, Y3
	VPSUBD    Y3, Y8, Y8
	VPCMPGTD  Y4, Y1, Y3
	VPSUBD    Y3, Y7, Y7
	VPCMPGTD  Y11, Y1, Y3
	VPSUBD    Y3, Y6, Y6
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       loop

	VMOVDQU Y10, 0(DX)
	VMOVDQU Y9, 32(DX)
	VMOVDQU Y8, 64(DX)
	VMOVDQU Y7, 96(DX)
	VMOVDQU Y6, 128(DX)
	VMOVDQU Y5, 160(DX)
	VZEROUPPER
	RET

// func f32ToF16AVX2NoAudit(dst *uint16, src *float32, n int)
// n is a positive multiple of 8.
TEXT ·f32ToF16AVX2NoAudit(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	CMPQ CX, $32
	JLT  tail8

loop32:
	VMOVUPS   (SI), Y0
	VMOVUPS   32(SI), Y1
	VMOVUPS   64(SI), Y2
	VMOVUPS   96(SI), Y3
	VCVTPS2PH $0, Y0, (DI)
	VCVTPS2PH $0, Y1, 16(DI)
	VCVTPS2PH $0, Y2, 32(DI)
	VCVTPS2PH $0, Y3, 48(DI)
	ADDQ      $128, SI
	ADDQ      $64, DI
	SUBQ      $32, CX
	CMPQ      CX, $32
	JGE       loop32

tail8:
	TESTQ CX, CX
	JZ    done

loop8:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       loop8

done:
	VZEROUPPER
	RET

// func f32ToF16Screen(dst *uint16, src *float32, n int, maxOut *[8]uint32) int
// Converts blocks of 64 floats (n is a multiple of 64) while checking, per
// block, that nothing needs counting: every |x| <= thbig (no NaN, Inf or
// overflow) and every non-zero |x| > thsmall (no underflow). It stops after
// the first block that fails the check, and returns the number of elements
// before that block (those blocks are clean; the failing block is converted
// but must be audited again). maxOut gets the per-lane max |x| bits of the
// clean blocks.
TEXT ·f32ToF16Screen(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ maxOut+24(FP), DX
	XORQ BX, BX

	VPBROADCASTD absmask<>(SB), Y15
	VPBROADCASTD thbig<>(SB), Y14
	VPBROADCASTD thsmall<>(SB), Y13
	VPCMPEQD     Y12, Y12, Y12 // all ones
	VPXOR        Y11, Y11, Y11 // max |x| of clean blocks

block:
	CMPQ    BX, CX
	JGE     done
	VPXOR   Y10, Y10, Y10 // block max |x|
	VMOVDQU Y12, Y9       // block min of |x|-1, unsigned (0 wraps to max)
	MOVQ    $8, R8

vec:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, (DI) // imm 0: round to nearest, ties to even
	VPAND     Y15, Y0, Y1
	VPMAXUD   Y1, Y10, Y10
	VPADDD    Y12, Y1, Y1
	VPMINUD   Y1, Y9, Y9
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      R8
	JNZ       vec

	VPCMPGTD  Y14, Y10, Y2 // lanes with max > thbig
	VPMAXUD   Y13, Y9, Y3
	VPCMPEQD  Y3, Y9, Y3   // lanes with min(|x|-1) >= thsmall
	VPANDN    Y3, Y2, Y3   // clean lanes
	VPMOVMSKB Y3, AX
	CMPL      AX, $0xffffffff
	JNE       done
	VPMAXUD   Y10, Y11, Y11
	ADDQ      $64, BX
	JMP       block

done:
	VMOVDQU Y11, (DX)
	MOVQ    BX, ret+32(FP)
	VZEROUPPER
	RET

// func audit16AVX2(p *byte, n int) (maxBits uint16, special bool)
// n is a positive multiple of 32: the little-endian float16 values at p,
// 16 a step. maxBits is the largest |x| bits; special reports a NaN or
// an Inf (|x| bits > 0x7bff), in which case maxBits means nothing.
TEXT ·audit16AVX2(SB), NOSPLIT, $0-19
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVL $0x7fff7fff, AX
	MOVQ AX, X15
	VPBROADCASTD X15, Y15 // |x| mask
	MOVL $0x7bff7bff, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14 // largest finite |x|
	VPXOR Y0, Y0, Y0      // lanes' largest |x|
	VPXOR Y1, Y1, Y1      // lanes' NaN or Inf seen

audit16loop:
	VPAND    (SI), Y15, Y2
	VPCMPGTW Y14, Y2, Y3
	VPOR     Y3, Y1, Y1
	VPMAXUW  Y2, Y0, Y0
	ADDQ     $32, SI
	SUBQ     $32, CX
	JNZ      audit16loop

	VEXTRACTI128 $1, Y0, X2
	VPMAXUW      X2, X0, X0
	VPSHUFD      $0x4e, X0, X2
	VPMAXUW      X2, X0, X0
	VPSHUFD      $0xb1, X0, X2
	VPMAXUW      X2, X0, X0
	VPSRLD       $16, X0, X2
	VPMAXUW      X2, X0, X0
	MOVQ         X0, AX
	MOVW         AX, maxBits+16(FP)
	VPTEST       Y1, Y1
	SETNE        special+18(FP)
	VZEROUPPER
	RET

// Constants of f64ToF16Screen (float64 bits), broadcast into registers.
DATA f64abs<>+0(SB)/8, $0x7fffffffffffffff
GLOBL f64abs<>(SB), RODATA|NOPTR, $8
DATA f64lo<>+0(SB)/8, $0x3f0fffffffffffff   // |x| >  this: |x| >= 2^-14, a normal float16
GLOBL f64lo<>(SB), RODATA|NOPTR, $8
DATA f64big<>+0(SB)/8, $0x40effe0000000000  // |x| <  this: |x| < 65520, does not round to Inf
GLOBL f64big<>(SB), RODATA|NOPTR, $8
DATA f64bias<>+0(SB)/8, $0x3f00000000000000 // (1023-15) << 52: the exponents' rebias
GLOBL f64bias<>(SB), RODATA|NOPTR, $8
DATA f64half<>+0(SB)/8, $0x000001ffffffffff // 2^41 - 1: half a float16 ulp, less one
GLOBL f64half<>(SB), RODATA|NOPTR, $8
DATA f64one<>+0(SB)/8, $1
GLOBL f64one<>(SB), RODATA|NOPTR, $8
DATA f64sign<>+0(SB)/8, $0x8000
GLOBL f64sign<>(SB), RODATA|NOPTR, $8
// VPERMD indices putting the words of two VPACKUSDW rounds back in order.
DATA f64perm<>+0(SB)/4, $0
DATA f64perm<>+4(SB)/4, $4
DATA f64perm<>+8(SB)/4, $1
DATA f64perm<>+12(SB)/4, $5
DATA f64perm<>+16(SB)/4, $2
DATA f64perm<>+20(SB)/4, $6
DATA f64perm<>+24(SB)/4, $3
DATA f64perm<>+28(SB)/4, $7
GLOBL f64perm<>(SB), RODATA|NOPTR, $32

// F64GROUP converts the 4 float64 at off(SI) into 4 float16 in the low
// words of the quadwords of res, as Float64ToBits does for a zero or an |x|
// in [2^-14, 65520): rebias the exponent, round the mantissa to 10 bits
// to nearest even (a carry bumps the exponent), put the sign back. A lane
// outside that set jumps to fail. Y6 keeps the block's max |x| bits.
// Uses Y0-Y3.
#define F64GROUP(off, res) \
	VMOVDQU   off(SI), Y0    \
	VPAND     Y15, Y0, Y1    \
	VPCMPGTQ  Y14, Y1, Y2    \
	VPCMPGTQ  Y1, Y13, Y3    \
	VPAND     Y3, Y2, Y2     \
	VPXOR     Y3, Y3, Y3     \
	VPCMPEQQ  Y3, Y1, Y3     \
	VPOR      Y2, Y3, Y3     \
	VPMOVMSKB Y3, AX         \
	CMPL      AX, $0xffffffff \
	JNE       fail           \
	VPCMPGTQ  Y6, Y1, Y3     \
	VPBLENDVB Y3, Y1, Y6, Y6 \
	VPSUBQ    Y12, Y1, Y1    \
	VPSRLQ    $42, Y1, Y3    \
	VPAND     Y10, Y3, Y3    \
	VPADDQ    Y11, Y1, Y1    \
	VPADDQ    Y3, Y1, Y1     \
	VPSRLQ    $42, Y1, Y1    \
	VPAND     Y2, Y1, Y1     \
	VPSRLQ    $48, Y0, Y0    \
	VPAND     Y9, Y0, Y0     \
	VPOR      Y0, Y1, res

// func f64ToF16Screen(dst *uint16, src *float64, n int, maxOut *[4]uint64) int
// Converts blocks of 16 float64 (n is a multiple of 16) while every value
// of a block is a zero or has |x| in [2^-14, 65520): its float16 is a
// normal (or zero), and the audit has nothing to count. It stops before
// the first block that fails (which it leaves unwritten) and returns the
// number of elements converted; maxOut gets the per-lane max |x| bits of
// the blocks converted.
TEXT ·f64ToF16Screen(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ maxOut+24(FP), DX
	XORQ BX, BX

	VPBROADCASTQ f64abs<>(SB), Y15
	VPBROADCASTQ f64lo<>(SB), Y14
	VPBROADCASTQ f64big<>(SB), Y13
	VPBROADCASTQ f64bias<>(SB), Y12
	VPBROADCASTQ f64half<>(SB), Y11
	VPBROADCASTQ f64one<>(SB), Y10
	VPBROADCASTQ f64sign<>(SB), Y9
	VMOVDQU      f64perm<>(SB), Y8
	VPXOR        Y7, Y7, Y7 // max |x| of the blocks converted

block64:
	CMPQ      BX, CX
	JGE       fail
	VPXOR     Y6, Y6, Y6 // the block's max |x|
	F64GROUP(0, Y4)
	F64GROUP(32, Y5)
	VPACKUSDW Y5, Y4, Y4
	F64GROUP(64, Y5)
	F64GROUP(96, Y1)
	VPACKUSDW Y1, Y5, Y5
	VPACKUSDW Y5, Y4, Y4
	VPERMD    Y4, Y8, Y4
	VMOVDQU   Y4, (DI)
	VPCMPGTQ  Y7, Y6, Y3
	VPBLENDVB Y3, Y6, Y7, Y7
	ADDQ      $128, SI
	ADDQ      $32, DI
	ADDQ      $16, BX
	JMP       block64

fail:
	VMOVDQU Y7, (DX)
	MOVQ    BX, ret+32(FP)
	VZEROUPPER
	RET
