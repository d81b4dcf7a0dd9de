"""The corpus: a protocol's ``corpus`` read (a built-in corpus's name, or a local corpus of pinned
files: its keys declared in :mod:`prereg.protocol.schema`), every run read the same bytes, and for a
local corpus the bytes its pins imply."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from prereg.bounded import InputLimitError, read_regular
from prereg.formats.ledger import record_name, sha256
from prereg.protocol.schema import (
    CORPORA,
    CORPUS_FILE,
    CORPUS_SPLITS,
    FRACTIONS,
    PIN,
    SPLITS,
    CorpusFiles,
    Document,
    KeyPath,
    Pin,
    mapping,
)


def corpus_of(doc: Document, value: object) -> str | CorpusFiles:
    """A protocol's ``corpus``: a built-in corpus's name (:data:`~prereg.protocol.schema.CORPORA`),
    or a local corpus, ``{name, file: PIN, split: {train, valid, test}}`` or ``{name, train: PIN,
    valid: PIN, test: PIN}``, each PIN ``{path, size, sha256}``, its fractions summing to 1; each
    refusal names the file, the key and the line. Whether the pinned bytes are there, the harness
    checks before a run reads them."""
    kp: KeyPath = ("corpus",)
    if isinstance(value, str):
        if value not in CORPORA:
            raise doc.error(
                kp,
                f"unknown corpus {value!r} (known: {', '.join(CORPORA)}, or a local corpus: "
                "{name, file: {path, size, sha256}, split: {train, valid, test}})",
            )
        return value
    one = isinstance(value, dict) and "file" in value
    top = mapping(doc, value, kp, CORPUS_FILE if one else CORPUS_SPLITS)
    pins = {k: _pin(doc, top[k], kp + (k,)) for k in (("file",) if one else SPLITS)}
    if not one:
        return CorpusFiles(name=top["name"], train=pins["train"], valid=pins["valid"], test=pins["test"])
    split = mapping(doc, top["split"], kp + ("split",), FRACTIONS)
    total = sum(Fraction(repr(float(split[s]))) for s in SPLITS)
    if total != 1:
        raise doc.error(kp + ("split",), f"the fractions sum to {float(total)}, not 1")
    return CorpusFiles(name=top["name"], file=pins["file"], split={s: float(split[s]) for s in SPLITS})


def _pin(doc: Document, value: object, kp: KeyPath) -> Pin:
    """A local corpus file's pin at ``kp`` (:data:`~prereg.protocol.schema.PIN`)."""
    pin = mapping(doc, value, kp, PIN)
    return Pin(path=pin["path"], size=pin["size"], sha256=pin["sha256"])


def corpus_splits(root: str, corpus: dict[str, Any]) -> tuple[dict[str, object] | None, list[str]]:
    """The split sha256 values a local corpus's pins imply: the pins themselves for one file per
    split; for one file cut by fractions, recomputed from the file when this checkout has it (the
    cut as in harness.data: split s is bytes floor(n F_<s) to floor(n F_s), F cumulative)."""
    if "file" not in corpus:
        return {s: corpus[s]["sha256"] for s in ("train", "valid", "test")}, []
    path = os.path.join(root, corpus["file"]["path"])
    if not os.path.lexists(path):
        return None, []
    try:
        # a corpus may be a link to the data elsewhere: its target is read, as a regular file
        data = read_regular(os.path.realpath(path), max(int(corpus["file"]["size"]), 0))
    except InputLimitError as e:
        return None, [
            f"{e}; the protocol pins {corpus['file']['size']} bytes, sha256 {corpus['file']['sha256']}"
        ]
    if sha256(data) != corpus["file"]["sha256"] or len(data) != corpus["file"]["size"]:
        return None, [
            f"{path}: {len(data)} bytes, sha256 {sha256(data)}; the protocol pins "
            f"{corpus['file']['size']} bytes, sha256 {corpus['file']['sha256']}"
        ]
    cuts, acc = [0], Fraction(0)
    for s in ("train", "valid", "test"):
        acc += Fraction(repr(float(corpus["split"][s])))
        cuts.append(len(data) * acc.numerator // acc.denominator)
    return {s: sha256(data[cuts[i] : cuts[i + 1]]) for i, s in enumerate(("train", "valid", "test"))}, []


def check_corpus(
    root: str, proto: Mapping[str, object], records: list[dict[str, Any]]
) -> tuple[list[str], str]:
    """Every run read the same bytes; for a local corpus, the bytes its pins imply."""
    seen: dict[str, list[str]] = {}
    for r in records:
        got = (r.get("env") or {}).get("corpus_sha256")
        if got:
            seen.setdefault(json.dumps(got, sort_keys=True), []).append(record_name(r))
    found = []
    if len(seen) > 1:
        found.append(
            f"records read {len(seen)} different corpora: "
            + "; ".join(f"{v[0]} and {len(v) - 1} more: {k}" for k, v in seen.items())
        )
    corpus = proto.get("corpus")
    name = corpus["name"] if isinstance(corpus, dict) else corpus
    detail = f"{name}: {sum(map(len, seen.values()))} runs read one set of split hashes"
    if isinstance(corpus, dict):
        want, found_pins = corpus_splits(root, corpus)
        found += found_pins
        if want is not None:
            found += [
                f"{v[0]}: corpus split hashes {k} differ from the protocol's pins "
                f"{json.dumps(want, sort_keys=True)}"
                for k, v in seen.items()
                if json.loads(k) != want
            ]
            detail += ", the protocol's pins"
        else:
            detail += (
                f" (the pinned file {corpus['file']['path']} is not in this checkout: pins not recomputed)"
            )
    return found, detail
