"""The published studies as a reader meets them: a fresh clone audits with no argument, and the
README's result table is the committed studies' (cpu3's, with cpu2's beside it)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from audit.cli import NOT_VERIFIED

STUDY = ROOT / "records" / "cpu1"
CPU2 = ROOT / "records" / "cpu2"
CPU3 = ROOT / "records" / "cpu3"


def _tracked(path: Path) -> bool:
    r = subprocess.run(
        ["git", "ls-files", "--error-unmatch", str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


def _tags(repo: Path) -> list[str]:
    return subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", "refs/tags"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.mark.skipif(not (STUDY / "MANIFEST").is_file(), reason="records/cpu1 is not in this checkout")
def test_a_fresh_clone_audits_every_committed_study(tmp_path):
    """`python analysis/public_audit.py` with no argument, as the README and CI run it, in a clone
    with the tags, and in one without them (``--no-tags``: the records folder carries the tag
    object). Where this repository holds no tag, the two clones are the same repository (the same
    refs and objects), so the one clone is both and is audited once (an audit of every folder is
    about a minute of CPU); with tags here, the ``--no-tags`` clone is made and audited too."""
    if not _tracked(STUDY / "MANIFEST"):
        pytest.skip("records/cpu1 is not committed here")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert _tags(clone) == _tags(ROOT)
    signatures = _audits_as_published(clone, tmp_path / "with-tags")
    if _tags(ROOT):
        bare = tmp_path / "branch-only"
        subprocess.run(["git", "clone", "-q", "--no-tags", str(ROOT), str(bare)], check=True)
        assert _tags(bare) == []
        signatures = _audits_as_published(bare, tmp_path / "branch-only-trusted") and signatures
    if not signatures:
        pytest.skip("ssh-keygen is not installed: the audit passed; its signature check could not run here")


def _audits_as_published(clone: Path, trusted: Path) -> bool:
    """The public audit with no argument in ``clone`` matches every committed study and ends NOT
    VERIFIED; records/cpu1's tag verifies against the reader's own copy of the maintainers' keys
    (written under ``trusted``), and the repository's own file is refused as a trust root. False
    where ssh-keygen is missing, so the signature check could not run."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "analysis/public_audit.py"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # 4: a run drawn again after an interrupted attempt, named (records/calibration-tost-loaded's one
    # attempt stopped when it paused for cpu3's replicate 2; .ci/run accepts the same)
    redrawn = [line for line in out.stdout.splitlines() if "REDRAWN:" in line]
    assert out.returncode == (4 if redrawn else NOT_VERIFIED), out.stdout + out.stderr
    assert all("records/calibration-tost-loaded:" in line for line in redrawn), redrawn
    assert "Integrity: everything matched." in out.stdout
    assert "records/cpu1" in out.stdout and "records/cpu2" in out.stdout
    if shutil.which("ssh-keygen") is None:
        return False
    mine = trusted / "allowed_signers"  # the reader's own copy, outside the clone
    mine.parent.mkdir()
    # the reader's own file: the maintainers' keys under the reader's principal name (a byte copy of
    # the repository's file counts as taken from the repository)
    keys = [
        line.split(" ", 1)[1] for line in (ROOT / "protocols" / "allowed_signers").read_text().splitlines()
    ]
    mine.write_text("".join(f"release-keys {k}\n" for k in keys if k.strip()))

    def signed(signers: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "analysis/public_audit.py", "records/cpu1", "--allowed-signers", signers],
            cwd=clone,
            capture_output=True,
            text=True,
            timeout=600,
        )

    held = signed(str(mine))
    assert held.returncode == NOT_VERIFIED, held.stdout
    assert (
        "good SSH signature by release-keys" in held.stdout
        and "TRUST ROOTS FROM THE REPOSITORY" not in held.stdout
    )
    assert "records/cpu1: no signed result head" in held.stdout  # signed heads came later
    borrowed = signed("protocols/allowed_signers")  # the repository's own file proves nothing
    assert borrowed.returncode == 3, borrowed.stdout
    assert borrowed.stdout.startswith("TRUST ROOTS FROM THE REPOSITORY")
    assert "--allowed-signers protocols/allowed_signers lies inside" in borrowed.stdout
    return True


def _points(est: float, low: float, high: float) -> str:
    """A README cell: points with their interval, ``+0.62 (+0.31 to +0.93)``."""
    return f"{est:+.2f} ({low:+.2f} to {high:+.2f})"


def _replicated(decision: dict, level: float = 0.99) -> str:
    """A decision by the t over replicates at ``level``, in points, from its sealed estimate and SE."""
    from scipy import stats

    t = decision["test"]
    half = 100 * stats.t.ppf(0.5 + level / 2, t["df"]) * t["standard_error"]
    est = 100 * t["estimate"]
    return _points(est, est - half, est + half)


@pytest.mark.skipif(not (CPU3 / "summary.json").is_file(), reason="records/cpu3 is not in this checkout")
def test_the_readme_result_table_is_the_committed_studies():
    """Each row of the README's result: cpu3's decisions at 99% (scipy's t over the sealed standard
    error), its times as report.md has them, the decisions' outcome, and cpu2's CPU-clock change
    in points from its sealed summary; the verify commands take their roots from outside."""
    import json

    readme = (ROOT / "README.md").read_text()
    report3 = (CPU3 / "report.md").read_text()
    s3 = json.loads((CPU3 / "summary.json").read_text())
    s2 = json.loads((CPU2 / "summary.json").read_text())
    decisions = {d["id"]: d for d in s3["hypotheses"]["decisions"]}
    cpu2 = {c["config"]: c for st in s2["studies"] if st["name"] == "pairs" for c in st["configs"]}
    section = readme.split("## The result", 1)[1].split("## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "Configuration" not in line]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        config = "tiny_" + cells[0].split()[-1].lower()
        cpu, wall = decisions[f"H1-cpu-{config}"], decisions[f"H4-speed-{config}"]
        assert cells[3] == _replicated(cpu) and cells[4] == _replicated(wall), row
        native, cand = cells[2].removesuffix(" s").split(" / ")
        assert (
            f"| {config} | {cells[1]} | CPU, steps after its own | native {native} / cotangent {cand} |"
            in report3
        )
        both = {cpu["status"], wall["status"]}
        assert cells[5] == (
            "faster: established on both clocks" if both == {"established"} else "faster: not established"
        )
        if both != {"established"}:
            assert "established" not in both
        i = cpu2[config]["training_cpu_time"]["interval"]
        assert cells[6] == _points(*(100 * math.log(i[k]) for k in ("ratio", "ratio_low", "ratio_high"))), row
    # the quality claim as tested: identical test bits per byte in every pair of every model
    pairs: dict[str, dict[str, float]] = {}
    for r in s3["runs"]:
        if r["study"] == "pairs":
            pairs.setdefault(r["unit"], {})[r["role"]] = r["test_bpb"]
    assert len(pairs) == 480 and all(p["baseline"] == p["candidate"] for p in pairs.values())
    assert "identical in 120 of 120 pairs of each model" in " ".join(section.split())
    # the verify commands take their trust roots from outside the repository: no head, no signers file of it
    assert not re.search(r"[0-9a-f]{64}", readme), "the README prints a ledger head: a reader would copy it"
    commands = re.findall(r"python -I -S -B analysis/public_audit.py (records/cpu\d) (.*)", section)
    assert {c[0] for c in commands} == {"records/cpu1", "records/cpu2", "records/cpu3"}, commands
    for _folder, args in commands:
        assert "--allowed-signers ~/trusted/allowed_signers" in args and "--head SEQ:SHA256" in args
        assert "protocols/allowed_signers" not in args


@pytest.mark.process
@pytest.mark.skipif(not (STUDY / "index.html").is_file(), reason="records/cpu1 is not in this checkout")
def test_the_committed_study_page_is_valid_and_renders():
    from pagecheck import check_page

    check_page(STUDY / "index.html", ("pairs", "published", "factorial", "null_aa"))
    check_page(CPU2 / "index.html", ("pairs", "published", "null_aa", "design_paired", "design_block25"))


COMMITTED = sorted(p.parent for p in (ROOT / "records").glob("*/summary.json"))


@pytest.mark.skipif(not COMMITTED, reason="no committed records folder in this checkout")
@pytest.mark.parametrize("folder", COMMITTED, ids=[p.name for p in COMMITTED])
def test_each_committed_study_renders_byte_for_byte_as_committed(folder):
    """Every committed report.md (before its plot links) and index.html is what the one section
    model renders from the folder's sealed summary.json: the renderers' refactors change no byte
    unless the change is named and the texts are rendered again."""
    import json

    from prereg.render.page import published_texts

    report = (folder / "report.md").read_text(encoding="utf-8")
    page = (folder / "index.html").read_text(encoding="utf-8")
    beside = re.search(r"^The same configurations and arms in \S+ \(.*; records `([^`]+)`", report, re.M)
    rendered = published_texts(
        json.loads((folder / "summary.json").read_text(encoding="utf-8")),
        str(folder / "summary.json"),
        re.search(r"<pre><code>python analysis/public_audit\.py (\S+)", page).group(1),
        json.loads((folder / "MANIFEST").read_text(encoding="utf-8")),
        beside_dir=str(ROOT / beside.group(1)) if beside else None,
        beside_label=beside.group(1) if beside else None,
    )
    assert page == rendered["index.html"]
    md = rendered["report.md"]
    links = report[len(md) :]
    assert report.startswith(md) and re.fullmatch(r"(\n(!\[\w+\]\(\w+\.png\)\n)+)?", links), links[:200]


def _fingerprint(blob_b64: str) -> str:
    """OpenSSH's ``SHA256:`` fingerprint of a public key blob (unpadded base64 of its SHA-256)."""
    import base64
    import hashlib

    digest = hashlib.sha256(base64.b64decode(blob_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def test_every_maintainers_key_is_listed_by_fingerprint_where_readers_take_it():
    """Each key of protocols/allowed_signers (the one the issue names among them) has its fingerprint
    in the README and docs/provenance.md; and the stdlib fingerprint is ssh-keygen's."""
    lines = [
        ln.split() for ln in (ROOT / "protocols" / "allowed_signers").read_text().splitlines() if ln.strip()
    ]
    prints = [_fingerprint(parts[3]) for parts in lines]
    assert "SHA256:ctxsbj0QCaU43OQWRqg67wUwDLxI5n9sOAZm7BArmAM" in prints
    assert len(set(prints)) == len(prints) >= 3  # added, none replaced
    for doc in ("README.md", "docs/provenance.md"):
        text = (ROOT / doc).read_text()
        assert [f for f in prints if f not in text] == [], doc
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed: the fingerprints were checked against the documents only")
    for parts in lines:
        out = subprocess.run(
            ["ssh-keygen", "-lf", "-"], input=" ".join(parts[2:4]), capture_output=True, text=True, check=True
        )
        assert out.stdout.split()[1] == _fingerprint(parts[3])
