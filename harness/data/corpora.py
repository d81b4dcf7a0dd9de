"""Byte corpora, each verified before any byte is used; free of torch.

``wikitext-2``
    The raw bytes of WikiText-2 raw v1 (Merity et al., 2016), verified against pinned sizes and
    sha256 values. ``harness data fetch wikitext-2`` downloads and verifies it.
``pydoc-topics``
    The embedded default: the English reference text every CPython ships in
    ``pydoc_data.topics``, split by topic (about 90/5/5 of the bytes) deterministically.
A local corpus (:class:`LocalCorpus`)
    Files a protocol names with their pinned size and sha256: one file cut into train, valid and
    test by the protocol's fractions (contiguous, in file order), or one file per split. Refused,
    like WikiText-2, unless every byte verifies.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TypedDict

from harness.names import CORPORA, SPLITS
from prereg.errors import DataError, InputError
from prereg.protocol.schema import CorpusFiles, Pin


class _ArchiveBytes(TypedDict):
    size: int
    sha256: str


class ArchivePin(_ArchiveBytes, total=False):
    """A downloaded archive's byte count and sha256 (and its file name)."""

    name: str


class Pins(TypedDict):
    """An archive's pin and its members', by split (:data:`WIKITEXT2_PINS`'s shape)."""

    archive: ArchivePin
    members: dict[str, Pin]


#: WikiText-2 raw v1 as pinned by several independent public projects.
WIKITEXT2_PINS: Pins = {
    "archive": {
        "name": "wikitext-2-raw-v1.zip",
        "size": 4721645,
        "sha256": "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
    },
    "members": {
        "train": {
            "path": "wikitext-2-raw/wiki.train.raw",
            "size": 10940747,
            "sha256": "6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57",
        },
        "valid": {
            "path": "wikitext-2-raw/wiki.valid.raw",
            "size": 1146846,
            "sha256": "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7",
        },
        "test": {
            "path": "wikitext-2-raw/wiki.test.raw",
            "size": 1290590,
            "sha256": "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08",
        },
    },
}


def default_data_dir() -> Path:
    return Path(os.environ.get("HARNESS_DATA", "runs/data"))


@dataclass(frozen=True)
class Corpus:
    """The three splits of one corpus as bytes, with their sha256."""

    name: str
    train: bytes
    valid: bytes
    test: bytes

    def split(self, which: str) -> bytes:
        return {"train": self.train, "valid": self.valid, "test": self.test}[which]

    def sha256(self) -> dict[str, str]:
        return {s: hashlib.sha256(self.split(s)).hexdigest() for s in SPLITS}


@dataclass(frozen=True)
class PinnedFile:
    """A local file as a protocol pins it; ``path`` is relative to the study's root or absolute."""

    path: str
    size: int
    sha256: str


def _fractions(by_split: Mapping[str, float]) -> tuple[str, str, str]:
    """The train, valid and test fractions as written (``repr`` of each float)."""
    train, valid, test = (repr(float(by_split[s])) for s in SPLITS)
    return train, valid, test


@dataclass(frozen=True)
class LocalCorpus:
    """A corpus from local files pinned in the protocol.

    Either ``files == {"all": f}`` and ``split`` gives the train, valid and test fractions (exact
    decimals summing to 1; split ``s`` is the bytes from ``floor(n * F_<s)`` to ``floor(n * F_s)``
    of the ``n`` bytes, ``F`` the cumulative fractions), or ``files`` has one file per split.
    """

    name: str
    files: dict[str, PinnedFile]
    split: tuple[str, str, str] | None = None  # the fractions as written, e.g. ("0.9", "0.05", "0.05")

    def as_dict(self) -> CorpusFiles:
        out: CorpusFiles = {"name": self.name}
        pins = {k: Pin(path=f.path, size=f.size, sha256=f.sha256) for k, f in self.files.items()}
        if "all" in pins:
            out["file"] = pins["all"]
        else:
            out["train"], out["valid"], out["test"] = pins["train"], pins["valid"], pins["test"]
        if self.split is not None:
            out["split"] = dict(zip(SPLITS, (float(x) for x in self.split)))
        return out

    @classmethod
    def from_dict(cls, d: CorpusFiles) -> LocalCorpus:
        named = [("all", d.get("file")), ("train", d.get("train")), ("valid", d.get("valid"))]
        files = {
            k: PinnedFile(v["path"], int(v["size"]), v["sha256"])
            for k, v in [*named, ("test", d.get("test"))]
            if v is not None
        }
        return cls(d["name"], files, _fractions(d["split"]) if "split" in d else None)

    def load(self, root: Path | None = None) -> Corpus:
        blobs = {
            k: read_verified(Path(f.path) if root is None else root / f.path, f, self.name)
            for k, f in self.files.items()
        }
        if "all" not in blobs:
            return Corpus(self.name, *(blobs[s] for s in SPLITS))
        data = blobs["all"]
        assert self.split is not None
        cuts, acc = [0], Fraction(0)
        for x in self.split:
            acc += Fraction(x)
            cuts.append(len(data) * acc.numerator // acc.denominator)
        return Corpus(self.name, *(data[cuts[i] : cuts[i + 1]] for i in range(3)))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_verified(path: Path, pin: PinnedFile, corpus: str) -> bytes:
    """The bytes of ``path`` if its size and sha256 are the pinned ones; otherwise DataError."""
    if not path.is_file():
        raise DataError(
            f"missing corpus file {path} of corpus {corpus!r} (expected {pin.size} bytes, "
            f"sha256 {pin.sha256})"
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != pin.size or digest != pin.sha256:
        raise DataError(
            f"corpus file {path} of corpus {corpus!r} does not verify: expected {pin.size} bytes with "
            f"sha256 {pin.sha256}, found {len(data)} bytes with sha256 {digest}; refusing to use "
            "unverified bytes"
        )
    return data


def fetch_hint(directory: Path) -> str:
    return (
        f"put the WikiText-2 raw v1 files under {directory / 'wikitext-2-raw'} "
        f"or run: harness data fetch wikitext-2 --dir {directory}"
    )


def verify_wikitext2(directory: Path, pins: Pins | None = None) -> dict[str, Path]:
    """Check every WikiText-2 file's size and sha256; return the split paths or raise DataError."""
    pins = pins or WIKITEXT2_PINS
    out: dict[str, Path] = {}
    for split, pin in pins["members"].items():
        path = directory / pin["path"]
        if not path.is_file():
            raise DataError(
                f"missing corpus file {path} (expected {pin['size']} bytes, sha256 {pin['sha256']}); "
                + fetch_hint(directory)
            )
        size = path.stat().st_size
        digest = sha256_file(path)
        if size != pin["size"] or digest != pin["sha256"]:
            raise DataError(
                f"corpus file {path} does not verify: expected {pin['size']} bytes with sha256 {pin['sha256']}, "
                f"found {size} bytes with sha256 {digest}; refusing to use unverified bytes. "
                + fetch_hint(directory)
            )
        out[split] = path
    return out


def _pydoc_topics() -> Corpus:
    from pydoc_data.topics import topics

    # Deterministic, byte-balanced: topics in name order, each to the split furthest below its
    # target share (90/5/5) so far.
    target = {"train": 0.90, "valid": 0.05, "test": 0.05}
    parts: dict[str, list[str]] = {s: [] for s in SPLITS}
    size = dict.fromkeys(SPLITS, 0)
    for name in sorted(topics):
        total = sum(size.values()) + len(topics[name])
        split = max(SPLITS, key=lambda s: target[s] * total - size[s])
        parts[split].append(topics[name])
        size[split] += len(topics[name])
    enc = {s: "\n\n".join(v).encode("utf-8") for s, v in parts.items()}
    return Corpus("pydoc-topics", enc["train"], enc["valid"], enc["test"])


def local_corpus(corpus: str | CorpusFiles) -> str | LocalCorpus:
    """A protocol's corpus as the core read it (:func:`prereg.corpora.corpus_of`): a built-in
    corpus's name, or the :class:`LocalCorpus` of its pinned files (verified when it loads)."""
    return corpus if isinstance(corpus, str) else LocalCorpus.from_dict(corpus)


CorpusSpec = str | LocalCorpus | CorpusFiles


def load_corpus(corpus: CorpusSpec, data_dir: str | Path | None = None, root: Path | None = None) -> Corpus:
    """Load a corpus: a built-in name, a :class:`LocalCorpus` (or its ``as_dict``) whose relative
    paths resolve against ``root`` (default: the working directory). Every byte is verified first."""
    if isinstance(corpus, dict):
        corpus = LocalCorpus.from_dict(corpus)
    if isinstance(corpus, LocalCorpus):
        return corpus.load(root)
    if corpus == "pydoc-topics":
        return _pydoc_topics()
    if corpus == "wikitext-2":
        directory = Path(data_dir) if data_dir else default_data_dir()
        paths = verify_wikitext2(directory)
        return Corpus(corpus, *(paths[s].read_bytes() for s in SPLITS))
    raise InputError(
        f"unknown corpus {corpus!r} (known: {', '.join(CORPORA)}, or a local corpus with pinned files)"
    )


def corpus_name(corpus: str | LocalCorpus) -> str:
    return corpus.name if isinstance(corpus, LocalCorpus) else corpus


def pin_block(path: Path, name: str, fractions: list[str], root: Path) -> str:
    """The protocol's ``corpus:`` block pinning one local file (its size and sha256), cut by
    ``fractions`` (train, valid, test); the path is written relative to ``root`` when inside it."""
    full = path.resolve()
    shown = full.relative_to(root.resolve()).as_posix() if full.is_relative_to(root.resolve()) else str(full)
    return (
        f"corpus:\n  name: {name}\n  file: {{path: {shown}, size: {full.stat().st_size}, sha256: {sha256_file(full)}}}\n"
        f"  split: {{train: {fractions[0]}, valid: {fractions[1]}, test: {fractions[2]}}}"
    )
