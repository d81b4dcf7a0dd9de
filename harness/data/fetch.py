"""Downloading WikiText-2 raw v1: size-bounded, verified, placed atomically."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from harness.data.corpora import WIKITEXT2_PINS, Pins, fetch_hint, verify_wikitext2
from harness.names import SPLITS
from prereg.errors import DataError, InputError

#: Byte-identical copies of the archive; the original S3 address is listed last.
WIKITEXT2_MIRRORS = (
    "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip",
    "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
    "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-raw-v1.zip",
)
#: Extraction bound: no member may expand beyond this (the real ones are under 11 MB).
MAX_MEMBER_BYTES = 64 * 1024 * 1024


def fetch_wikitext2(
    directory: Path, urls: list[str] | None = None, pins: Pins | None = None, timeout: float = 60.0
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
    raise DataError(
        "could not fetch WikiText-2 raw v1:\n  " + "\n  ".join(errors) + "\n" + fetch_hint(directory)
    )


def _download(url: str, expected: int, timeout: float) -> bytes:
    limit = expected + 1
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - URLs are the user's or pinned
        data = r.read(limit)
    if len(data) >= limit:
        raise OSError(f"archive larger than the expected {expected} bytes")
    return data


def _extract(blob: bytes, directory: Path, pins: Pins) -> None:
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
                    raise DataError(
                        f"archive member {member} has sha256 {h.hexdigest()}, expected {pin['sha256']}"
                    )
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)


def load_pins(path: Path) -> Pins:
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
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int)
            or not isinstance(entry.get("sha256"), str)
        ):
            raise InputError(
                "each entry needs an integer 'size' and a 'sha256' string", file=str(path), key=key
            )
        if key != "archive" and not isinstance(entry.get("path"), str):
            raise InputError("each member needs a 'path'", file=str(path), key=key)
    return pins
