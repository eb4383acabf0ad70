#!/usr/bin/env python3
"""Make float16 conversion cases with real numpy.

    python3 testdata/f16/gen.py OUTDIR

Writes f32.bin (float32 inputs, little-endian) and f32_to_f16.bin (numpy's
astype(np.float16) of them), and likewise f64.bin / f64_to_f16.bin. Over 1M
values each: every float16 value, the ties halfway between neighbours and one
ulp either side, subnormals, 65504, 65519.99, 65520, +-Inf, NaN, values
random over the whole exponent range, and float64 values next to float16
ties, where converting via float32 would round twice.
"""
import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(7)

# every float16 value and the midpoints between consecutive finite ones
h = np.arange(0, 0x7C01, dtype=np.uint16).view(np.float16).astype(np.float64)
mid = (h[:-1] + h[1:]) / 2  # exact in float64 and in float32
specials = np.array([0.0, -0.0, 65504, 65519.99, 65520, 65519.998, 65536, 1e9, 3.4e38,
                     np.inf, -np.inf, np.nan, 2**-24, 2**-25, 2**-26, 1.5 * 2**-25,
                     2**-14, 2**-14 - 2**-25, 1e-40, 1e-45])

f32_parts = [h, mid, specials]
for base in (h, mid):
    b32 = base.astype(np.float32)
    f32_parts.append(np.nextafter(b32, np.float32(np.inf)))
    f32_parts.append(np.nextafter(b32, np.float32(-np.inf)))
bits = rng.integers(0, 2**32, size=400_000, dtype=np.uint64).astype(np.uint32)
f32_parts.append(bits.view(np.float32))
f32_parts.append(rng.standard_normal(200_000).astype(np.float32) * np.float32(1000))
f32 = np.concatenate([np.asarray(p, dtype=np.float32) for p in f32_parts])
f32 = np.concatenate([f32, -f32])
with np.errstate(all="ignore"):
    f32.astype("<f4").tofile(os.path.join(out, "f32.bin"))
    f32.astype(np.float16).astype("<f2").tofile(os.path.join(out, "f32_to_f16.bin"))

f64_parts = [h, mid, specials]
for base in (mid,):
    f64_parts.append(np.nextafter(base, np.inf))
    f64_parts.append(np.nextafter(base, -np.inf))
    # a hair above a tie: via float32 this rounds to the tie, then to even
    f64_parts.append(base * (1 + 2**-40))
    f64_parts.append(base * (1 - 2**-40))
f64_parts.append(rng.integers(0, 2**64, size=200_000, dtype=np.uint64).view(np.float64))
f64_parts.append(rng.standard_normal(200_000) * 1000)
f64 = np.concatenate([np.asarray(p, dtype=np.float64) for p in f64_parts])
f64 = np.concatenate([f64, -f64])
with np.errstate(all="ignore"):
    f64.astype("<f8").tofile(os.path.join(out, "f64.bin"))
    f64.astype(np.float16).astype("<f2").tofile(os.path.join(out, "f64_to_f16.bin"))
    via32 = f64.astype(np.float32).astype(np.float16)
    differ = np.count_nonzero(via32.view(np.uint16) != f64.astype(np.float16).view(np.uint16))
print("f32 %d values, f64 %d values, %d float64 values where via-float32 differs" % (len(f32), len(f64), differ))
