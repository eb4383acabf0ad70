"""The versions of a dataset that epochs drawn at read time read (a
dataset in segments and versions, convert --segments; format 1 is
version 1): the one a source opens (Source: the current one, or one kept
in versions/N), the check that it is still there as it was before each
epoch, the versions a Drawn is asked for, and a loader pinned to a
state's versions.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:
    from ._blocks import Source
    from .draw import Drawn

__all__ = ["check_current", "kept", "open_version", "pinned", "said", "versions_of"]


def open_version(self: "Source", version: Optional[int]) -> Any:
    """The manifest of the version read (None: the current one), its
    sha256 and where it is kept (self.sha, self.manifest_rel,
    self.version). A version other than the current one is read from
    versions/N/dataset.json (format 2: kept by convert --segments
    until convert --keep drops it)."""
    rel = "dataset.json" if self.remote is None else self.remote.manifest
    raw = self._bytes(rel)
    man = _json(self.url, rel, raw)
    cur = man.get("dataset_version", 1) if isinstance(man, dict) else None
    if self.remote is not None and version is not None and version != cur:
        raise ValueError("%s: version %d is not kept there (its dataset.json is version %r): read a version the bucket "
                         "keeps" % (self.url, version, cur))
    if version is not None and version != cur:
        if type(version) is not int or version < 1:
            raise ValueError("version %r: want a dataset version (an int >= 1) of %s" % (version, self.url))
        rel = "versions/%d/dataset.json" % version
        # (a version above the current one: a convert --segments killed before its commit left it, never committed)
        if self.remote is not None or not os.path.lexists(os.path.join(self.dir, rel)) or (type(cur) is int and version > cur):
            raise ValueError("%s: version %d is not kept (dataset.json is version %r; kept: %s): it was dropped (convert "
                             "--keep) or never made; read a kept version" % (self.url, version, cur, kept(self.dir)))
        raw = self._bytes(rel)
        man = _json(self.url, rel, raw)
        got = man.get("dataset_version", 1) if isinstance(man, dict) else None
        if got != version:
            raise ValueError("%s: %s is dataset version %r, not %d" % (self.url, rel, got, version))
        cur = version
    self.sha = hashlib.sha256(raw).hexdigest()
    self.manifest_rel, self.version = rel, cur
    return man


def kept(folder: str) -> str:
    """The versions kept under folder/versions/ (or "only the current one")."""
    try:
        got = sorted(int(n) for n in os.listdir(os.path.join(folder, "versions")) if n.isdigit())
    except OSError:
        got = []
    return ", ".join(map(str, got)) if got else "only the current one"


def check_current(self: "Source") -> None:
    """Refuse a version that changed, or is no longer kept, since it was
    checked: a dataset converted again in place (format 1), or the
    version read dropped (convert --keep). A version kept while newer
    ones are committed is read on (its files are never rewritten)."""
    if self.remote is None and self.manifest_rel != "dataset.json" and not os.path.lexists(os.path.join(self.dir, self.manifest_rel)):
        raise ValueError("%s: dataset version %r, which the loader reads, is no longer kept (dropped by convert --keep; "
                         "kept: %s): make the loader again, of a kept version" % (self.url, self.version, kept(self.dir)))
    try:
        now = hashlib.sha256(self._bytes(self.manifest_rel) if self.remote is None else
                             self.remote.check_current()).hexdigest()
        if now != self.sha and self.remote is not None and self.remote.by_content and self.remote.manifest == "dataset.json":
            b = self.remote.kept_manifest(self.version or 0)
            if b is not None and hashlib.sha256(b).hexdigest() == self.sha:
                now, self.manifest_rel = self.sha, self.remote.manifest  # (a later version pushed: this one kept, read on)
        mine = "versions/%d/dataset.json" % (self.version or 0)
        if (now != self.sha and self.remote is None and self.manifest_rel == "dataset.json"
                and os.path.lexists(os.path.join(self.dir, mine))):
            now = hashlib.sha256(self._bytes(mine)).hexdigest()
            if now == self.sha:
                self.manifest_rel = mine  # (a newer version committed: this one kept, read on)
    except (ValueError, OSError) as e:
        raise ValueError("%s: dataset version %r (%s), which the loader reads, cannot be read again: %s (dropped by "
                         "convert --keep, or converted again?): make the loader again" % (
                             self.url, self.version, self.manifest_rel, e)) from None
    if now != self.sha:
        raise ValueError("%s: dataset.json changed since the loader checked it (converted again?), and version %r, which "
                         "the loader reads, is not kept as it was (kept: %s): make the loader again" % (
                             self.url, self.version, kept(self.dir)))


def said(versions: Mapping[str, Any]) -> str:
    """{name: version} in words."""
    return ", ".join("%r of %s" % (v, n) for n, v in versions.items())


def versions_of(version: Any, names: list[str], mixed: bool) -> list[Optional[int]]:
    """Each source's version to read (None: its current one), of a
    Drawn's version argument."""
    if version is None:
        return [None] * len(names)
    if isinstance(version, Mapping):
        if not mixed or set(version) - set(names):
            raise ValueError("version %r: want {source name: version} of the sources %s" % (dict(version), names))
        got = [version.get(n) for n in names]
    elif mixed:
        raise ValueError("version %r: with several datasets, want {source name: version}" % (version,))
    else:
        got = [version]
    for v in got:
        if v is not None and (type(v) is not int or v < 1):
            raise ValueError("version %r: want a dataset version (an int >= 1), or None for the current one" % (v,))
    return got


def pinned(drawn: "Drawn", args: dict[str, Any], versions: Any, ident: Any) -> tuple["Drawn", dict[str, Any]]:
    """The Drawn a loader reads from once it loads a state of versions
    (and identity ident): drawn itself, unless the state is of other
    dataset versions (a newer one committed since it was saved): then a
    Drawn of the state's versions, made with args (the same epochs, the
    same bytes, while the dataset keeps them; refused, naming them, where
    they are gone or their batches differ), and its args."""
    from .draw import Drawn
    if not isinstance(versions, Mapping) or versions == drawn.versions or ident == drawn.identity:
        return drawn, args
    args = dict(args, version=dict(versions) if drawn.mixed else next(iter(versions.values()), None))
    try:
        again = Drawn(**args)
    except ValueError as e:
        raise ValueError("state is of dataset version %s, this loader read %s, and that cannot be read: %s" % (
            said(versions), said(drawn.versions), e)) from None
    if again.shapes() != drawn.shapes() or again.names != drawn.names:
        a, b = _shapes(again), _shapes(drawn)
        again.close()
        raise ValueError("state is of dataset version %s, whose batches differ from those of version %s this loader was made "
                         "for (%s against %s): make the loader with version=%s" % (
                             said(versions), said(drawn.versions), a, b, args["version"]))
    drawn.close()
    return again, args


def _shapes(d: "Drawn") -> str:
    return ", ".join("%s %s" % (n, list(sh)) for n, (_, sh) in d.shapes().items())


def _json(where: str, rel: str, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError("%s: %s: not JSON: %s" % (where, rel, e)) from None
