"""Bounded input: a YAML alias bomb, a recursive alias, a 13 MB protocol, 10^8 seeds, 5000-deep
nesting (block and flow), a byte order mark and a margin that is not a finite number are refused
by ``harness plan`` with the file (and the key and line where there is one), quickly, and never a
traceback; a closed pipe is not an error. Real subprocesses of the CLI, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, tiny_protocol


def plan(repo: Path, text: str) -> tuple[subprocess.CompletedProcess[str], float]:
    p = repo / "protocols" / "tiny.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "plan", str(p)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r, time.monotonic() - t0


BOMB = "".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x]\n"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)]
)


@pytest.mark.parametrize(
    ("case", "says", "line"),
    [
        ("alias bomb", "anchors (&) and aliases (*) are not allowed", 1),
        ("recursive alias", "anchors (&) and aliases (*) are not allowed", 1),
        ("13 MB protocol", "a protocol or configuration file is at most 1048576 bytes", None),
        ("10^8 seeds", "at most 10000 seeds in a study", True),
        # was: a RecursionError traceback after 14.8 s (PyYAML's composer recurses)
        ("5000-deep nesting", "nested deeper than 64 levels", "- - - -"),
        ("5000-deep flow nesting", "nested deeper than 64 levels", "flow:"),
        ("byte order mark", "starts with a UTF-8 byte order mark", 1),
        ("infinite margin", "'margin' must be a finite number, got inf", "margin:"),
        ("NaN margin", "'margin' must be a finite number, got nan", "margin:"),
        ("10^400 margin", "'margin' must be a finite number", "margin:"),
    ],
)
def test_unbounded_input_is_refused_quickly_naming_the_file(tmp_path, case, says, line):
    import shutil

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    text = tiny_protocol()
    if case == "alias bomb":
        text = BOMB + text
    elif case == "recursive alias":
        text = "loop: &loop [*loop]\n" + text
    elif case == "13 MB protocol":
        text = text + "# " + "x" * (13 << 20) + "\n"
    elif case == "5000-deep nesting":
        text = text + "notes:\n  " + "- " * 5000 + "x\n"
    elif case == "5000-deep flow nesting":
        text = text + "flow: " + "[" * 5000 + "]" * 5000 + "\n"
    elif case == "byte order mark":
        text = "\ufeff" + text
    elif case.endswith("margin"):
        value = {"infinite margin": ".inf", "NaN margin": ".nan", "10^400 margin": "1" + "0" * 400}[case]
        text = text.replace("margin: 0.01", f"margin: {value}")
    else:
        assert "seeds: [1, 2]" in text
        text = text.replace("seeds: [1, 2]", "seeds: {count: 100000000, base: 0}")
    r, took = plan(tmp_path, text)
    p = tmp_path / "protocols" / "tiny.yaml"
    assert r.returncode == 2, r.stdout[-500:] + r.stderr[-2000:]
    assert says in r.stderr and str(p) in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    if line is True or isinstance(line, str):
        needle = "count: 100000000" if line is True else line
        assert f"{p}:{next(i + 1 for i, s in enumerate(text.splitlines()) if needle in s)}" in r.stderr
    elif line:
        assert f"{p}:{line}" in r.stderr
    assert took < 30, took  # was: past two minutes (a hang), or a RecursionError traceback


def test_a_closed_pipe_is_not_an_error(tmp_path):
    """``harness plan ... | head -1``: the reader went away; nothing more to say, exit 0 as
    ``head`` leaves it, no "Broken pipe" line."""
    import shutil

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    p = tmp_path / "protocols" / "tiny.yaml"
    p.parent.mkdir(parents=True)
    p.write_text(tiny_protocol())
    r = subprocess.run(
        f"{sys.executable} -m harness.cli plan {p} | head -c 1 >/dev/null; echo rc=${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Broken pipe" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "rc=0" in r.stdout or "rc=141" in r.stdout, r.stdout


def _attack_reads(r: Path, mine: Path, tmp_path: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each read the review drove past the bounded reader, set up in the study ``r`` and undone:
    the public audit's answer to each (a FIFO would hang an unbounded read: the timeout says so)."""
    import json
    import os

    from test_integrity import RECS, audit

    out = {}
    manifest = r / RECS / "MANIFEST"
    kept = manifest.read_bytes()
    m = json.loads(kept)
    m["protocol"]["path"] = "/proc/self/pagemap"
    manifest.write_text(json.dumps(m))
    out["MANIFEST protocol.path /proc/self/pagemap"] = audit(r, "--allowed-signers", str(mine))
    manifest.write_bytes(kept)
    signers = r / "protocols" / "allowed_signers"
    bound = signers.read_bytes()
    signers.unlink()
    signers.symlink_to("/dev/zero")
    out["protocols/allowed_signers -> /dev/zero"] = audit(r, "--allowed-signers", str(mine))
    signers.unlink()
    os.mkfifo(signers)
    out["protocols/allowed_signers a FIFO"] = audit(r, "--allowed-signers", str(mine))
    signers.unlink()
    signers.write_bytes(bound)
    result = r / RECS / "RESULT"
    head = result.read_bytes()
    result.unlink()
    result.symlink_to("/proc/self/pagemap")
    out["RESULT -> /proc/self/pagemap"] = audit(r, "--allowed-signers", str(mine))
    result.unlink()
    result.write_bytes(head)
    fifo = tmp_path / "reader_fifo"
    os.mkfifo(fifo)
    out["--allowed-signers a FIFO"] = audit(r, "--allowed-signers", str(fifo))
    return out


@pytest.mark.process
def test_every_read_of_the_audit_is_bounded_and_named(tmp_path):
    """Issue 59, case 9: MANIFEST's protocol path set to ``/proc/self/pagemap`` (was an OSError
    traceback from prereg/tag.py), ``protocols/allowed_signers`` a link to ``/dev/zero`` (was a
    MemoryError in audit/anchors.py) or a FIFO (was a hang), ``RESULT`` a link to
    ``/proc/self/pagemap`` (was an OSError): each named in one line, no traceback, not exit 0; the
    reader's own signers file a FIFO is refused (exit 2). The untouched study verifies (exit 0)."""
    from test_integrity import audit
    from test_provenance import ssh_signed_study

    r, _, pub, _, _ = ssh_signed_study(tmp_path, 'maintainers@example.invalid namespaces="git"')
    mine = tmp_path / "mine"
    mine.write_text(f"reader {pub}")
    assert audit(r, "--allowed-signers", str(mine)).returncode == 0
    says = {
        "MANIFEST protocol.path /proc/self/pagemap": "",
        "protocols/allowed_signers -> /dev/zero": "protocols/allowed_signers: a symbolic link",
        "protocols/allowed_signers a FIFO": "protocols/allowed_signers: not a regular file",
        "RESULT -> /proc/self/pagemap": "RESULT: a symbolic link",
        "--allowed-signers a FIFO": "reader_fifo: not a regular file",
    }
    for case, got in _attack_reads(r, mine, tmp_path).items():
        assert "Traceback" not in got.stdout + got.stderr, (case, got.stderr[-2000:])
        assert got.returncode in (1, 2), (case, got.returncode, got.stdout[-2000:])
        assert says[case] in got.stdout, (case, got.stdout[-3000:])
    assert audit(r, "--allowed-signers", str(mine)).returncode == 0
