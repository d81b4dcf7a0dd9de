"""Statistics against scipy and R, and the standard-library audit with tamper tests."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
from conftest import ROOT, git, harness, harness_in_process, tiny_protocol
from hypothesis import given, settings
from scipy import stats

from analysis import paired_interval
from audit.cli import NOT_VERIFIED
from prereg.descriptive import Rows, mean_interval
from prereg.factorial import factorial_contrasts
from prereg.formats.ledger import PACKAGES
from prereg.tdist import student_t_ppf


def test_student_t_ppf_against_scipy():
    dfs = sorted({*range(1, 31), 40, 50, 99, 100, 250, 500, 1000, 2500, 10_000, 50_000, 100_000})
    worst = 0.0
    for df in dfs:
        for level in (0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999):
            q = (1 + level) / 2
            ours, ref = student_t_ppf(q, df), float(stats.t.ppf(q, df))
            worst = max(worst, abs(ours - ref) / ref)
            assert student_t_ppf(1 - q, df) == -ours
    assert worst < 1e-10


B = [10.2, 11.5, 9.8, 12.1, 10.9, 11.3]
C = [8.1, 9.0, 8.3, 9.9, 8.8, 9.2]


def test_interval_against_scipy_ttest_rel():
    for level in (0.8, 0.9, 0.99, 0.995):
        ours = paired_interval(B, C, level)
        ci = stats.ttest_rel(C, B).confidence_interval(confidence_level=level)
        assert ours.low == pytest.approx(ci.low, rel=1e-12) and ours.high == pytest.approx(ci.high, rel=1e-12)
        assert ours.df == 5 and ours.n == 6 and ours.estimand == "difference"


def test_interval_against_r():
    # Rscript -e 'b <- c(10.2, 11.5, 9.8, 12.1, 10.9, 11.3); c <- c(8.1, 9.0, 8.3, 9.9, 8.8, 9.2);
    #   r <- t.test(c, b, paired=TRUE, conf.level=0.99); print(r$conf.int, digits=17); print(unname(r$estimate), digits=17);
    #   print(t.test(c, b, paired=TRUE, conf.level=0.9)$conf.int, digits=17)'   (R 4.2.2)
    r99 = (-2.6184263741333669, -1.5482402925333003)
    r90 = (-2.3507440788955409, -1.8159225877711260)
    ours = paired_interval(B, C, 0.99)
    assert ours.estimate == pytest.approx(-2.0833333333333335, rel=1e-13)
    assert (ours.low, ours.high) == pytest.approx(r99, rel=1e-12)
    assert (paired_interval(B, C, 0.9).low, paired_interval(B, C, 0.9).high) == pytest.approx(r90, rel=1e-12)


def test_estimands_and_sign_conventions():
    rr = paired_interval(B, C, 0.99, "relative_reduction")
    lr = paired_interval(B, C, 0.99, "log_ratio")
    assert lr.estimate < 0 and lr.ratio == pytest.approx(math.exp(lr.estimate))
    assert lr.ratio_low < lr.ratio < lr.ratio_high
    # the reduction is 1 - exp of the log ratio's interval (ends swap: the map decreases), not a mean of ratios
    assert (rr.estimate, rr.low, rr.high) == (
        100 * -math.expm1(lr.estimate),
        100 * -math.expm1(lr.high),
        100 * -math.expm1(lr.low),
    )
    assert rr.estimate > 0 and rr.standard_error == lr.standard_error
    swapped = paired_interval(C, B, 0.99, "log_ratio")  # relabelling negates the log ratio exactly
    assert (swapped.estimate, swapped.low, swapped.high) == (-lr.estimate, -lr.high, -lr.low)


def test_interval_errors_and_degenerate():
    with pytest.raises(ValueError, match="at least two"):
        paired_interval([1.0], [2.0])
    with pytest.raises(ValueError, match="equal lengths"):
        paired_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="not finite"):
        paired_interval([1.0, float("nan")], [1.0, 2.0])
    d = paired_interval([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert d.low == d.high == d.estimate == pytest.approx(0.5) and d.standard_error == 0.0
    assert mean_interval([0.0, 0.0], 0.99).low == 0.0


def test_factorial_contrasts():
    blocks = [{"native": 10.0, "bucketed": 9.0, "packed": 8.0, "cotangent": 7.2} for _ in range(3)]
    blocks.append({"native": 10.0, "bucketed": 9.1, "packed": 8.0, "cotangent": 7.2})
    eff = factorial_contrasts(Rows(blocks, 0.99))
    assert eff["bucketed_norms"].estimate < 0 and eff["packed_adamw"].estimate < 0
    assert eff["interaction"].estimate == pytest.approx(
        sum(math.log(b["cotangent"] / b["packed"]) - math.log(b["bucketed"] / b["native"]) for b in blocks)
        / 4
    )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(k=st.integers(1, 3), data=st.data())
def test_factorial_effects_are_least_squares_effects(k, data):
    """Each block's effects against an outside reference: the ordinary least-squares fit of the
    log times on the +-1-coded full model (numpy), whose coefficient of a set S of factors times
    2^|S| is the difference of differences averaged over the other factors."""
    import numpy as np

    from prereg.factorial import block_effects, effect_names

    logs = data.draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=2**k, max_size=2**k))
    names = effect_names([(f"f{j}", ("lo", "hi")) for j in range(k)])
    x = np.array(
        [
            [1.0] + [float(np.prod([1 if (i >> j) & 1 else -1 for j in s])) for _, s in names]
            for i in range(2**k)
        ]
    )
    beta = np.linalg.lstsq(x, np.array(logs), rcond=None)[0]
    mine = block_effects(logs, k)
    for (name, subset), m, b in zip(names, mine, beta[1:]):
        assert m == pytest.approx(b * 2 ** len(subset), abs=1e-9), name


@pytest.mark.parametrize("n", [2, 4, 8])
def test_williams_squares_are_balanced(n):
    from prereg.factorial import williams

    rows = williams(n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    assert all(sorted(r[c] for r in rows) == list(range(n)) for c in range(n))
    pairs = [(r[c], r[c + 1]) for r in rows for c in range(n - 1)]
    assert len(set(pairs)) == len(pairs) == n * (n - 1)


# ------------------------------------------------------------------------------------ audit


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """A small preregistered study run for real: committed, tagged, run (``harness run``'s own code in
    this process, the models trained: conftest's ``harness_in_process``), reported."""
    from conftest import repo as _repo_fixture  # noqa: F401 - same layout as the repo fixture

    base = tmp_path_factory.mktemp("audit")
    r = base / "study"
    (r / "protocols").mkdir(parents=True)
    shutil.copytree(ROOT / "configs", r / "configs")
    for sub in PACKAGES:
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    text = tiny_protocol(prereg="true").replace(
        "studies:\n",
        "studies:\n  - name: cells\n    design: factorial\n"
        "    configs: [tiny_conv]\n    seeds: [5, 6]\n    steps: 10\n"
        "    val_every: 5\n    val_target_bpb: 7.9\n",
    )
    (r / "protocols" / "tiny.yaml").write_text(text)
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "t@example.invalid")
    git(r, "config", "user.name", "T")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    assert harness(r, "tag", "protocols/tiny.yaml").returncode == 0
    run = harness_in_process(r, "run", "protocols/tiny.yaml", "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    (base / "run.stdout").write_text(run.stdout)
    return r


def audit(repo: Path, *dirs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "analysis/public_audit.py", *dirs],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def study(audited, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(audited, copy, symlinks=True)
    return copy


def test_audit_passes_on_real_records(study):
    r = audit(study)
    assert r.returncode == NOT_VERIFIED, r.stdout
    assert "Integrity: everything matched." in r.stdout and "does not run training" in r.stdout
    assert "tag freezes the experiment" in r.stdout and "summary.json recomputed" in r.stdout
    summary = json.loads((study / "records" / "tiny" / "summary.json").read_text())
    by_name = {st["name"]: st for st in summary["studies"]}
    assert by_name["cells"]["configs"][0]["effects"]["interaction"]["n"] == 2


def test_the_terminal_ends_with_the_answer_in_points(audited, study):
    """``harness run`` and ``harness report`` print, last, each configuration's effect in points with
    its interval and its decisions (the report's tables scroll away above them); the change is
    recomputed here from the records' own training times."""
    import numpy as np

    from prereg.render.answer import answer_lines
    from prereg.results import Summary

    summary = Summary.read(json.loads((study / "records" / "tiny" / "summary.json").read_text()))
    answer = [f"- {line}" for line in answer_lines(summary)]
    reported = harness(study, "report", "protocols/tiny.yaml")
    assert reported.returncode == 0, reported.stderr
    for out in ((audited.parent / "run.stdout").read_text(), reported.stdout):
        last = out.rstrip("\n").splitlines()[-len(answer) - 2 :]
        assert last[0].startswith(
            "The answer. Each change is in points of 100 x ln(T_candidate / T_baseline)"
        )
        assert last[1:-1] == answer and last[-1].startswith("Details: report ")
    records = [json.loads(p.read_text()) for p in (study / "records" / "tiny").glob("pairs.*.record.json")]
    checked = 0
    for c in (c for sr in summary.studies if sr.name == "pairs" for c in sr.configs):
        line = next(x for x in answer if x.startswith(f"- pairs / {c.config} ("))
        times: dict[str, dict[str, float]] = {}
        for r in (r for r in records if r["spec"]["config"] == c.config):
            times.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r["timings"]["training_s"]
        logs = [np.log(t["candidate"] / t["baseline"]) for t in times.values() if len(t) == 2]
        assert f"training-time change {100 * np.mean(logs):+.2f} points (" in line
        assert re.search(
            r"% interval [-+]\d+\.\d\d to [-+]\d+\.\d\d; (faster|slower) by \d+\.\d\d%\) on the wall clock",
            line,
        )

        assert "decisions: " in line or "no preregistered decision" in line
        checked += 1
    assert checked >= 1


def _first_record(study: Path) -> Path:
    return sorted((study / "records" / "tiny").glob("*.record.json"))[0]


def test_audit_detects_tampered_record(study):
    path = _first_record(study)
    data = path.read_bytes()
    i = data.index(b'"test_bpb":') + len(b'"test_bpb":') + 2
    path.write_bytes(data[:i] + (b"9" if data[i : i + 1] != b"9" else b"8") + data[i + 1 :])
    r = audit(study)
    assert r.returncode == 1 and f"{path.name}: field sha256" in r.stdout


def test_audit_checks_manifest_sources_at_the_tagged_commit(study):
    """A tagged study's MANIFEST source hashes are checked against the tagged commit's files: a
    MANIFEST naming other bytes fails, while later work in the checkout (committed or not) leaves
    the records sealed."""
    path = study / "cotangent" / "kernel" / "phase.c"
    path.write_text(path.read_text() + "\n/* changed */\n")
    r = audit(study)
    assert r.returncode == NOT_VERIFIED, r.stdout
    assert any(
        line.startswith("MANIFEST source files") and "at the tagged commit" in line
        for line in r.stdout.splitlines()
    )
    git(study, "commit", "-qam", "later work")
    assert audit(study).returncode == NOT_VERIFIED
    manifest_path = study / "records" / "tiny" / "MANIFEST"
    manifest = json.loads(manifest_path.read_text())
    manifest["sources"]["cotangent/kernel/phase.c"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest, indent=1))
    r = audit(study)
    assert (
        r.returncode == 1
        and "cotangent/kernel/phase.c at " in r.stdout
        and "differs from MANIFEST's" in r.stdout
    )


def test_untagged_audit_follows_committed_work_but_not_uncommitted_edits(tmp_path):
    """Without a tag the checkout is the reference: an uncommitted edit of a source fails; after later
    commits the one commit every record names is used, and the row says so."""
    r = tmp_path / "study"
    (r / "protocols").mkdir(parents=True)
    shutil.copytree(ROOT / "configs", r / "configs")
    for sub in PACKAGES:
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / "protocols" / "tiny.yaml").write_text(tiny_protocol(prereg="false", steps=6))
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "t@example.invalid")
    git(r, "config", "user.name", "T")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    run = harness_in_process(r, "run", "protocols/tiny.yaml", "--quiet", "--no-report")
    assert run.returncode == 0, run.stdout + run.stderr
    recs = "records/tiny"
    assert audit(r, recs).returncode == NOT_VERIFIED
    path = r / "cotangent" / "kernel" / "phase.c"
    path.write_text(path.read_text() + "\n/* changed */\n")
    a = audit(r, recs)
    assert a.returncode == 1 and "cotangent/kernel/phase.c: source sha256" in a.stdout
    git(r, "commit", "-qam", "later work")
    a = audit(r, recs)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert "which every record names (the checkout has changed since)" in a.stdout


def test_audit_detects_tampered_summary(study):
    path = study / "records" / "tiny" / "summary.json"
    s = json.loads(path.read_text())
    pairs = next(st for st in s["studies"] if st["name"] == "pairs")
    pairs["configs"][0]["training_time"]["interval"]["high"] += 1e-6
    path.write_text(json.dumps(s, sort_keys=True, indent=1))
    r = audit(study)
    assert r.returncode == 1
    assert "summary.json: field sha256" in r.stdout and "training_time.interval.high" in r.stdout


def test_audit_detects_deleted_and_added_record(study):
    path = _first_record(study)
    content = path.read_bytes()
    path.unlink()
    r = audit(study)
    assert r.returncode == 1 and f"{path.name}: listed in MANIFEST but missing" in r.stdout
    extra = path.with_name("pairs.extra.a1.record.json")
    extra.write_bytes(content)
    path.write_bytes(content)
    r = audit(study)
    assert r.returncode == 1 and f"{extra.name}: record not listed in MANIFEST" in r.stdout


def test_audit_detects_a_replaced_tag(study):
    git(study, "tag", "-d", "protocol-tiny")
    git(study, "tag", "-a", "protocol-tiny", "-m", "late")
    r = audit(study)
    assert r.returncode == 1 and "TAG is not the object of the repository's tag protocol-tiny" in r.stdout
    (study / "records" / "tiny" / "TAG").unlink()  # the kept copy gone too: the late tag alone
    r = audit(study)
    assert (
        r.returncode == 1 and "holds no readable freeze manifest" in r.stdout and "Traceback" not in r.stdout
    )


def test_report_exports_and_module_entry(study):
    r = harness(study, "report", "protocols/tiny.yaml", "--format", "csv", "--quiet")
    assert r.returncode == 0, r.stderr
    import pandas as pd

    frame = pd.read_csv(study / "records" / "tiny" / "runs.csv")
    assert len(frame) == 12 and set(frame["status"]) == {"ok"}
    r = subprocess.run(
        [sys.executable, "-m", "analysis", "report", "records/tiny", "--format", "parquet"],
        cwd=study,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and (study / "records" / "tiny" / "runs.parquet").is_file()
    for png in ("plot_time.png", "plot_quality.png", "plot_validation.png"):
        assert (study / "records" / "tiny" / png).stat().st_size > 1000
    assert audit(study).returncode == NOT_VERIFIED  # a regenerated report still audits


def test_analysis_never_imports_torch():
    code = "import sys, analysis, analysis.report, prereg.formats.summary, analysis.calibrate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
