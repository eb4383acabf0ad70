"""Label modalities (convert --label NAME): a per-clip int32 code a clip
and its vocabulary in dataset.json and epochs.json, checked as convert
writes them, and what every reader's labels(name) gives."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np


def modality_labels(where: str, manifest: str, m: Any) -> Optional[list[str]]:
    """A label modality's vocabulary (convert --label: code i of its int32
    rows stands for labels[i]), checked as convert writes it: distinct
    strings, one int32 per clip; None for any other modality."""
    labels = m.get("labels")
    if labels is None and not m.get("label_column"):
        return None
    name = m.get("name")
    if (not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels)
            or len(set(labels)) != len(labels)):
        raise ValueError("%s: %s: label modality %r: labels %.200r: want a list of distinct strings" % (where, manifest, name, labels))
    if not m.get("per_clip") or m.get("dtype") != "<i4" or m.get("frame_shape") != []:
        raise ValueError("%s: %s: label modality %r: per_clip %r, dtype %r, frame_shape %r: want one <i4 code a clip" % (
            where, manifest, name, m.get("per_clip"), m.get("dtype"), m.get("frame_shape")))
    return list(labels)


def pick_labels(labels: Mapping[str, list[str]], name: Any, where: str) -> list[str]:
    """labels[name] (a copy), or a ValueError naming the label modalities
    there are: what every reader's labels(name) gives."""
    if not isinstance(name, str) or name not in labels:
        raise ValueError("%r: not a label modality of %s (%s; convert --label NAME makes one from a column of a .csv or "
                         ".parquet clip list)" % (name, where, "its labels: %s" % ", ".join(labels) if labels else "it has none"))
    return list(labels[name])


def check_codes(where: str, name: str, codes: np.ndarray, labels: Sequence[str], what: str = "clip row") -> None:
    """Refuse a label modality's codes outside its vocabulary (a code of
    -1 would name the last label); what names an element of codes."""
    bad = (codes < 0) | (codes >= len(labels))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError("%s: label modality %r: %s %d holds code %d, outside its %d labels (not what convert "
                         "writes: run clipshard verify)" % (where, name, what, i, int(codes[i]), len(labels)))


def merge_labels(sources: Sequence[Any]) -> dict[str, list[str]]:
    """The label vocabularies of drawn sources (their records' "labels",
    their held codes), each source's codes checked against its own, and
    the sources' vocabularies against each other: one must begin the
    other's (a code means one label in every source). Name -> the
    longest."""
    out: dict[str, list[str]] = {}
    first: dict[str, Any] = {}
    for s in sources:
        for r in s.mods:
            labels, name = r["labels"], r["name"]
            if labels is None:
                continue
            check_codes(s.url, name, s.held[name][:s.clips], labels)
            have = out.get(name, [])
            common = min(len(have), len(labels))
            if have[:common] != labels[:common]:
                f = first[name]
                raise ValueError("dataset: source %s's label %r has labels %s, source %s's %s (%s/dataset.json, "
                                 "%s/dataset.json): a code must mean one label in every source (convert %s with "
                                 "--labels-like %s: its vocabulary first, then its own labels)" % (
                                     s.name, name, labels[:5], f.name, have[:5], s.url, f.url, s.url, f.url))
            if len(labels) > len(have):
                out[name] = list(labels)
            first.setdefault(name, s)
    return out
