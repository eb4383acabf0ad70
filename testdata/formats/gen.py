#!/usr/bin/env python3
"""Generate the decoder fixtures with real numpy and pickle.

    python3 testdata/formats/gen.py [OUTDIR]      (default: this folder)

Writes npy/*.npy, pickle/*.pkl, expect/*.bin and cases.json. Every expected
value is numpy's own bytes: the selected array made C-ordered and
little-endian, then .tobytes(). Broken files are derived from good ones
(truncated, edited) or built from numpy's own header writer.

Needs numpy (Debian: apt-get install python3-numpy). Output is deterministic
for a given numpy version; the committed files were made with numpy 1.24
(testdata/formats) and with numpy 2.x (testdata/formats-numpy2:
testdata/formats/gen_numpy2.sh).
"""
import collections
import io
import json
import os
import pickle
import struct
import sys
import types

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
for sub in ("npy", "pickle", "expect"):
    os.makedirs(os.path.join(OUT, sub), exist_ok=True)

rng = np.random.default_rng(20261129)
cases = []


def write(rel, data):
    with open(os.path.join(OUT, rel), "wb") as f:
        f.write(data)


def expect(file, keys, arr, tag):
    """Record a good case: decoding file with keys must give arr's bytes."""
    arr = np.asarray(arr)
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False) if arr.dtype.byteorder == ">" else arr
    rel = "expect/%s.bin" % tag
    write(rel, np.ascontiguousarray(le).tobytes(order="C"))
    cases.append({
        "file": file, "keys": keys, "expect": rel,
        "dtype": arr.dtype.name, "shape": list(arr.shape),
        "source_descr": arr.dtype.str,
        "fortran": bool(arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous),
    })


def fail(file, keys, error):
    """Record a bad case: decoding must fail with a message containing error."""
    cases.append({"file": file, "keys": keys, "error": error})


def floats(shape, dtype):
    a = rng.standard_normal(shape) * 10
    return a.astype(dtype)


# ---------------------------------------------------------------- .npy files
def npy_bytes(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=True)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


good_npy = {
    "f32_2d": floats((7, 5), "<f4"),
    "f64_be": floats((6, 3), ">f8"),
    "f16": floats((9, 4), "<f2"),
    "f32_be": floats((4, 6), ">f4"),
    "f16_be": floats((5, 2), ">f2"),
    "f32_fortran": np.asfortranarray(floats((5, 7), "<f4")),
    "f64_fortran_be_3d": np.asfortranarray(floats((3, 4, 5), ">f8")),
    "scalar_0d": np.array(3.5, dtype="<f4"),
    "vec_1d": floats((11,), "<f4"),
    "empty": np.zeros((0, 8), dtype="<f4"),
    "i64": np.arange(-6, 6, dtype="<i8").reshape(4, 3),
    "i16_be": np.arange(10, dtype=">i2").reshape(5, 2),
    "u8": np.arange(12, dtype="u1").reshape(3, 4),
    "bool": (np.arange(8) % 3 == 0).reshape(4, 2),
}
for name, arr in good_npy.items():
    write("npy/%s.npy" % name, npy_bytes(arr))
    expect("npy/%s.npy" % name, "", arr, "npy_" + name)
for ver in ((2, 0), (3, 0)):
    name = "v%d" % ver[0]
    arr = floats((3, 4), "<f4")
    write("npy/%s.npy" % name, npy_bytes(arr, ver))
    expect("npy/%s.npy" % name, "", arr, "npy_" + name)


def header(d, version=(1, 0)):
    """A .npy header for the dict d (any shape, even one no array could
    have), byte for byte as numpy 1.24's private _write_array_header wrote
    it (numpy 2.x has no such function): the dict's repr with sorted keys,
    room for the growth axis to reach 21 digits, padded with spaces to a
    multiple of 64 bytes and a newline."""
    text = "{" + "".join("'%s': %s, " % (k, repr(v)) for k, v in sorted(d.items())) + "}"
    shape = d["shape"]
    if len(shape) > 0:
        text += " " * (21 - len(repr(shape[-1 if d["fortran_order"] else 0])))
    fmt = "<H" if version == (1, 0) else "<I"
    body = text.encode("latin1")
    hlen = len(body) + 1
    pad = 64 - ((8 + struct.calcsize(fmt) + hlen) % 64)
    return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, hlen + pad) + body + b" " * pad + b"\n"


good = npy_bytes(good_npy["f32_2d"])
write("npy/truncated.npy", good[: len(good) - 13])
fail("npy/truncated.npy", "", "truncated")
write("npy/truncated_header.npy", good[:40])
fail("npy/truncated_header.npy", "", "truncated")
write("npy/bad_magic.npy", b"\x93NUMPX" + good[6:])
fail("npy/bad_magic.npy", "", "bad magic")
write("npy/bad_version.npy", good[:6] + b"\x09\x00" + good[8:])
fail("npy/bad_version.npy", "", "unknown format version 9.0")
write("npy/trailing.npy", good + b"extra")
fail("npy/trailing.npy", "", "trailing bytes")
write("npy/lying_header.npy",
      header({"descr": "<f4", "fortran_order": False, "shape": (10**8, 10**8)}) + b"\0" * 16)
fail("npy/lying_header.npy", "", "declares")
write("npy/overflow_header.npy",
      header({"descr": "<f8", "fortran_order": False, "shape": (2**62, 2**62)}) + b"\0" * 16)
fail("npy/overflow_header.npy", "", "overflows")
write("npy/object.npy", npy_bytes(np.array([{"a": 1}, None], dtype=object)))
fail("npy/object.npy", "", "object array")
write("npy/complex.npy", npy_bytes(np.zeros((2, 2), dtype=np.complex64)))
fail("npy/complex.npy", "", "complex")
write("npy/structured.npy", npy_bytes(np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])))
fail("npy/structured.npy", "", "structured")
write("npy/unicode.npy", npy_bytes(np.array(["ab", "cd"])))
fail("npy/unicode.npy", "", "string array")
bad = bytearray(good)
i = bad.index(b"'shape'")
bad[i:i + 7] = b"'shope'"
write("npy/bad_key.npy", bytes(bad))
fail("npy/bad_key.npy", "", "unexpected key")
bad = bytearray(good)
i = bad.index(b"False")
bad[i:i + 5] = b"Fa!se"
write("npy/bad_syntax.npy", bytes(bad))
fail("npy/bad_syntax.npy", "", "header syntax")
write("npy/not_npy.npy", b"this is not a numpy file at all\n")
fail("npy/not_npy.npy", "", "bad magic")
write("npy/empty_file.npy", b"")
fail("npy/empty_file.npy", "", "too short")

# ---------------------------------------------------------------- pickles
T = 12
record = {
    "exp": floats((T, 50), "<f4"),
    "pose": floats((T, 6), "<f4"),
    "fps": np.float32(30.0),
    "name": "clip_a",
    "frames": T,
    "params": {"exp": floats((T, 10), "<f8"), "trans": floats((T, 3), "<f2")},
    "be": floats((T, 4), ">f4"),
    "fort": np.asfortranarray(floats((T, 5), "<f4")),
    "scalar0d": np.array(2.5),
    "empty": np.zeros((0, 7), dtype="<f4"),
    "ids": np.arange(T, dtype=np.int64),
    "mask": np.arange(T) % 2 == 0,
    "names": np.array(["a", None], dtype=object),
    "rec": np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]),
    "list": [floats((T, 2), "<f4"), floats((T, 3), "<f4")],
    # per-clip values as people store them: Python numbers and lists
    "rate": 25.0,
    "coeffs": [0.5, 1.0, 2],
    "flags": [True, False, True],
}
bare = floats((8, 3), "<f4")
big = floats((300, 100), "<f4")  # 120 KB: written outside protocol 4 frames


class _Np2Names:
    """numpy 2.x pickles name its internals numpy._core.*; numpy 1.x says
    numpy.core.*. To write numpy-2 pickles with the numpy we have, register
    modules under the numpy 2 names whose functions stand for numpy's own,
    and have the pickler name those: the reduce tuples are numpy's."""

    def __init__(self):
        self.mapping = {}
        # With numpy 2.x itself, its pickles are numpy 2 pickles: nothing
        # to stand in for (and numpy._core is the real one).
        self.native = int(np.__version__.split(".")[0]) >= 2
        if self.native:
            return
        for modname, name, fn in (
            ("numpy._core.multiarray", "_reconstruct", np.core.multiarray._reconstruct),
            ("numpy._core.multiarray", "scalar", np.core.multiarray.scalar),
            ("numpy._core.numeric", "_frombuffer", np.core.numeric._frombuffer),
        ):
            mod = sys.modules.get(modname) or types.ModuleType(modname)
            sys.modules[modname] = mod

            def stand_in(*args, _fn=fn):
                return _fn(*args)

            stand_in.__module__, stand_in.__name__, stand_in.__qualname__ = modname, name, name
            setattr(mod, name, stand_in)
            self.mapping[fn] = stand_in
        sys.modules.setdefault("numpy._core", types.ModuleType("numpy._core"))

    def dumps(self, obj, protocol):
        if self.native:
            return pickle.dumps(obj, protocol=protocol)
        mapping = self.mapping

        class Pickler(pickle.Pickler):
            def reducer_override(self, o):
                if isinstance(o, (np.ndarray, np.generic)):
                    rv = o.__reduce_ex__(protocol)
                    return (mapping.get(rv[0], rv[0]),) + tuple(rv[1:])
                return NotImplemented

        buf = io.BytesIO()
        Pickler(buf, protocol=protocol).dump(obj)
        return buf.getvalue()


np2 = _Np2Names()


def check_roundtrip(data, obj):
    back = pickle.loads(data)
    if isinstance(obj, np.ndarray):
        assert back.dtype == obj.dtype and np.array_equal(back, obj)
    else:
        for k in ("exp", "pose", "be", "fort"):
            assert np.array_equal(back[k], obj[k])


def add_dict_cases(file, tag):
    expect(file, "exp", record["exp"], tag + "_exp")
    expect(file, "params/exp", record["params"]["exp"], tag + "_params_exp")
    expect(file, "params/trans", record["params"]["trans"], tag + "_params_trans")
    expect(file, "exp+pose", np.concatenate([record["exp"], record["pose"]], axis=-1), tag + "_exp_pose")
    expect(file, "exp+params/exp", np.concatenate([record["exp"], record["params"]["exp"]], axis=-1),
           tag + "_exp_params_exp")
    expect(file, "be", record["be"], tag + "_be")
    expect(file, "fort", record["fort"], tag + "_fort")
    expect(file, "scalar0d", record["scalar0d"], tag + "_scalar0d")
    expect(file, "empty", record["empty"], tag + "_empty")
    expect(file, "ids", record["ids"], tag + "_ids")
    expect(file, "mask", record["mask"], tag + "_mask")
    expect(file, "list/1", record["list"][1], tag + "_list1")
    expect(file, "fps", record["fps"], tag + "_fps")  # a numpy scalar: 0-d, its dtype
    expect(file, "frames", np.int64(record["frames"]), tag + "_frames")  # Python int: int64
    expect(file, "rate", np.float64(record["rate"]), tag + "_rate")  # Python float: float64
    expect(file, "coeffs", np.asarray(record["coeffs"]), tag + "_coeffs")  # float64 [3]
    expect(file, "flags", np.asarray(record["flags"]), tag + "_flags")  # bool [3]


for proto in (2, 3, 4, 5):
    file = "pickle/p%d_dict.pkl" % proto
    data = pickle.dumps(record, protocol=proto)
    check_roundtrip(data, record)
    write(file, data)
    add_dict_cases(file, "p%d_dict" % proto)
    file = "pickle/p%d_bare.pkl" % proto
    write(file, pickle.dumps(bare, protocol=proto))
    expect(file, "", bare, "p%d_bare" % proto)
for proto in (2, 4, 5):
    file = "pickle/p%d_np2_dict.pkl" % proto
    data = np2.dumps(record, proto)
    assert b"numpy._core" in data and b"numpy.core" not in data, file
    check_roundtrip(data, record)
    write(file, data)
    add_dict_cases(file, "p%d_np2_dict" % proto)

fbe = np.asfortranarray(floats((6, 9), ">f8"))
for proto in (2, 5):
    file = "pickle/p%d_bare_fortran_be.pkl" % proto
    write(file, pickle.dumps(fbe, protocol=proto))
    expect(file, "", fbe, "p%d_bare_fortran_be" % proto)
f16 = floats((10, 4), "<f2")
write("pickle/p3_bare_f16.pkl", pickle.dumps(f16, protocol=3))
expect("pickle/p3_bare_f16.pkl", "", f16, "p3_bare_f16")
for proto in (4, 5):
    file = "pickle/p%d_big.pkl" % proto
    write(file, pickle.dumps({"exp": big}, protocol=proto))
    expect(file, "exp", big, "p%d_big" % proto)
odict = collections.OrderedDict([("pose", record["pose"]), ("exp", record["exp"])])
write("pickle/p4_odict.pkl", pickle.dumps(odict, protocol=4))
expect("pickle/p4_odict.pkl", "exp", record["exp"], "p4_odict_exp")
write("pickle/p4_list.pkl", pickle.dumps(record["list"], protocol=4))
expect("pickle/p4_list.pkl", "0", record["list"][0], "p4_list0")

# key errors on good files
fail("pickle/p4_dict.pkl", "nope", 'key "nope" not found in the top level; keys there: "be", "coeffs", "empty"')
fail("pickle/p4_dict.pkl", "params/nope", 'key "nope" not found in "params"; keys there: "exp", "trans"')
fail("pickle/p4_dict.pkl", "name", 'key "name" holds a str, not a numpy array')
fail("pickle/p4_dict.pkl", "", "the pickle holds a dict, not a numpy array; select one with :KEY")
fail("pickle/p4_dict.pkl", "exp+ids", "cannot concatenate")
fail("pickle/p4_dict.pkl", "names", 'key "names": array: unsupported dtype: "|O8" is an object array')
fail("pickle/p4_dict.pkl", "rec", 'key "rec": array: unsupported dtype: structured dtype')
fail("pickle/p4_dict.pkl", "list/7", "is a list of 2 items")
write("pickle/p4_bigint.pkl", pickle.dumps({"huge": 2**70, "neg": -2**40}, protocol=4))
fail("pickle/p4_bigint.pkl", "huge", "int 1180591620717411303424 does not fit int64")
expect("pickle/p4_bigint.pkl", "neg", np.int64(-2**40), "p4_bigint_neg")
fail("pickle/p4_dict.pkl", "list", 'key "list" holds a list, not a numpy array')
fail("pickle/p4_bare.pkl", "exp", "the top level is a ndarray, not a dict")


# broken and hostile pickles
class Evil:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


import builtins  # noqa: E402
import subprocess  # noqa: E402

evil = {
    "os_system": (os.system, ("echo pwned",), "global posix.system"),
    "eval": (builtins.eval, ("1+1",), "global builtins.eval"),
    "popen": (subprocess.Popen, (["true"],), "global subprocess.Popen"),
    "getattr": (builtins.getattr, ("abc", "upper"), "global builtins.getattr"),
}
# Protocol 2 writes Python 2 names where they differ (fix_imports).
py2_names = {"builtins.": "__builtin__.", "subprocess.Popen": "commands.Popen"}
for name, (fn, args, msg) in evil.items():
    for proto in (2, 4):
        file = "pickle/evil_%s_p%d.pkl" % (name, proto)
        write(file, pickle.dumps({"exp": bare, "x": Evil(fn, args)}, protocol=proto))
        want = msg
        if proto == 2:
            for py3, py2 in py2_names.items():
                want = want.replace(py3, py2)
        fail(file, "exp", want)

p4 = pickle.dumps(record, protocol=4)
write("pickle/truncated.pkl", p4[: len(p4) // 2])
fail("pickle/truncated.pkl", "exp", "truncated")
write("pickle/trailing.pkl", p4 + b"junk")
fail("pickle/trailing.pkl", "exp", "4 bytes after STOP")
write("pickle/not_a_pickle.pkl", b"hello, this is text and not a pickle\n")
fail("pickle/not_a_pickle.pkl", "", "not a pickle of protocol 2-5")
write("pickle/object_array.pkl", pickle.dumps(np.array([1, "x", None], dtype=object), protocol=4))
fail("pickle/object_array.pkl", "", "object array")
write("pickle/structured.pkl", pickle.dumps(np.zeros(3, dtype=[("a", "<f4")]), protocol=4))
fail("pickle/structured.pkl", "", "structured dtype")
write("pickle/complex.pkl", pickle.dumps(np.zeros(3, dtype=np.complex128), protocol=4))
fail("pickle/complex.pkl", "", "complex")
write("pickle/binbytes8_huge.pkl", b"\x80\x04\x8e" + struct.pack("<Q", 2**50) + b"xx.")
fail("pickle/binbytes8_huge.pkl", "", "BINBYTES8 at offset 2 declares 1125899906842624 bytes")
write("pickle/binbytes8_16g.pkl", b"\x80\x04\x8e" + struct.pack("<Q", 2**34) + b"xx.")
fail("pickle/binbytes8_16g.pkl", "", "BINBYTES8 at offset 2 declares 17179869184 bytes")
write("pickle/frame_huge.pkl", b"\x80\x04\x95" + struct.pack("<Q", 2**40) + b"N.")
fail("pickle/frame_huge.pkl", "", "FRAME at offset 2 declares")
write("pickle/persid.pkl", b"\x80\x02Pabc\n.")
fail("pickle/persid.pkl", "", "PERSID at offset 2")
write("pickle/proto9.pkl", b"\x80\x09N.")
fail("pickle/proto9.pkl", "", "protocol 9")
write("pickle/lying_shape.pkl", p4.replace(struct.pack("<BB", 0x4b, T) + struct.pack("<BB", 0x4b, 50),
                                           struct.pack("<BB", 0x4b, T) + struct.pack("<BB", 0x4b, 51), 1))
fail("pickle/lying_shape.pkl", "exp", "needs 2448 bytes, have 2400")

with open(os.path.join(OUT, "cases.json"), "w") as f:
    json.dump({"numpy": np.__version__, "cases": cases}, f, indent=1)
    f.write("\n")
print("wrote %d cases to %s" % (len(cases), OUT))
