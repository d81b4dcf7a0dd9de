"""The published study as a reader meets it: a fresh clone audits with no argument, and the README's
result table is the committed report's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

STUDY = ROOT / "records" / "cpu1"


def _tracked(path: Path) -> bool:
    r = subprocess.run(
        ["git", "ls-files", "--error-unmatch", str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


@pytest.mark.skipif(not (STUDY / "MANIFEST").is_file(), reason="records/cpu1 is not in this checkout")
@pytest.mark.parametrize("tags", [True, False], ids=["with-tags", "branch-only"])
def test_a_fresh_clone_audits_every_committed_study(tmp_path, tags):
    """`python analysis/public_audit.py` with no argument, as the README and CI run it, in a clone
    (with the tags, and without them: the records folder carries the tag object)."""
    if not _tracked(STUDY / "MANIFEST"):
        pytest.skip("records/cpu1 is not committed here")
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", *([] if tags else ["--no-tags"]), str(ROOT), str(clone)], check=True
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "analysis/public_audit.py"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Integrity: everything matched." in out.stdout
    assert "records/cpu1" in out.stdout
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed: the audit passed; its signature check could not run here")
    signed = subprocess.run(
        [
            sys.executable,
            "analysis/public_audit.py",
            "records/cpu1",
            "--allowed-signers",
            "protocols/allowed_signers",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert signed.returncode == 0, signed.stdout
    assert "good SSH signature" in signed.stdout


@pytest.mark.skipif(not (STUDY / "report.md").is_file(), reason="records/cpu1 is not in this checkout")
def test_the_readme_result_table_is_the_committed_report_s():
    readme = (ROOT / "README.md").read_text()
    report = (STUDY / "report.md").read_text()
    section = readme.split("## The result", 1)[1].split("## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "Configuration" not in line]
    assert len(rows) == 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        times, reduction, interval, faster = cells[3], cells[4], cells[5], cells[6]
        want = f"| {times} | {reduction} | {interval.replace(' to ', '–')} | {faster} |"
        assert want in report, f"README row {cells[0]!r}: {want} is not in records/cpu1/report.md"
    head = re.search(r"--head (\d+):([0-9a-f]{64})", section)
    assert head is not None
    chain = subprocess.run(
        [
            sys.executable,
            "analysis/public_audit.py",
            "records/cpu1",
            "--head",
            f"{head.group(1)}:{head.group(2)}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert chain.returncode == 0, chain.stdout


@pytest.mark.process
@pytest.mark.skipif(not (STUDY / "index.html").is_file(), reason="records/cpu1 is not in this checkout")
def test_the_committed_study_page_is_valid_and_renders():
    from pagecheck import check_page

    check_page(STUDY / "index.html", ("pairs", "published", "factorial", "null_aa"))
