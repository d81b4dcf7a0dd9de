"""The command line: its arguments, every records folder audited (:mod:`.folder`), the table of
checks, the notes and problems, and the last line on how far the chain is anchored."""

from __future__ import annotations

import argparse
import os
import re
import sys

from audit.anchors import roots_from_repository, signers_problem
from audit.folder import UNCHECKED, audit_dir
from prereg.tag import remote_problem


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="public_audit.py",
        description="Verify a study's records with the Python standard library "
        "alone: hashes, the ledger, the tag and what it froze, and every statistic recomputed "
        "(docs/provenance.md).",
    )
    ap.add_argument(
        "dirs",
        nargs="*",
        metavar="RECORDS_DIR",
        help="records folders (default: every folder under records/ that holds a MANIFEST)",
    )
    ap.add_argument(
        "--head",
        metavar="SEQ:SHA256",
        help="a ledger head you published: its seq and full 64-hex-digit sha256 must be in the chain",
    )
    ap.add_argument(
        "--anchor",
        metavar="REMOTE",
        help="a git remote whose refs/ledger/protocol-<id> holds the heads harness run --anchor pushed",
    )
    ap.add_argument(
        "--allowed-signers",
        metavar="FILE",
        help="git's allowed-signers file to verify a signed protocol tag against",
    )
    return ap.parse_args(argv)


class _Refused(Exception):
    """A command line the audit refuses: the line it prints and its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def _options(args: argparse.Namespace) -> tuple[tuple[int, str] | None, str | None, str | None, list[str]]:
    """The published head, the anchor remote, the allowed-signers file and the records folders the
    arguments name; raises :class:`_Refused` for a malformed head, a missing file or folder."""
    published = None
    head, anchor, signers = args.head, args.anchor, args.allowed_signers
    if head is not None:
        seq, _, sha = head.partition(":")
        if not seq.isdigit() or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise _Refused(
                "public audit: --head takes SEQ:SHA256, the full 64-hex-digit sha256 of the ledger head "
                "you published (a prefix can be matched by a forged chain)",
                2,
            )
        published = (int(seq), sha)
    if anchor is not None and remote_problem(anchor) is not None:
        raise _Refused(f"public audit: --anchor {anchor}: {remote_problem(anchor)}", 2)
    if anchor is not None and os.path.exists(anchor):
        anchor = os.path.abspath(anchor)
    if signers is not None and not os.path.lexists(signers):
        raise _Refused(f"public audit: --allowed-signers {signers}: no such file", 2)
    if signers is not None and signers_problem(signers) is not None:
        raise _Refused(f"public audit: --allowed-signers {signers}: {signers_problem(signers)}", 2)
    dirs = args.dirs
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        raise _Refused(f"public audit: {', '.join(missing)}: no such records folder", 2)
    return published, anchor, signers, dirs or _default_dirs()


def _default_dirs() -> list[str]:
    """Every folder under records/ that holds a MANIFEST; raises :class:`_Refused` where none does."""
    base = "records"
    dirs = (
        sorted(
            os.path.join(base, d)
            for d in os.listdir(base)
            if os.path.isfile(os.path.join(base, d, "MANIFEST"))
        )
        if os.path.isdir(base)
        else []
    )
    if not dirs:
        raise _Refused("public audit: no records folders with a MANIFEST under records/ (pass a folder)", 1)
    return dirs


def main(argv: list[str]) -> int:
    try:
        published, anchor, signers, dirs = _options(parse_args(argv))
    except _Refused as e:
        print(e.message)
        return e.status
    borrowed = roots_from_repository(dirs, signers, published)
    _print_borrowed(borrowed)
    rows: list[tuple[str, str, str]] = []
    problems: list[str] = []
    notes: list[str] = []
    anchored: dict[str, int] = {}
    unverified: dict[str, list[str]] = {}
    todo = list(dirs)  # grows by the earlier studies the pages show beside their own, each audited too
    done: set[str] = set()
    for d in todo:
        if os.path.realpath(d) in done:
            continue
        done.add(os.path.realpath(d))
        audit_dir(
            d,
            rows,
            problems,
            notes,
            published,
            anchor=anchor,
            signers=signers,
            anchored=anchored,
            unverified=unverified,
            besides=todo,
        )
    _print_findings(rows, notes, problems)
    reasons = [f"{d}: {w}" for d, ws in unverified.items() for w in ws]
    if borrowed:
        reasons.insert(0, "the trust roots came from the repository itself (see the first lines)")
    status = _status(problems, notes, reasons)
    keys = sorted({k for row in rows for k in re.findall(r"key (SHA256:[A-Za-z0-9+/]+)", row[2])})
    print(
        verified_line(
            reasons, signers, status, anchored=published is not None or anchor is not None, keys=keys
        )
    )
    print(anchor_line(published, anchor, anchored))
    if borrowed:
        print(
            "TRUST ROOTS FROM THE REPOSITORY (see the first lines): pass the allowed-signers file you hold "
            "from the maintainers, from outside the repository."
        )
    return status


def _print_borrowed(borrowed: list[str]) -> None:
    """The warning first, where the trust roots came from the repository itself."""
    if not borrowed:
        return
    print(
        "TRUST ROOTS FROM THE REPOSITORY: what follows proves only that the repository agrees with "
        "itself, not that it is the study that was published (exit status 3):"
    )
    for b in borrowed:
        print(f"- {b}")
    print()


def _status(problems: list[str], notes: list[str], reasons: list[str]) -> int:
    """The exit status: 1 for a problem, 4 for a redrawn run, :data:`NOT_VERIFIED` for a reason the
    reader's keys do not vouch, else 0."""
    if problems:
        return 1
    if any("REDRAWN:" in n for n in notes):
        return 4
    return NOT_VERIFIED if reasons else 0


def _print_findings(rows: list[tuple[str, str, str]], notes: list[str], problems: list[str]) -> None:
    """The table of checks, the notes, and the problems or the line that everything matched."""
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    print(f"{'check'.ljust(w1)}  {'records'.ljust(w2)}  result")
    for check, d, result in rows:
        print(f"{check.ljust(w1)}  {d.ljust(w2)}  {result}")
    if notes:
        print("\nPlanned runs and their records:")
        for n in notes:
            print(f"  {n}")
    print("\nThis audit does not run training and does not check weight files (they stay local).")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print(f"- {p}")
        return
    unchecked = sorted({d for _, d, result in rows if result.startswith(UNCHECKED)})
    if unchecked:  # nothing of theirs was read: no line may say that it matched
        print(f"Integrity: NOT CHECKED: {', '.join(unchecked)} (a records schema newer than this auditor).")
        return
    print("Integrity: everything matched." + _matched_but(notes))


#: What a note's marker adds to the line that everything matched, in the order the line says it.
_MATCHED_BUT = (
    ("INCOMPLETE:", " The study is INCOMPLETE (see above)."),
    ("STOPPED BY THE BUDGET RULE:", " The study was STOPPED BY THE BUDGET RULE (see above)."),
    ("STOPPED BY THE FAILURE RULE:", " The study was STOPPED BY THE FAILURE RULE (see above)."),
    (
        "REDRAWN:",
        " Some runs were REDRAWN (see above): the records are intact, but an earlier attempt "
        "of each could have been seen before it was run again (exit status 4).",
    ),
)


def _matched_but(notes: list[str]) -> str:
    """What the line that everything matched adds for the notes: incomplete, a stop, a redraw."""
    return "".join(text for marker, text in _MATCHED_BUT if any(marker in n for n in notes))


#: Exit status of an audit whose records matched but whose study the reader's own keys do not vouch
#: for: no roots, roots from the repository, an unsigned tag or head, or a head short of the chain's.
NOT_VERIFIED = 3


def verified_line(
    reasons: list[str],
    signers: str | None,
    status: int = 0,
    *,
    anchored: bool = True,
    keys: list[str] | None = None,
) -> str:
    """Whether the reader's keys vouch for every study audited: its protocol tag and its ledger
    head both signed by a key of the allowed-signers file the reader passed, and nothing failed
    (exit status 0, the only status this line says "Verified" under; without an anchor or a
    published head it adds that a key holder's redraw cannot be excluded), or why not
    (``NOT VERIFIED``: the records failed, runs were redrawn, or ``reasons``). ``keys``: the
    fingerprints of the keys that verified, which the reader compares with those they hold."""
    if status == 1:
        return "NOT VERIFIED (exit status 1): the records failed the checks above (see the problems)."
    if status == 4:
        return "NOT VERIFIED (exit status 4): some runs were REDRAWN (see above)."
    if not reasons:
        return (
            f"Verified: each study's protocol tag and ledger head are signed by keys of {signers}, which "
            f"you passed from outside the repository: {', '.join(keys or ['(no key named)'])}. Compare each "
            "fingerprint with the maintainers' as you hold it from outside (their site, a key server, a "
            "code host's published keys): the file is only as good as where its keys came from."
            + (
                ""
                if anchored
                else " Keys alone cannot show what their holder did before signing: without an anchor "
                "(--anchor) or a head published at the time (--head), a key holder's redraw (a run killed, "
                "its started entry deleted, the study resumed and signed again) cannot be excluded."
            )
        )
    return (
        f"NOT VERIFIED (exit status {NOT_VERIFIED} when nothing failed): the records agree with "
        "themselves, but nothing you hold vouches for them: " + "; ".join(reasons) + "."
    )


def anchor_line(published: tuple[int, str] | None, anchor: str | None, anchored: dict[str, int]) -> str:
    """The last line: how far the chain is anchored outside the records, or that it is not."""
    if published is None and anchor is None:
        return (
            "NOT ANCHORED: no published head (--head SEQ:SHA256) and no anchor ref (--anchor REMOTE) "
            "were given, so nothing here shows that the records were not redrawn and resealed after the "
            "fact."
        )
    parts = []
    if published is not None:
        parts.append(f"the published head seq {published[0]}")
    if anchor is not None:
        parts.append(
            f"the anchor ref in {anchor} (up to seq {', '.join(str(v) for v in anchored.values()) or 0})"
        )
    return (
        f"Anchored: the chain was checked against {' and '.join(parts)}; records after that are not anchored."
    )


def entry(argv: list[str]) -> int:
    """:func:`main`, with a reader who closes the pipe (``| head``) answered 141, not a traceback."""
    try:
        status = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader closed the pipe: not an error of the audit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 141
    return status
