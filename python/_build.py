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


def _wheel(wheel_directory, editable):
    p = _project()
    name, version = p["name"], p["version"]
    dist = "%s-%s.dist-info" % (name, version)
    files = {}
    if editable:
        files["%s.pth" % name] = (HERE + "\n").encode()  # the source folder on sys.path
    else:
        src = os.path.join(HERE, PACKAGE)
        for fn in sorted(os.listdir(src)):
            if fn.endswith(".py") or fn == "py.typed":
                with open(os.path.join(src, fn), "rb") as f:
                    files["%s/%s" % (PACKAGE, fn)] = f.read()
    files[dist + "/METADATA"] = _metadata(p).encode()
    files[dist + "/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: clipshard _build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[dist + "/top_level.txt"] = (PACKAGE + "\n").encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(dist + "/RECORD,,")
    files[dist + "/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = "%s-%s-py3-none-any.whl" % (name, version)
    tmp = os.path.join(wheel_directory, wheel + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))  # the same bytes every build
            info.external_attr = 0o644 << 16
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
