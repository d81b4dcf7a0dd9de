"""A runner's anchors and signature: what binds the ledger outside the records folder.

* The ledger head is pushed to ``refs/ledger/protocol-<id>`` of the anchor remote
  (:func:`harness.gitutil.anchor`) before each worker starts and after each unit, so deleting an
  unfinished attempt's entry, or a finished unit, is named by the audit's ``--anchor``.
* The tag object's raw bytes are kept as ``TAG`` in the records folder: a clone or copy that lost the
  tag ref still carries the tag, and the audit checks those bytes.
* Every unit done under a signed protocol tag, the ledger head is signed the same way
  (:func:`harness.freeze.sign_result`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness import freeze, gitutil
from harness.ledger import Ledger
from harness.protocol import Protocol
from prereg.errors import HarnessError
from prereg.formats.record import TAG_FILE, atomic_write


class Anchoring:
    """The anchors of one runner (``remote``: ``harness run --anchor``, None for none) and the
    result's signature. ``echo`` receives what each push and signature did."""

    def __init__(self, proto: Protocol, remote: str | None, echo: Callable[[str], None]) -> None:
        self.proto = proto
        self.remote = remote
        self.echo = echo
        self.anchored = 0  # the last seq this runner anchored

    def push(self, ledger: Ledger, frozen: freeze.Frozen) -> None:
        """Push the ledger head to the anchor remote (a failure is said, and the next push carries it)."""
        if not self.remote:
            return
        head = ledger.head()
        if head["seq"] in (0, self.anchored):
            return
        self.anchored = head["seq"]
        problem = gitutil.anchor(
            self.proto.root,
            self.remote,
            f"refs/ledger/{self.proto.spec.tag_name}",
            self.proto.spec.id,
            frozen.freeze_sha256 or self.proto.sha256,
            head["seq"],
            head["sha256"],
        )
        if problem:
            self.echo(f"  anchor: WARNING: {problem}")
        else:
            self.echo(f"  anchored seq {head['seq']} in {self.remote}")

    def keep_tag(self, records: Path, frozen: freeze.Frozen) -> None:
        """Keep the tag object's raw bytes as ``TAG`` in the records folder: a clone or copy that
        lost the tag ref (a branch pushed without tags) still carries the tag, and the audit checks
        those bytes against the object id the records name and the commit in the repository."""
        if frozen.tag_object is None:
            return
        raw = gitutil.tag_object(self.proto.root, frozen.tag_object)
        path = records / TAG_FILE
        if raw is not None and (not path.exists() or path.read_bytes() != raw):
            atomic_write(path, raw, overwrite=True)

    def sign(self, ledger: Ledger, frozen: freeze.Frozen) -> None:
        """Every unit done, under a signed protocol tag: sign the ledger head the same way
        (:func:`harness.freeze.sign_result`); a failure is said, and ``harness report --sign``
        signs it later."""
        raw = gitutil.tag_object(self.proto.root, frozen.tag_object) if frozen.tag_object else None
        if raw is None or b"-----BEGIN " not in raw:
            return
        head = ledger.head()
        try:
            self.echo(freeze.sign_result(self.proto, head["seq"], head["sha256"]))
        except HarnessError as e:
            self.echo(f"  result: WARNING: the ledger head was not signed: {e}")
