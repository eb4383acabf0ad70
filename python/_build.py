"""The package's build backend (PEP 517 and PEP 660), in the tree and with
the standard library alone: `pip install ./python` then needs nothing
from the network to build (no setuptools, no wheel), works offline in a
fresh virtualenv, and writes nothing into the source tree (no build/, no
*.egg-info). The metadata comes from pyproject.toml's [project] table.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "clipshard"


def _project():
    """pyproject.toml's [project] table, and its optional-dependencies."""
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib  # Python >= 3.11
    except ImportError:
        return _mini_toml(raw.decode("utf-8"))["project"]
    return tomllib.loads(raw.decode("utf-8"))["project"]


def _mini_toml(text):
    """The subset of TOML pyproject.toml uses (tables, strings, arrays of
    strings), for Python < 3.11, which has no tomllib."""
    out = {}
    cur = out
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line)
        if m:
            cur = out
            for part in m.group(1).split("."):
                cur = cur.setdefault(part, {})
            continue
        k, _, v = line.partition("=")
        k, v = k.strip().strip('"'), v.strip()
        if v.startswith("["):
            cur[k] = re.findall(r'"((?:[^"\\]|\\.)*)"', v)
        elif v.startswith('"'):
            cur[k] = v[1:-1]
        else:
            cur[k] = v
    return out


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"],
             "Summary: %s" % p.get("description", ""), "Requires-Python: %s" % p.get("requires-python", "")]
    for d in p.get("dependencies", []):
        lines.append("Requires-Dist: %s" % d)
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: %s" % extra)
        for d in deps:
            lines.append('Requires-Dist: %s ; extra == "%s"' % (d, extra))
    readme = p.get("readme")
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, readme), encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _wheel(wheel_directory, editable, binary=None, platform="any"):
    """The wheel: the package (or, editable, a .pth naming this folder),
    and with binary the clipshard command as a script of the platform's
    (installed into the environment's bin/, on PATH once it is active)."""
    p = _project()
    name, version = p["name"], p["version"]
    dist = "%s-%s.dist-info" % (name, version)
    files = {}
    modes = {}
    if binary is not None:
        script = "%s-%s.data/scripts/clipshard" % (name, version)
        with open(binary, "rb") as f:
            files[script] = f.read()
        modes[script] = 0o755
    if editable:
        files["%s.pth" % name] = (HERE + "\n").encode()  # the source folder on sys.path
    else:
        src = os.path.join(HERE, PACKAGE)
        for fn in sorted(os.listdir(src)):
            if fn.endswith(".py") or fn == "py.typed":
                with open(os.path.join(src, fn), "rb") as f:
                    files["%s/%s" % (PACKAGE, fn)] = f.read()
    files[dist + "/METADATA"] = _metadata(p).encode()
    tags = "".join("Tag: py3-none-%s\n" % t for t in platform.split("."))
    files[dist + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: clipshard _build\nRoot-Is-Purelib: true\n" + tags).encode()
    files[dist + "/top_level.txt"] = (PACKAGE + "\n").encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(dist + "/RECORD,,")
    files[dist + "/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = "%s-%s-py3-none-%s.whl" % (name, version, platform)
    tmp = os.path.join(wheel_directory, wheel + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))  # the same bytes every build
            info.external_attr = (0o100000 | modes.get(path, 0o644)) << 16  # a regular file, and its mode
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, os.path.join(wheel_directory, wheel))
    return wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, editable=True)


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    p = _project()
    base = "%s-%s" % (p["name"], p["version"])
    out = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(out + ".part", "w:gz") as t:
        for rel in ["pyproject.toml", "_build.py", "README.md"] + [
                os.path.join(PACKAGE, fn) for fn in sorted(os.listdir(os.path.join(HERE, PACKAGE)))
                if fn.endswith(".py") or fn == "py.typed"]:
            data = open(os.path.join(HERE, rel), "rb").read()
            info = tarfile.TarInfo(base + "/" + rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
        pkg = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (p["name"], p["version"])).encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size, info.mode, info.mtime = len(pkg), 0o644, 0
        t.addfile(info, io.BytesIO(pkg))
    os.replace(out + ".part", out)
    return base + ".tar.gz"


# -- the wheels with the clipshard command (just wheel) -----------------------

# Go's GOOS/GOARCH -> the wheel's platform tags: a static binary (CGO off)
# runs on any Linux of that architecture, glibc or musl. (macOS: the
# command uses Linux's syscalls: renameat2, O_TMPFILE, O_DIRECT, io_uring.)
PLATFORMS = {
    ("linux", "amd64"): "manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64",
    ("linux", "arm64"): "manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64",
}


def wheels(out, every=False, binary=None):
    """Build the clipshard command (go build, CGO off, stamped with its
    commit) for this machine (every: for each of PLATFORMS) and its wheel:
    this machine's into out, the others' into out/GOOS-GOARCH/. Returns
    the wheels' paths. binary: this machine's wheel around a command
    already built (the tests' own build: no second compile of every
    package without cgo)."""
    import shutil
    import subprocess
    import tempfile
    root = os.path.dirname(HERE)
    host = tuple(subprocess.check_output(["go", "env", "GOHOSTOS", "GOHOSTARCH"], text=True).split())
    targets = sorted(PLATFORMS) if every else [host]
    if host not in PLATFORMS and not every:
        raise SystemExit("no wheel for %s/%s: the command is built for %s" % (host + (", ".join("/".join(t) for t in PLATFORMS),)))
    made = []
    if binary is not None:
        os.makedirs(out, exist_ok=True)
        made.append(os.path.join(out, _wheel(out, editable=False, binary=binary, platform=PLATFORMS[host])))
        targets = [t for t in targets if t != host]
    with tempfile.TemporaryDirectory() as tmp:
        for goos, goarch in targets:
            binary = os.path.join(tmp, "%s-%s" % (goos, goarch), "clipshard")
            env = dict(os.environ, CGO_ENABLED="0", GOOS=goos, GOARCH=goarch)
            # (said first: the first build downloads and compiles the dependencies, minutes with no output of go's)
            print("building the clipshard command for %s/%s (go build; on a fresh machine 2-5 min: it downloads and compiles "
                  "the dependencies)" % (goos, goarch), file=sys.stderr, flush=True)
            # -buildvcs=auto: the commit stamped in a git checkout (the
            # environment may say false), "commit unknown" outside one.
            subprocess.check_call(["go", "build", "-trimpath", "-buildvcs=auto", "-ldflags=-s -w", "-o", binary, "./cmd/clipshard"],
                                  cwd=root, env=env)
            where = out if (goos, goarch) == host else os.path.join(out, "%s-%s" % (goos, goarch))
            os.makedirs(where, exist_ok=True)
            made.append(os.path.join(where, _wheel(where, editable=False, binary=binary, platform=PLATFORMS[(goos, goarch)])))
        shutil.rmtree(tmp, ignore_errors=True)
    return made


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(prog="python3 python/_build.py", description="Build the wheels that carry the clipshard command.")
    ap.add_argument("command", choices=["wheels"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "dist"), help="where (default: dist/ at the top)")
    ap.add_argument("--all", action="store_true", help="every platform (the others into OUT/GOOS-GOARCH/)")
    ap.add_argument("--binary", help="this machine's wheel around this clipshard command instead of building one")
    a = ap.parse_args()
    for w in wheels(a.out, a.all, a.binary):
        print(w)
