"""The replicate model (prereg/replicates.py): its random-effects mean and interval against
statsmodels on fixed and generated data, the protocol key's rules, and the order of replicates in
time.

Reference: statsmodels 0.15 ``combine_effects(y, v, method_re="chi2", use_t=True, alpha=a)``:
``mean_effect_re``, ``tau2`` and ``conf_int(alpha=a)[3]`` (the random-effects interval with the
HKSJ variance; where statsmodels' moment estimate of ``tau2`` is negative, which DerSimonian and
Laird truncate at 0, its fixed-effect mean and WLS interval ``conf_int(alpha=a)[2]``), e.g.

    python -c "from statsmodels.stats.meta_analysis import combine_effects as c; \
import numpy as n; r = c(n.array([1.2, 0.4, 2.1]), n.array([0.04, 0.09, 0.05]), method_re='chi2', use_t=True); \
print(r.mean_effect_re, r.tau2, r.conf_int(alpha=0.01)[3])"
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prereg.replicates import (
    overlap_problem,
    random_effects,
    replicate_estimates,
    replicate_of,
    replicate_rows,
    replicates_problems,
)

_ROOT = Path(__file__).resolve().parents[1]

combine_effects = pytest.importorskip("statsmodels.stats.meta_analysis").combine_effects


def reference(y, v, level):
    r = combine_effects(np.asarray(y), np.asarray(v), method_re="chi2", use_t=True, alpha=1 - level)
    if r.tau2 > 0:
        lo, hi = r.conf_int(alpha=1 - level)[3]
        return r.mean_effect_re, math.sqrt(r.tau2), lo, hi, r.q, r.mean_effect_fe
    # statsmodels 0.15 leaves DL's moment estimate negative; DerSimonian & Laird truncate it at 0,
    # where the random-effects mean is the fixed one and HKSJ's interval its WLS one (conf_int()[2])
    lo, hi = r.conf_int(alpha=1 - level)[2]
    return r.mean_effect_fe, 0.0, lo, hi, r.q, r.mean_effect_fe


@pytest.mark.parametrize(
    "y, v, level",
    [
        ([1.2, 0.4, 2.1], [0.04, 0.09, 0.05], 0.99),  # spread beyond the within variances: tau > 0
        ([1.0, 1.05, 0.98], [0.04, 0.09, 0.05], 0.95),  # agreement within noise: tau = 0
        ([-0.3, 0.5], [0.01, 0.02], 0.95),  # two replicates: t with 1 degree of freedom
        ([3.1, 2.9, 3.6, 2.2, 3.0], [0.2, 0.1, 0.3, 0.15, 0.05], 0.99),
    ],
)
def test_random_effects_is_statsmodels_dl_with_hksj(y, v, level):
    got = random_effects(y, v, level)
    mu, tau, lo, hi, q, fe = reference(y, v, level)
    assert got["mean"] == pytest.approx(mu, rel=1e-10, abs=1e-12)
    assert got["tau"] == pytest.approx(tau, rel=1e-9, abs=1e-12)
    assert got["lo"] == pytest.approx(lo, rel=1e-9, abs=1e-12)
    assert got["hi"] == pytest.approx(hi, rel=1e-9, abs=1e-12)
    assert got["q"] == pytest.approx(q, rel=1e-10)
    assert got["fixed"] == pytest.approx(fe, rel=1e-10, abs=1e-12)
    assert got["df"] == len(y) - 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-5, 5), st.floats(1e-3, 2.0)),
        min_size=2,
        max_size=8,
    ),
    st.sampled_from([0.9, 0.95, 0.99]),
)
def test_random_effects_matches_statsmodels_on_generated_replicates(rows, level):
    y = [a for a, _ in rows]
    v = [b for _, b in rows]
    got = random_effects(y, v, level)
    mu, tau, lo, hi, _, _ = reference(y, v, level)
    scale = 1 + max(abs(x) for x in y)
    assert abs(got["mean"] - mu) <= 1e-9 * scale
    assert abs(got["tau"] - tau) <= 1e-7 * scale
    assert abs(got["lo"] - lo) <= 1e-7 * scale and abs(got["hi"] - hi) <= 1e-7 * scale


def test_random_effects_refuses_what_has_no_variance():
    with pytest.raises(ValueError, match="at least 2"):
        random_effects([1.0], [0.1], 0.95)
    with pytest.raises(ValueError, match="positive"):
        random_effects([1.0, 2.0], [0.1, 0.0], 0.95)


def test_replicate_estimates_are_each_slices_mean_and_squared_se():
    reps, ys, vs = replicate_estimates({1: [1.0, 3.0], 2: [2.0, 2.0], 3: [0.0, 1.0, 2.0], 4: [5.0]})
    assert reps == [1, 3]  # replicate 2 has no spread, 4 one pair: neither has a variance
    assert ys == [2.0, 1.0]
    assert vs == [pytest.approx(2.0 / 2), pytest.approx(1.0 / 3)]


def test_replicate_rows_read_the_pairs_replicates_in_points():
    pairs = []
    for r, ratios in ((1, [1.01, 1.03]), (2, [1.05, 1.06]), (3, [1.02, 1.0])):
        for x in ratios:
            pairs.append({"replicate": r, "baseline_training_s": 10.0, "candidate_training_s": 10.0 * x})
    rows = replicate_rows([{"name": "s", "configs": ["c"]}], {("s", "c"): pairs}, 0.95)
    assert len(rows) == 1 and rows[0]["clock"] == "wall"  # no CPU columns: no CPU row
    want = random_effects(
        [
            100 * (math.log(1.01) + math.log(1.03)) / 2,
            100 * (math.log(1.05) + math.log(1.06)) / 2,
            100 * math.log(1.02) / 2,
        ],
        [row["se"] ** 2 for row in rows[0]["replicates"]],
        0.95,
    )
    assert rows[0]["mean"] == pytest.approx(want["mean"]) and rows[0]["k"] == 3


def test_a_study_without_replicates_has_no_rows():
    pairs = [{"baseline_training_s": 1.0, "candidate_training_s": 1.1}]
    assert replicate_rows([{"name": "s", "configs": ["c"]}], {("s", "c"): pairs}, 0.95) == []


def test_replicates_cut_each_study_into_consecutive_slices():
    assert [replicate_of(i, 9, 3) for i in range(9)] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


@pytest.mark.parametrize(
    "value, counts, key, words",
    [
        ([3], {}, (), "expected a mapping"),
        ({"count": 3}, {}, (), "names 'min_gap_s'"),
        ({"count": 1, "min_gap_s": 0}, {}, ("count",), "from 2"),
        ({"count": 3, "min_gap_s": -1}, {}, ("min_gap_s",), "0 or more"),
        ({"count": 3, "min_gap_s": 60, "when": 1}, {}, ("when",), "unknown key"),
        ({"count": 3, "min_gap_s": 60}, {"s": 8}, ("count",), "multiple of 3"),
        ({"count": 3, "min_gap_s": 60}, {"s": 3}, ("count",), "at least 2"),
    ],
)
def test_replicates_problems_name_the_key(value, counts, key, words):
    got = replicates_problems(value, counts)
    assert got and got[0][0] == key and words in got[0][1]


def test_valid_replicates_have_no_problems():
    assert replicates_problems({"count": 3, "min_gap_s": 3600}, {"a": 6, "b": 9}) == []


def test_a_replicate_waits_its_gap_on_the_same_machine_only():
    spans = {1: [(1000.0, 2000.0, "h1")]}
    why = overlap_problem(2, spans, 2500.0, "h1", 3600)
    assert why and "replicate 1 ran on h1 until" in why and "min_gap_s 3600" in why
    assert overlap_problem(2, spans, 5600.0, "h1", 3600) is None  # an hour after its last entry
    assert overlap_problem(2, spans, 2500.0, "h2", 3600) is None  # another machine: at once


def test_an_earlier_replicate_cannot_run_after_a_later_one():
    spans = {1: [(1000.0, 2000.0, "h1")], 3: [(9000.0, 9100.0, "h2")]}
    why = overlap_problem(2, spans, 20000.0, "h1", 60)
    assert why and why.startswith("replicate 3 started at 1970-01-01T02:30:00Z")
    assert overlap_problem(3, spans, 20000.0, "h2", 60) is None  # replicate 3 resumes


def test_the_replicate_simulation_shows_the_pooled_interval_undercovering():
    """benchmarks/replicates.py's simulation, small: with a between-replicate SD of 4 standard
    errors the pooled t interval misses far more often than its level, the replicate model's not."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "replicates.py"
    spec = importlib.util.spec_from_file_location("replicates_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.simulate(400, 3, 8, 1.0, 4 / math.sqrt(8), 0.95, 1)
    assert got["hksj_coverage"] > 0.9 and got["pooled_coverage"] < 0.75, got


# --- the harness: the protocol key, the plan, `harness run --replicate K` --------------------------

REPLICATED = "replicates: {count: 2, min_gap_s: GAP}\n"


def replicated_study(
    tmp_path, gap: int = 0, seeds: str = "[1, 2, 3, 4]", replicates: str | None = None, copy=("configs",)
):
    from conftest import init_study, tiny_protocol

    text = tiny_protocol(steps=5).replace("arms: [native, cotangent]", "arms: [native, native]")
    text = text.replace("seeds: [1, 2]", f"seeds: {seeds}")
    block = REPLICATED.replace("GAP", str(gap)) if replicates is None else replicates
    text = text.replace("order_seed:", block + "order_seed:", 1)
    return init_study(tmp_path / "study", copy=copy, protocol=text)


def run_replicate(repo, k, lines=None, **kw):
    from fake_trainer import FakeTrainer

    from harness.execute.inprocess import InProcessExecutor
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    return Runner(
        load_protocol(repo / "protocols" / "tiny.yaml"),
        echo=(lines if lines is not None else []).append,
        executor=InProcessExecutor(train=FakeTrainer()),
        replicate=k,
        **kw,
    ).run()


def recorded(repo):
    from conftest import record_dicts

    folder = repo / "records" / "tiny"
    return record_dicts(folder) if folder.exists() else []


def test_the_plan_gives_each_unit_its_replicate_and_leaves_other_plans_alone(tmp_path):
    from conftest import init_study, tiny_protocol

    from harness.plan import make_plan
    from harness.protocol import load_protocol

    repo = replicated_study(tmp_path)
    runs = make_plan(load_protocol(repo / "protocols" / "tiny.yaml"))
    by_seed = {(r.seed, r.config): r.replicate for r in runs}
    assert {s: r for (s, _), r in by_seed.items()} == {1: 1, 2: 1, 3: 2, 4: 2}
    plain = init_study(tmp_path / "plain", protocol=tiny_protocol(steps=5))
    assert all(
        "replicate" not in r.to_json() for r in make_plan(load_protocol(plain / "protocols" / "tiny.yaml"))
    )


def test_each_replicate_runs_its_own_units_and_the_summary_reads_them(tmp_path):
    from prereg.formats.summary import records_json

    repo = replicated_study(tmp_path)
    lines: list[str] = []
    end = run_replicate(repo, 1, lines)
    recs = recorded(repo)
    assert {r["spec"]["replicate"] for r in recs} == {1} and {r["spec"]["seed"] for r in recs} == {1, 2}
    assert "replicate 1 of 2" in "\n".join(lines) and end.left == 0
    run_replicate(repo, 2)
    recs = recorded(repo)
    assert sorted(r["spec"]["seed"] for r in recs) == sorted([1, 2, 3, 4] * 2)
    from prereg.recompute import recompute

    summary = recompute(records_json(__import__("conftest").typed(recs)))
    pairs = summary["studies"][0]["configs"][0]["pairs"]
    assert sorted(p["replicate"] for p in pairs) == [1, 1, 2, 2]
    rows = summary["replicates"]
    assert rows and {r["clock"] for r in rows} == {"wall", "CPU"}
    assert summary["protocol"]["replicates"] == {"count": 2, "min_gap_s": 0}


def test_a_replicate_that_would_overlap_the_last_is_refused_naming_both(tmp_path):
    from prereg.errors import RefusedError

    repo = replicated_study(tmp_path, gap=3600)
    run_replicate(repo, 1)
    before = recorded(repo)
    with pytest.raises(RefusedError) as e:
        run_replicate(repo, 2)
    msg = str(e.value)
    assert "key replicates: replicate 1 ran on" in msg and "replicate 2 may start there from" in msg
    assert "min_gap_s 3600" in msg and "nothing was run" in msg
    assert recorded(repo) == before  # nothing written


def test_an_earlier_replicate_after_a_later_one_is_refused(tmp_path):
    from prereg.errors import RefusedError

    repo = replicated_study(tmp_path)
    run_replicate(repo, 2)
    with pytest.raises(RefusedError, match="replicate 2 started at .*: replicate 1 cannot run after it"):
        run_replicate(repo, 1)


def test_harness_run_names_the_replicate_it_needs(tmp_path):
    from conftest import harness

    repo = replicated_study(tmp_path)
    out = harness(repo, "run", "protocols/tiny.yaml", "--quiet")
    assert out.returncode == 2 and "key replicates declares 2 replicates" in out.stderr, out.stderr
    assert "--replicate K (1 to 2)" in out.stderr and "Traceback" not in out.stderr
    assert not (repo / "records" / "tiny").exists()  # nothing written
    plain = harness(repo, "run", "protocols/tiny.yaml", "--quiet", "--replicate", "3")
    assert plain.returncode == 2 and "got 3" in plain.stderr


@pytest.mark.parametrize(
    "block, key, words",
    [
        ("replicates: {count: 3, min_gap_s: 0}\n", "replicates.count", "multiple of 3"),
        ("replicates: {count: 2, min_gap_s: -5}\n", "replicates.min_gap_s", "0 or more"),
        ("replicates: {count: 2, gap: 5}\n", "replicates.gap", "unknown key"),
        ("replicates: [2]\n", "replicates", "must be dict"),
    ],
)
def test_harness_plan_refuses_bad_replicates_with_file_key_and_line(tmp_path, block, key, words):
    import re

    from conftest import harness

    repo = replicated_study(tmp_path, replicates=block)
    out = harness(repo, "plan", "protocols/tiny.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"protocols/tiny\.yaml:\d+, key ", out.stderr) and key in out.stderr, out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr


def test_the_report_shows_each_replicate_its_mean_and_when_it_ran(tmp_path, monkeypatch):
    """Two replicates run in process with times that vary by seed and arm: ``harness report``
    writes the section, its estimates the random-effects mean of the replicates' own, and the
    time of each replicate from its records."""
    from fake_trainer import FakeTrainer

    from harness.execute.inprocess import InProcessExecutor
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    class Varied(FakeTrainer):
        def __call__(self, job, partial):
            self.device_s = 1.0 + ((job.spec.seed * 7 + 3 * (job.spec.role == "candidate")) % 5) / 10
            super().__call__(job, partial)

    repo = replicated_study(tmp_path)
    for k in (1, 2):
        Runner(
            load_protocol(repo / "protocols" / "tiny.yaml"),
            echo=lambda _: None,
            executor=InProcessExecutor(train=Varied()),
            replicate=k,
        ).run()
    from harness.cli import main

    monkeypatch.chdir(repo)  # in process: this checkout's harness, whatever is installed
    assert main(["report", "protocols/tiny.yaml", "--quiet"]) == 0
    import json

    summary = json.loads((repo / "records" / "tiny" / "summary.json").read_text())
    wall = next(r for r in summary["replicates"] if r["clock"] == "wall")
    reps = wall["replicates"]
    assert [x["replicate"] for x in reps] == [1, 2] and reps[1]["gap_s"] >= 0 and reps[0]["gap_s"] is None
    want = random_effects([x["estimate"] for x in reps], [x["se"] ** 2 for x in reps], 0.9)
    assert wall["mean"] == pytest.approx(want["mean"]) and wall["hi"] == pytest.approx(want["hi"])
    # one interval per effect: the time table's is the decision's, the t over the replicates'
    # estimates (scipy's), not the pooled pairs'; the precision-weighted mean is labelled apart
    from scipy import stats

    cfg = summary["studies"][0]["configs"][0]
    ys = [
        np.mean(
            [
                math.log(p["candidate_training_s"] / p["baseline_training_s"])
                for p in cfg["pairs"]
                if p["replicate"] == r
            ]
        )
        for r in (1, 2)
    ]
    lo, hi = stats.t.interval(cfg["level"], 1, loc=np.mean(ys), scale=stats.sem(ys))
    tt = cfg["training_time"]
    assert tt["replicates"] == 2 and tt["log_ratio"]["df"] == 1 and tt["interval"]["n"] == 2
    assert tt["log_ratio"]["low"] == pytest.approx(lo) and tt["log_ratio"]["high"] == pytest.approx(hi)
    assert tt["interval"]["low"] == pytest.approx(-100 * math.expm1(hi))
    d = [math.log(p["candidate_training_s"] / p["baseline_training_s"]) for p in cfg["pairs"]]
    pooled = stats.t.interval(cfg["level"], len(d) - 1, loc=np.mean(d), scale=stats.sem(d))
    assert abs(pooled[0] - tt["log_ratio"]["low"]) > 1e-6  # the pooled pairs' interval is not shown
    md = (repo / "records" / "tiny" / "report.md").read_text()
    assert "intervals over the 2 replicates' estimates (each replicate's mean log ratio, 1 degrees" in md
    assert "Precision-weighted mean (interval; descriptive, not the decision)" in md
    assert "## Replicates: the effect across times and machines" in md
    assert f"{wall['mean']:+.2f} ({wall['lo']:+.2f} to {wall['hi']:+.2f})" in md
    assert reps[0]["from"] in md and "Since the previous one" in md
    assert main(["publish", "protocols/tiny.yaml"]) == 0
    page = (repo / "records" / "tiny" / "index.html").read_text()
    assert "<h2 id=replicates>" in page and "When and where each replicate ran" in page


@pytest.mark.process
def test_harness_run_of_a_replicate_says_which_and_what_comes_next(tmp_path):
    """Through the command line, real workers: replicate 1 of 2 ends with its own runs counted and
    the next command; replicate 2, the last, names none."""
    from conftest import harness

    repo = replicated_study(tmp_path, seeds="[1, 2, 3, 4]")
    one = harness(repo, "run", "protocols/tiny.yaml", "--quiet", "--replicate", "1", "--no-report")
    assert one.returncode == 0, one.stdout + one.stderr
    assert "replicate 1 of 2: all 4 runs finished ok" in one.stdout, one.stdout
    assert "Next: harness run protocols/tiny.yaml --replicate 2, at least 0 s after" in one.stdout
    two = harness(repo, "run", "protocols/tiny.yaml", "--quiet", "--replicate", "2", "--no-report")
    assert two.returncode == 0 and "replicate 2 of 2: all 4 runs finished ok" in two.stdout, two.stdout
    assert "Next:" not in two.stdout


def _entry(run, at, host, replicate):
    return {"spec": {"run_id": run, "replicate": replicate}, "ledger": {"at": at}, "env": {"host": host}}


def test_the_audit_names_replicates_too_close_on_one_machine():
    from prereg.replicates import time_problems

    entries = [
        _entry("a", "2026-12-01T10:00:00.000+00:00", "h1", 1),
        _entry("b", "2026-12-01T10:30:00.000+00:00", "h1", 1),
        _entry("c", "2026-12-01T11:00:00.000+00:00", "h1", 2),  # 30 min after replicate 1 on h1
        _entry("d", "2026-12-01T10:10:00.000+00:00", "h2", 3),  # another machine: at once is allowed
    ]
    found = time_problems(entries, 3600)
    assert found == [
        "replicate 2 started on h1 at 2026-12-01T11:00:00Z, 1800 s after replicate 1's last entry there "
        "(2026-12-01T10:30:00Z): min_gap_s is 3600"
    ]
    assert time_problems(entries, 1800) == []


def test_the_audit_checks_a_replicated_folder(tmp_path):
    """The public audit (standard library, ``python -I -S``) on a replicated study run in process:
    its row for the replicates' separation, ok."""
    import subprocess
    import sys

    from conftest import ROOT

    repo = replicated_study(tmp_path)
    run_replicate(repo, 1)
    run_replicate(repo, 2)
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(ROOT / "analysis" / "public_audit.py"),
            str(repo / "records" / "tiny"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    row = next((line for line in out.stdout.splitlines() if line.startswith("replicates apart in time")), "")
    assert "ok: 2 of 2 replicates run, each on a machine at least 0 s after the one before it there" in row, (
        out.stdout
    )


def _speed(kind, margin):
    """A training-time hypothesis on the log ratio of the study ``s`` (lower is better)."""
    from prereg.hypotheses import Hypothesis

    return Hypothesis.of(
        {
            "id": "H",
            "study": "s",
            "config": "tiny",
            "endpoint": "training_time",
            "estimand": "log_ratio",
            "type": kind,
            "better": "lower",
            "margin": margin,
        }
    )


def _replicated_pairs(effects, n, rng):
    """Pairs of a replicated study: replicate ``r`` (1-based) has ``n`` pairs whose log ratio of
    training time is ``effects[r-1]`` plus noise of SD 0.01, each arm's time around 2 s."""
    from prereg.hypotheses import Pair

    out = []
    for r, e in enumerate(effects, start=1):
        for i in range(n):
            b = 2.0 * math.exp(rng.normal(0, 0.05))
            c = b * math.exp(e + rng.normal(0, 0.01))
            out.append(
                Pair(
                    unit=f"p{r}.{i}",
                    seed=i,
                    first="baseline",
                    baseline_training_s=b,
                    candidate_training_s=c,
                    replicate=r,
                )
            )
    return out


@settings(max_examples=25, deadline=None)
@given(
    effects=st.lists(st.floats(-0.05, 0.02), min_size=2, max_size=6),
    n=st.integers(2, 9),
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(["superiority", "non_inferiority", "equivalence"]),
)
def test_a_replicated_study_is_decided_on_the_mean_of_its_replicates(effects, n, seed, kind):
    """A replicated protocol's t-tested hypothesis is scipy's one-sample t test of the replicates'
    own estimates (each replicate's mean log ratio) against each bound of the region, with k - 1
    degrees of freedom (not the pooled pairs' n - 1), the larger p-value for equivalence (TOST)."""
    from scipy import stats

    from prereg.hypotheses import bounds, test_of

    pairs = _replicated_pairs(effects, n, np.random.default_rng(seed))
    h = _speed(kind, {"superiority": 0.0, "non_inferiority": 0.01, "equivalence": 0.02}[kind])
    got, why, _ = test_of(h, pairs, 2, replicated=True)
    assert why is None and got is not None
    assert got.method == "t-replicates" and got.df == len(effects) - 1 and got.n == len(pairs)
    ys = [
        np.log([p.candidate_training_s / p.baseline_training_s for p in pairs if p.replicate == r]).mean()
        for r in range(1, len(effects) + 1)
    ]
    assert math.isclose(got.estimate, float(np.mean(ys)), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(got.standard_error, float(stats.sem(ys)), rel_tol=1e-9, abs_tol=1e-12)
    lower, upper = bounds(h)  # the region's mapping is tested in test_decision_rules.py
    ps = ([stats.ttest_1samp(ys, lower, alternative="greater").pvalue] if lower is not None else []) + (
        [stats.ttest_1samp(ys, upper, alternative="less").pvalue] if upper is not None else []
    )
    assert math.isclose(got.p_value, max(ps), rel_tol=1e-6, abs_tol=1e-12)


@pytest.mark.parametrize(("k", "n"), [(3, 4), (6, 4)])
def test_the_decision_holds_its_level_where_precision_weights_do_not(k, n):
    """At a true null with no spread between replicates, the decision's equal-weight t rejects at
    the nominal one-sided 2.5% (within 3 Monte-Carlo SEs, 6000 studies), while the HKSJ t of the
    replicates' table, its weights estimated from n pairs each, rejects well above it."""
    import runpy
    from pathlib import Path

    bench = runpy.run_path(str(Path(__file__).resolve().parent.parent / "benchmarks" / "replicates.py"))
    got = bench["type_one"](6000, k, n, 0.0, 0.025, 11)
    mc = math.sqrt(0.025 * 0.975 / 6000)
    assert abs(got["equal"] - 0.025) < 3 * mc, got
    assert got["hksj"] > 0.025 + 3 * mc, got


def test_a_replicate_without_spread_leaves_the_hypothesis_unreached():
    from prereg.hypotheses import Pair, test_of

    pairs = _replicated_pairs([0.0, -0.01], 3, np.random.default_rng(1))
    pairs = [
        p if p.replicate == 1 else Pair(**{**p.__dict__, "candidate_training_s": p.baseline_training_s})
        for p in pairs
    ]
    h = _speed("superiority", 0.0)
    got, why, _ = test_of(h, pairs, 2, replicated=True)
    assert got is None and why.startswith("replicate 2: zero spread")


def test_the_split_benchmark_cuts_a_committed_study_into_replicates(capsys):
    """``benchmarks/replicates.py --split``: each slice's mean is the mean of its consecutive pairs,
    the table's half-width is the HKSJ one (statsmodels, as above) and the decision's is scipy's t
    interval of the replicates' means."""
    import json
    import runpy
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "records" / "cpu2"
    if not (folder / "summary.json").is_file():
        pytest.skip("records/cpu2 is not in this checkout")
    mod = runpy.run_path(str(folder.parent.parent / "benchmarks" / "replicates.py"))
    assert mod["main"](["--split", str(folder), "--replicates", "3", "--level", "0.99"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| pairs | tiny_gqa | CPU |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    cfg = next(
        c
        for s in json.loads((folder / "summary.json").read_text())["studies"]
        if s["name"] == "pairs"
        for c in s["configs"]
        if c["config"] == "tiny_gqa"
    )
    d = [
        100 * math.log(p["candidate_training_cpu_s"] / p["baseline_training_cpu_s"])
        for p in sorted(cfg["pairs"], key=lambda p: p["order"])
    ]
    parts = [np.array(d[r * len(d) // 3 : (r + 1) * len(d) // 3]) for r in range(3)]
    ys, vs = [a.mean() for a in parts], [a.var(ddof=1) / len(a) for a in parts]
    _, _, lo, hi, _, _ = reference(ys, vs, 0.99)
    assert cells[3] == "56" and cells[5] == ", ".join(f"{y:+.2f}" for y in ys)
    assert cells[7] == f"{(hi - lo) / 2:.2f}"
    from scipy import stats

    assert cells[8] == f"{stats.t.ppf(0.995, 2) * stats.sem(ys):.2f}"  # the decision's t interval


def test_the_protocol_not_the_data_chooses_the_replicate_model():
    """A replicated protocol whose complete pairs lie in one replicate (a budget stop, failures) is
    not decided on the pooled pairs: not reached, saying why; a protocol without replicates is
    decided on its pairs whatever ``replicate`` they carry."""
    from prereg.hypotheses import test_of

    h = _speed("superiority", 0.0)
    both = _replicated_pairs([-0.02, -0.01], 4, np.random.default_rng(3))
    one = [p for p in both if p.replicate == 1]
    got, why, _ = test_of(h, one, 2, replicated=True)
    assert got is None and why.endswith("only replicate 1 has complete pairs")
    pooled, why, _ = test_of(h, both, 2, replicated=False)
    assert why is None and pooled.method == "t" and pooled.df == len(both) - 1


def test_replicates_with_sequential_looks_are_refused(tmp_path):
    from conftest import harness

    repo = replicated_study(tmp_path, seeds="[1, 2, 3, 4, 5, 6]")
    p = repo / "protocols" / "tiny.yaml"
    text = p.read_text()
    assert "  min_pairs: 3\n" in text
    p.write_text(
        text.replace(
            "  min_pairs: 3\n", "  min_pairs: 3\n  sequential: {looks: [3, 6], spending: pocock}\n", 1
        )
    )
    out = harness(repo, "plan", "protocols/tiny.yaml")
    assert out.returncode == 2 and "replicates with sequential looks" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_an_order_cell_hypothesis_needs_five_pairs_in_every_replicate(tmp_path):
    """A lockstep study's period-adjusted hypothesis is estimated on the order cells of each
    replicate: with 4 pairs a replicate it could never be reached, so harness plan refuses it at
    its ``period_adjusted`` key and line."""
    from conftest import harness

    repo = replicated_study(tmp_path, seeds="[1, 2, 3, 4, 5, 6, 7, 8]")
    p = repo / "protocols" / "tiny.yaml"
    text = p.read_text().replace("    design: paired\n", "    design: lockstep\n    block_steps: 1\n")
    text = text.replace("      better: lower\n", "      better: lower\n      period_adjusted: true\n", 1)
    p.write_text(text)
    out = harness(repo, "plan", "protocols/tiny.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "period_adjusted" in out.stderr and "has 4 pairs" in out.stderr and "Traceback" not in out.stderr


def test_order_cells_do_nothing_for_balanced_replicates():
    """docs/decisions.md ("Order cells in balanced replicates"): with five pairs in each of the four
    order cells of every replicate, the mean of the cell means is the plain mean (to 1e-15 of
    the values' scale), so the replicated decision (which keeps each replicate's estimate, never
    its order-cell standard error or degrees of freedom) is the same with and without
    period_adjusted; an unbalanced replicate is where the two differ."""
    from dataclasses import replace

    from prereg.carryover import cells_mean
    from prereg.hypotheses import Pair, test_of

    rng = np.random.default_rng(20261206)
    order = [(f, x) for f in ("baseline", "candidate") for x in ("baseline", "candidate")]
    pairs = []
    for r in range(1, 7):
        for i in range(20):
            first, steps_first = order[i % 4]
            b = 2.0 * math.exp(rng.normal(0, 0.05))
            c = b * math.exp(-0.02 + rng.normal(0, 0.01) + (0.004 if first == "candidate" else 0.0))
            pairs.append(
                Pair(
                    unit=f"p{r}.{i}",
                    seed=i,
                    first=first,
                    steps_first=steps_first,
                    replicate=r,
                    baseline_training_s=b,
                    candidate_training_s=c,
                )
            )
    for r in range(1, 7):
        mine = [p for p in pairs if p.replicate == r]
        v = [math.log(p.candidate_training_s) - math.log(p.baseline_training_s) for p in mine]
        cells = [
            (1 if p.first == "candidate" else -1, 1 if p.steps_first == "candidate" else -1) for p in mine
        ]
        m, _, df = cells_mean(v, cells)
        assert df == 16 and abs(m - math.fsum(v) / len(v)) <= 1e-15
    plain, _, _ = test_of(_speed("superiority", 0.0), pairs, 3, replicated=True)
    cells_h = replace(_speed("superiority", 0.0), period_adjusted=True)
    adjusted, why, _ = test_of(cells_h, pairs, 3, replicated=True)
    assert why is None and plain is not None and adjusted is not None
    assert plain.df == adjusted.df == 5
    assert math.isclose(plain.estimate, adjusted.estimate, rel_tol=0, abs_tol=1e-15)
    assert math.isclose(plain.standard_error, adjusted.standard_error, rel_tol=1e-12)
    assert math.isclose(plain.p_value, adjusted.p_value, rel_tol=1e-9)
    unbalanced = [
        p for p in pairs if not (p.replicate == 1 and p.first == "candidate" and p.unit[-1] in "26")
    ]
    a, _, _ = test_of(cells_h, unbalanced, 3, replicated=True)
    b, _, _ = test_of(_speed("superiority", 0.0), unbalanced, 3, replicated=True)
    assert a is not None and b is not None and abs(a.estimate - b.estimate) > 1e-6


def _bench():
    import runpy
    from pathlib import Path

    return runpy.run_path(str(Path(__file__).resolve().parent.parent / "benchmarks" / "replicates.py"))


def test_the_spread_between_the_calibrations_is_their_difference_less_their_noise():
    """benchmarks/replicates.py --spread on the two committed calibrations: the same 2% spin read on
    two machines; tau^2 = ((y_A - y_B)^2 - se_A^2 - se_B^2) / 2, each se from its 95% interval over
    80 pairs (scipy's t quantile), the figure cpu3's origins size the replicates from."""
    import json
    from pathlib import Path

    from scipy import stats

    root = Path(__file__).resolve().parent.parent / "records"
    folders = [root / "calibration-cpu", root / "calibration-cpu-coverage"]
    if not all((f / "summary.json").is_file() for f in folders):
        pytest.skip("the calibrations are not in this checkout")
    got = _bench()["spread"](folders)
    ys, ses = [], []
    for f in folders:
        row = next(
            r
            for r in json.loads((f / "summary.json").read_text())["planted"]
            if r["study"] == "spin2p0_lockstep1" and r["clock"] == "CPU"
        )
        ys.append(row["estimate"])
        ses.append((row["estimate_hi"] - row["estimate_lo"]) / (2 * stats.t.ppf(0.975, 79)))
    tau = math.sqrt(((ys[0] - ys[1]) ** 2 - ses[0] ** 2 - ses[1] ** 2) / 2)
    assert got["tau"] == pytest.approx(tau, rel=1e-9) and got["share"] == pytest.approx(tau / np.mean(ys))
    assert round(got["tau"], 3) == 0.164 and round(got["share"], 3) == 0.073  # as cpu3's origins say


def test_the_reach_chance_is_the_decision_half_width_against_the_target():
    """--reach: with no spread and replicates of identical pairs every study reaches any positive
    target; with pairs of SD 1 point, 3 replicates of 4 and a 99% level (t_2 = 9.92) the expected
    half-width is about 2.9 points, reached only where the three means happen to agree (chi-square,
    2 df: about 3%); and a larger spread lowers the chance."""
    reach = _bench()["reach"]
    flat = {"a": [1.0] * 10, "b": [-2.0] * 10}
    assert reach(flat, 3, 4, 0.0, 0.99, 0.01, 200, 1) == 1.0
    noisy = {"a": list(np.random.default_rng(2).normal(0.0, 1.0, 30))}
    assert reach(noisy, 3, 4, 0.0, 0.99, 0.5, 400, 1) < 0.06  # only where 3 means happen to agree
    d = {"a": list(np.random.default_rng(5).normal(-2.0, 0.7, 56))}
    chances = [reach(d, 10, 12, s, 0.99, 0.5, 400, 7) for s in (0.0, 0.1, 0.3)]
    assert chances[0] >= chances[1] >= chances[2] and chances[0] > 0.9 > chances[2]


def test_right_skewed_replicate_shifts_inflate_the_decision_s_error():
    """--skew: normal shifts keep the decision's one-sided error at its nominal 2.5% (within 3
    Monte-Carlo SEs of 6000 studies); right-skewed (exponential) shifts of 4 within-replicate SEs
    raise it well above, the mirror lowers it."""
    skew_error = _bench()["skew_error"]
    mc = math.sqrt(0.025 * 0.975 / 6000)
    tau = 4 / math.sqrt(20)
    assert abs(skew_error(6000, 4, 20, tau, "normal", 0.025, 3) - 0.025) < 3 * mc
    assert skew_error(6000, 4, 20, tau, "exp", 0.025, 4) > 0.025 + 6 * mc
    assert skew_error(6000, 4, 20, tau, "-exp", 0.025, 5) < 0.025 - 3 * mc


def test_the_planned_cpu3_claims_what_it_tests():
    """protocols/cpu3.yaml: quality claims of the median (test: sign), no order-cell covariate in a
    replicated decision (and no claim of its degrees of freedom), ten replicates of 12 pairs, as its
    origins size them; harness plan accepts it."""
    from pathlib import Path

    import yaml
    from conftest import harness

    root = Path(__file__).resolve().parent.parent
    proto = yaml.safe_load((root / "protocols" / "cpu3.yaml").read_text())
    tests = proto["hypotheses"]["tests"]
    assert all(t.get("test") == "sign" for t in tests if t["endpoint"] == "test_bpb")
    assert not any(t.get("period_adjusted") for t in tests)
    assert proto["replicates"]["count"] == 10
    pairs = next(s for s in proto["studies"] if s["name"] == "pairs")
    assert pairs["seeds"]["count"] // proto["replicates"]["count"] == 12
    assert all(s["seeds"]["count"] % (4 * proto["replicates"]["count"]) == 0 for s in proto["studies"])
    origins = " ".join(proto["origins"].values())
    assert "16 degrees" not in origins and "0.98 with 10 replicates of 12 pairs" in origins
    out = harness(root, "plan", "protocols/cpu3.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.process
def test_a_replicate_under_another_hostname_is_the_same_machine(tmp_path):
    """Issue 59, case 7: replicate 2 started at once under another hostname (``unshare --uts``) was
    accepted and the audit's row said ok. The started entries now carry the kernel's boot id, which
    a UTS namespace does not change: ``harness run`` refuses replicate 2 there until min_gap_s has
    passed, and the audit's row says the machines are told apart by boot id (entries without one:
    UNWITNESSED, and the gap by boot id is checked in the test below)."""
    import shutil
    import subprocess
    import sys

    from conftest import ROOT, harness

    if shutil.which("unshare") is None or subprocess.run(["unshare", "--uts", "true"]).returncode != 0:
        pytest.skip("unshare --uts is not permitted here")
    from test_provenance import PACKAGES

    repo = replicated_study(tmp_path, gap=3600, copy=("configs", *PACKAGES))  # this checkout's runner
    one = harness(repo, "run", "protocols/tiny.yaml", "--quiet", "--replicate", "1", "--no-report")
    assert one.returncode == 0, one.stdout + one.stderr
    two = subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', "another-host"]
        + [sys.executable, "-m", "harness.cli", "run", "protocols/tiny.yaml", "--quiet", "--replicate", "2"]
        + ["--no-report"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode != 0, two.stdout + two.stderr  # was: accepted, replicate 2 ran at once
    assert "replicate 1 ran on" in two.stdout + two.stderr and "min_gap_s 3600" in two.stdout + two.stderr
    from prereg.formats.record import read_entry

    started = [read_entry(p) for p in sorted((repo / "records" / "tiny").glob("*.started.json"))]
    assert started and all(len(e["runner"].get("boot_id", "")) >= 32 for e in started)
    audit = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(ROOT / "analysis" / "public_audit.py"),
            str(repo / "records" / "tiny"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    row = next((x for x in audit.stdout.splitlines() if x.startswith("replicates apart in time")), "")
    assert "machines told apart by boot id" in row, audit.stdout


def test_the_audit_tells_machines_by_boot_id_not_hostname():
    """Entries of one boot id under two hostnames are one machine (the gap applies); entries without
    a boot id are told apart by hostname, as before."""
    from prereg.replicates import time_problems, unwitnessed

    def started(run, at, host, replicate, boot):
        e = _entry(run, at, host, replicate)
        e["runner"] = {"host": host, "pid": 1, **({"boot_id": boot} if boot else {})}
        e["kind"] = "started"
        return e

    entries = [
        started("a", "2026-12-01T10:00:00.000+00:00", "h1", 1, "b" * 36),
        started("b", "2026-12-01T10:01:00.000+00:00", "other", 2, "b" * 36),
    ]
    assert time_problems(entries, 3600) and not unwitnessed(entries)
    old = [started("a", "2026-12-01T10:00:00.000+00:00", "h1", 1, None)]
    old.append(started("b", "2026-12-01T10:01:00.000+00:00", "other", 2, None))
    assert time_problems(old, 3600) == [] and unwitnessed(old)


def test_the_anchor_witnesses_the_replicates_separation_where_the_runners_times_do_not():
    """Issue 59, case 7: a key holder writes ``ledger.at`` at will (here 2 hours apart), but the
    anchor's history says when each head was anchored: replicate 2's first entry anchored a minute
    after replicate 1's last is a problem; 2 hours after is not; an entry no anchored head holds is
    named unwitnessed."""
    from prereg.replicates import anchored_gap_problems, time_problems

    def entry(run, seq, at, replicate):
        e = _entry(run, at, "h1", replicate)
        e["ledger"]["seq"] = seq
        e["runner"] = {"host": "h1", "pid": 1, "boot_id": "b" * 36}
        return e

    entries = [
        entry("a", 1, "2026-12-01T08:00:00+00:00", 1),
        entry("b", 2, "2026-12-01T08:30:00+00:00", 1),
        entry("c", 3, "2026-12-01T10:30:00+00:00", 2),  # the runner's own time: 2 hours after
    ]
    assert time_problems(entries, 3600) == []
    back_to_back = [(1, "2026-12-01T08:00:05+00:00"), (2, "2026-12-01T08:30:05+00:00")]
    back_to_back.append((3, "2026-12-01T08:31:05+00:00"))
    found, notes = anchored_gap_problems(entries, 3600, back_to_back)
    assert (
        len(found) == 1
        and "replicate 2's first entry (seq 3) was anchored at 2026-12-01T08:31:05Z" in found[0]
    )
    assert "60 s after replicate 1's last (seq 2" in found[0] and notes == []
    apart = [(2, "2026-12-01T08:30:05+00:00"), (3, "2026-12-01T10:30:05+00:00")]
    assert anchored_gap_problems(entries, 3600, apart) == ([], [])
    found, notes = anchored_gap_problems(entries, 3600, [(2, "2026-12-01T08:30:05+00:00")])
    assert found == [] and len(notes) == 1 and "is in no anchored head" in notes[0]


def test_the_anchored_gap_runs_from_the_earlier_replicates_last_entry_to_the_next_ones_first():
    """Review check of the bound's direction: replicates 1 (seqs 1-3) and 2 (seqs 4-6) whose spans
    are 3 hours apart end to end (replicate 1's first to replicate 2's last) but only 60 s apart where
    they meet (replicate 1's last, seq 3, to replicate 2's first, seq 4): named. Measured the other way
    round (first to last) the pair would pass. With a real gap where they meet: ok."""
    from prereg.replicates import anchored_gap_problems

    entries = []
    for seq in range(1, 7):
        e = _entry(f"r{seq}", "2026-12-01T08:00:00+00:00", "h1", 1 if seq <= 3 else 2)
        e["ledger"]["seq"] = seq
        e["runner"] = {"host": "h1", "pid": 1, "boot_id": "b" * 36}
        entries.append(e)
    hour = ["08:00", "09:30", "09:30", "09:31", "09:31", "11:00"]  # seq 1..6, anchored as each was written
    meet = [(i + 1, f"2026-12-01T{h}:00+00:00") for i, h in enumerate(hour)]
    found, notes = anchored_gap_problems(entries, 3600, meet)
    assert notes == [] and len(found) == 1, (found, notes)
    assert "replicate 2's first entry (seq 4)" in found[0] and "replicate 1's last (seq 3" in found[0]
    assert "60 s after" in found[0], found[0]
    apart = [
        (1, "2026-12-01T08:00:00+00:00"),
        (3, "2026-12-01T08:10:00+00:00"),
        (4, "2026-12-01T09:10:00+00:00"),
    ]
    apart.append((6, "2026-12-01T09:20:00+00:00"))
    assert anchored_gap_problems(entries, 3600, apart) == ([], [])


def test_each_replicate_names_its_cpu_and_load_and_the_spread_by_machine_is_stated():
    """Issue 58: a replicate on another CPU model is a stronger one; the report names each
    replicate's CPU model, instruction set and load, and the spread by machine (or that it is not
    measured, on one model)."""
    from prereg.render.findings import machines_sentence
    from prereg.replicates import by_machine, replicate_times

    def rec(run: str, rep: int, at: str, cpu: str, isa: str, load: float) -> dict:
        return {
            "spec": {"run_id": run, "replicate": rep},
            "ledger": {"at": at},
            "env": {"host": "h", "device_name": cpu, "cpu_capability": isa, "loadavg": [load, 0.0, 0.0]},
        }

    records = [
        rec("a", 1, "2026-12-06T08:00:00Z", "Xeon", "AVX512", 0.5),
        rec("b", 1, "2026-12-06T08:05:00Z", "Xeon", "AVX512", 2.5),
        rec("c", 2, "2026-12-06T10:00:00Z", "EPYC", "AVX2", 1.0),
    ]
    times = replicate_times(records)
    assert times[1]["cpus"] == ["Xeon (AVX512)"] and times[1]["load"] == [0.5, 2.5]
    assert times[2]["cpus"] == ["EPYC (AVX2)"] and times[2]["gap_s"] == 6900.0
    reps = [{**times[1], "estimate": -1.0}, {**times[2], "estimate": +1.0}, {"estimate": 0.0}]
    assert by_machine(reps) == {"Xeon (AVX512)": [-1.0], "EPYC (AVX2)": [1.0], "unknown": [0.0]}
    row = {"study": "s", "config": "c", "clock": "CPU", "replicates": reps[:2]}
    text = machines_sentence([row])
    assert (
        "EPYC (AVX2): 1 replicate(s), mean +1.00" in text
        and "Xeon (AVX512): 1 replicate(s), mean -1.00" in text
    )
    one = machines_sentence([{**row, "replicates": [reps[0], {**reps[0], "estimate": 0.5}]}])
    assert one.startswith("Spread by machine: all 2 replicates ran on one CPU model (Xeon (AVX512))")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=3, max_size=12).filter(lambda xs: np.std(xs) > 1e-3)
)
def test_the_reached_skewness_is_scipys_adjusted_g1(xs):
    from scipy import stats

    assert _bench()["skewness"](xs) == pytest.approx(float(stats.skew(xs, bias=False)), rel=1e-9, abs=1e-9)


@pytest.mark.skipif(
    not (_ROOT / "records" / "cpu3" / "summary.json").is_file(), reason="records/cpu3 not here"
)
def test_the_reached_half_widths_are_scipys_t_over_the_decisions_standard_error(capsys):
    """``--reached records/cpu3``: each t-over-replicates decision's interval at 99% is scipy's
    ``t.ppf(0.995, k - 1)`` times the sealed standard error, around the sealed estimate."""
    import json as _json

    from scipy import stats

    assert _bench()["main"](["--reached", str(_ROOT / "records" / "cpu3"), "--level", "0.99"]) == 0
    out = capsys.readouterr().out
    summary = _json.loads((_ROOT / "records" / "cpu3" / "summary.json").read_text())
    seen = 0
    for d in summary["hypotheses"]["decisions"]:
        t = d.get("test") or {}
        if t.get("method") != "t-replicates":
            continue
        half = 100 * stats.t.ppf(0.995, t["df"]) * t["standard_error"]
        est = 100 * t["estimate"]
        row = f"| {d['id']} | {t['df'] + 1} | {est:+.2f} | {est - half:+.2f} to {est + half:+.2f} | {half:.2f} |"
        assert row in out, row
        seen += 1
    assert seen == 9
