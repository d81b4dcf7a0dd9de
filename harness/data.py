"""Byte corpora, seeded batches and exact bits per byte.

Corpora
-------
``wikitext-2``
    The raw bytes of WikiText-2 raw v1 (Merity et al., 2016), verified against pinned sizes and
    sha256 values before any use. ``harness data fetch wikitext-2`` downloads and verifies it.
``pydoc-topics``
    The embedded default: the English reference text every CPython ships in
    ``pydoc_data.topics``, split by topic (about 90/5/5 of the bytes) deterministically.

Bits per byte
-------------
Every byte of a split except the first is predicted exactly once: consecutive windows of the
context length, window ``i`` reading bytes ``[i*T, i*T + T)`` and predicting ``[i*T + 1, i*T + T + 1)``
(the last window shorter). Negative log-likelihoods are summed in float64 nats and divided by
``ln 2`` times the number of predicted bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness.errors import DataError, InputError
from harness.names import CORPORA, SPLITS

#: WikiText-2 raw v1 as pinned by several independent public projects.
WIKITEXT2_PINS: dict[str, Any] = {
    "archive": {
        "name": "wikitext-2-raw-v1.zip",
        "size": 4721645,
        "sha256": "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
    },
    "members": {
        "train": {"path": "wikitext-2-raw/wiki.train.raw", "size": 10940747,
                  "sha256": "6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57"},
        "valid": {"path": "wikitext-2-raw/wiki.valid.raw", "size": 1146846,
                  "sha256": "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7"},
        "test": {"path": "wikitext-2-raw/wiki.test.raw", "size": 1290590,
                 "sha256": "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08"},
    },
}

#: Byte-identical copies of the archive; the original S3 address is listed last.
WIKITEXT2_MIRRORS = (
    "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip",
    "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
    "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-raw-v1.zip",
)
#: Extraction bound: no member may expand beyond this (the real ones are under 11 MB).
MAX_MEMBER_BYTES = 64 * 1024 * 1024


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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch_hint(directory: Path) -> str:
    return (
        f"put the WikiText-2 raw v1 files under {directory / 'wikitext-2-raw'} "
        f"or run: harness data fetch wikitext-2 --dir {directory}"
    )


def verify_wikitext2(directory: Path, pins: dict[str, Any] | None = None) -> dict[str, Path]:
    """Check every WikiText-2 file's size and sha256; return the split paths or raise DataError."""
    pins = pins or WIKITEXT2_PINS
    out: dict[str, Path] = {}
    for split, pin in pins["members"].items():
        path = directory / pin["path"]
        if not path.is_file():
            raise DataError(f"missing corpus file {path} (expected {pin['size']} bytes, sha256 {pin['sha256']}); "
                            + _fetch_hint(directory))
        size = path.stat().st_size
        digest = sha256_file(path)
        if size != pin["size"] or digest != pin["sha256"]:
            raise DataError(
                f"corpus file {path} does not verify: expected {pin['size']} bytes with sha256 {pin['sha256']}, "
                f"found {size} bytes with sha256 {digest}; refusing to use unverified bytes. " + _fetch_hint(directory)
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


def load_corpus(name: str, data_dir: str | Path | None = None) -> Corpus:
    """Load a corpus by name. WikiText-2 is verified before any byte is returned."""
    if name == "pydoc-topics":
        return _pydoc_topics()
    if name == "wikitext-2":
        directory = Path(data_dir) if data_dir else default_data_dir()
        paths = verify_wikitext2(directory)
        return Corpus(name, *(paths[s].read_bytes() for s in SPLITS))
    raise InputError(f"unknown corpus {name!r} (known: {', '.join(CORPORA)})")


# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------


def fetch_wikitext2(
    directory: Path, urls: list[str] | None = None, pins: dict[str, Any] | None = None, timeout: float = 60.0
) -> tuple[str, dict[str, Path]]:
    """Download, verify and place WikiText-2 raw v1 atomically; return the URL used and paths.

    The archive's size and sha256 are checked before extraction; each member is size-bounded,
    verified, written to a temporary file and renamed into place. Existing verified files are
    kept. Tries each URL in order.
    """
    pins = pins or WIKITEXT2_PINS
    try:
        return "already present", verify_wikitext2(directory, pins)
    except DataError:
        pass
    errors: list[str] = []
    for url in urls or list(WIKITEXT2_MIRRORS):
        try:
            blob = _download(url, pins["archive"]["size"], timeout)
        except OSError as e:
            errors.append(f"{url}: {e}")
            continue
        digest = hashlib.sha256(blob).hexdigest()
        if len(blob) != pins["archive"]["size"] or digest != pins["archive"]["sha256"]:
            errors.append(
                f"{url}: archive has {len(blob)} bytes, sha256 {digest}; expected {pins['archive']['size']} "
                f"bytes, sha256 {pins['archive']['sha256']}"
            )
            continue
        _extract(blob, directory, pins)
        return url, verify_wikitext2(directory, pins)
    raise DataError("could not fetch WikiText-2 raw v1:\n  " + "\n  ".join(errors) + "\n" + _fetch_hint(directory))


def _download(url: str, expected: int, timeout: float) -> bytes:
    limit = expected + 1
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - URLs are the user's or pinned
        data = r.read(limit)
    if len(data) >= limit:
        raise OSError(f"archive larger than the expected {expected} bytes")
    return data


def _extract(blob: bytes, directory: Path, pins: dict[str, Any]) -> None:
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        names = set(zf.namelist())
        for pin in pins["members"].values():
            member = pin["path"]
            if member not in names:
                raise DataError(f"archive lacks {member}")
            info = zf.getinfo(member)
            if info.file_size > MAX_MEMBER_BYTES or info.file_size != pin["size"]:
                raise DataError(f"archive member {member} has {info.file_size} bytes, expected {pin['size']}")
            target = directory / member
            target.parent.mkdir(parents=True, exist_ok=True)
            h = hashlib.sha256()
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".fetch-")
            try:
                with os.fdopen(fd, "wb") as out, zf.open(member) as src:
                    written = 0
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        written += len(chunk)
                        if written > pin["size"]:
                            raise DataError(f"archive member {member} expands beyond {pin['size']} bytes")
                        h.update(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                if h.hexdigest() != pin["sha256"]:
                    raise DataError(f"archive member {member} has sha256 {h.hexdigest()}, expected {pin['sha256']}")
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)


def load_pins(path: Path) -> dict[str, Any]:
    """Pins from a JSON file with the shape of :data:`WIKITEXT2_PINS` (for mirrors and tests)."""
    try:
        pins = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"not a readable JSON pins file: {e}", file=str(path)) from e
    archive = pins.get("archive") if isinstance(pins, dict) else None
    members = pins.get("members") if isinstance(pins, dict) else None
    if not isinstance(archive, dict) or not isinstance(members, dict) or set(members) != set(SPLITS):
        raise InputError("pins need 'archive' and 'members' with train, valid and test", file=str(path))
    for key, entry in [("archive", archive)] + [(f"members.{k}", v) for k, v in members.items()]:
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str):
            raise InputError("each entry needs an integer 'size' and a 'sha256' string", file=str(path), key=key)
        if key != "archive" and not isinstance(entry.get("path"), str):
            raise InputError("each member needs a 'path'", file=str(path), key=key)
    return pins


# --------------------------------------------------------------------------------------------
# Batches and evaluation
# --------------------------------------------------------------------------------------------


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class BatchStream:
    """Random training windows of ``context + 1`` bytes from a generator seeded by the run seed alone.

    Both arms of a pair draw exactly the same sequence of batches.
    """

    def __init__(self, train: bytes, context: int, batch_size: int, seed: int) -> None:
        if len(train) < context + 2:
            raise DataError(f"training split has {len(train)} bytes; needs more than context + 1 = {context + 1}")
        self.data = as_tensor(train)
        self.context = context
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(context + 1)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - self.context - 1, (self.batch_size,), generator=self.gen)
        window = self.data[starts[:, None] + self.offsets]  # (B, T + 1)
        return window[:, :-1], window[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()


def eval_windows(split: bytes, context: int, max_windows: int | None = None) -> list[tuple[int, int]]:
    """(start, length) of the consecutive evaluation windows; each predicts ``length`` bytes."""
    n_pred = len(split) - 1
    out = []
    start = 0
    while start < n_pred and (max_windows is None or len(out) < max_windows):
        out.append((start, min(context, n_pred - start)))
        start += context
    return out


@torch.no_grad()
def bits_per_byte(
    model: torch.nn.Module, split: bytes, context: int, batch_size: int, device: torch.device,
    max_windows: int | None = None,
) -> tuple[float, int]:
    """Exact bits per byte of ``split`` (or its first ``max_windows`` windows); returns (bpb, bytes).

    Windows of equal length are batched in order; the sum is accumulated in float64 on the host
    in a fixed order, so the same weights give the same bits on the same device.
    """
    was_training = model.training
    model.eval()
    data = as_tensor(split)
    windows = eval_windows(split, context, max_windows)
    total_nll = 0.0
    total_bytes = 0
    i = 0
    while i < len(windows):
        length = windows[i][1]
        j = i
        while j < len(windows) and j - i < batch_size and windows[j][1] == length:
            j += 1
        starts = torch.tensor([w[0] for w in windows[i:j]])
        idx = starts[:, None] + torch.arange(length + 1)
        block = data[idx].to(device)  # (b, length + 1)
        logits = model(block[:, :-1])
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), block[:, 1:].reshape(-1), reduction="none")
        total_nll += float(nll.double().sum().cpu())
        total_bytes += nll.numel()
        i = j
    model.train(was_training)
    if total_bytes == 0:
        raise DataError("evaluation split has no bytes to predict")
    return total_nll / (math.log(2) * total_bytes), total_bytes
