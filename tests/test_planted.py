"""Planted reference effects (``planted:``, ``prereg/planted.py``): a known cost in the
candidate's timed steps, and each design's bias against it.

* The plant changes no bit of training: a planted run's losses, BPB and weights are its partner's,
  in both designs, for every plant kind; it adds its own time to the candidate's clocks and says so.
* The arithmetic: the bias and its interval against scipy's one-sample t interval of the
  differences, coverage's exact bounds against scipy's Clopper-Pearson, the measured plant's bias
  against scipy's Welch interval; a candidate that is its baseline plus exactly the plant has
  bias 0 on generated data.
* Refusals, through ``harness plan`` as a user meets them (file, key, line, exit 2): a planted
  study whose arms differ, a hypothesis about a planted study, unknown kinds and sizes, a torch
  plant in a command study, warm-up steps that leave nothing timed.
* ``schedule: interleaved``: every study's units in one seeded order, each unit whole.
* ``harness calibration-study`` writes a protocol that plans, from a pilot's records.
"""

from __future__ import annotations

import math
import random
import re
import sys
import time
from pathlib import Path

import pytest
import scipy.stats as ss
import torch
from conftest import harness, init_study, record_dicts, tiny_protocol, typed
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from harness.execute.inprocess import InProcessExecutor
from harness.execute.plant import Plant
from harness.execute.runner import Runner
from harness.plan import make_plan, units
from harness.protocol import load_protocol
from harness.reporter import spin
from prereg.planted import (
    bias_of,
    clopper_pearson,
    coverage,
    plant_problems,
    planted_rows,
    reference_study,
    spin_truth,
)

RECS = Path("records") / "tiny"


def planted_protocol(*studies: str, schedule: str = "", hypotheses: str | None = None) -> str:
    """The tiny protocol with its studies replaced by ``studies`` (YAML list entries)."""
    text = tiny_protocol(steps=6)
    head = text[: text.index("studies:")]
    if hypotheses is not None:
        head = head[: head.index("hypotheses:")] + hypotheses + head[head.index("order_seed:") :]
    return head + schedule + "studies:\n" + "".join(studies)


def study(
    name: str, design: str = "paired", arms: str = "[native, native]", extra: str = "", seeds: str = "[1, 2]"
) -> str:
    lock = "\n    block_steps: 2" if design == "lockstep" else ""
    return f"""  - name: {name}
    design: {design}{lock}
    arms: {arms}
    configs: [tiny_conv]
    seeds: {seeds}
    steps: 6
    val_every: 3
    val_target_bpb: 7.9
{extra}"""


DESCRIPTIVE = 'hypotheses: {descriptive: "planted"}\n'


@pytest.fixture(scope="module")
def planted_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Planted studies of every kind, in both designs, run in process (6 steps, 2 seeds)."""
    repo = tmp_path_factory.mktemp("planted") / "study"
    text = planted_protocol(
        study("spin_p", extra="    planted: {kind: spin, us: 300}\n    warmup_steps: 2\n"),
        study("spin_l", "lockstep", extra="    planted: {kind: spin, us: 300}\n"),
        study("mm_l", "lockstep", extra="    planted: {kind: matmul, n: 64}\n"),
        study("ga_p", extra="    planted: {kind: gather, bytes: 65536}\n"),
        hypotheses=DESCRIPTIVE,
    )
    init_study(repo, protocol=text)
    proto = load_protocol(repo / "protocols" / "tiny.yaml")
    assert Runner(proto, echo=lambda _: None, executor=InProcessExecutor()).run().left == 0
    return {r["spec"]["run_id"]: r for r in record_dicts(repo / RECS)}


def test_the_plant_changes_no_bit_of_training(planted_runs):
    pairs = {}
    for r in planted_runs.values():
        pairs.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r
    assert len(pairs) == 8
    for unit, p in pairs.items():
        b, c = p["baseline"], p["candidate"]
        assert b["status"] == c["status"] == "ok", (unit, b.get("reason"), c.get("reason"))
        assert [x[:2] for x in b["curve"]] == [x[:2] for x in c["curve"]], unit
        assert (b["val_bpb"], b["test_bpb"]) == (c["val_bpb"], c["test_bpb"]), unit
        wb, wc = load_file(b["checkpoint"]["path"]), load_file(c["checkpoint"]["path"])
        assert wb.keys() == wc.keys() and all(torch.equal(wb[k], wc[k]) for k in wb), unit
        assert "planted" in c["spec"] and "planted" not in b["spec"]
        assert "planted_s" in c["timings"] and "planted_s" not in b["timings"]


def test_the_plant_times_itself_inside_the_timed_steps(planted_runs):
    for r in planted_runs.values():
        t, steps = r["timings"], r["step_times"]
        assert len(steps["wall_us"]) == len(steps["cpu_us"]) == r["spec"]["steps"]
        warm = r["spec"].get("warmup_steps") or 0
        # the training clock is the timed steps' sum (microsecond rounding aside); warm-up apart
        assert sum(steps["wall_us"][warm:]) / 1e6 == pytest.approx(
            t["training_s"], abs=1e-5 * r["spec"]["steps"]
        )
        if warm:
            assert sum(steps["wall_us"][:warm]) / 1e6 == pytest.approx(t["warmup_s"], abs=1e-5 * warm)
        if r["spec"].get("planted", {}).get("kind") == "spin":
            timed = r["spec"]["steps"] - warm
            assert t["planted_cpu_s"] >= timed * 300e-6  # clock-checked: at least what was planted
            assert t["planted_cpu_s"] <= t["training_cpu_s"]


def test_a_spin_spends_at_least_its_microseconds():
    for us in (1, 50, 400):
        c0 = time.thread_time_ns()
        spin(us)
        assert time.thread_time_ns() - c0 >= us * 1000


def test_the_plant_draws_no_random_numbers():
    for planted in (
        {"kind": "spin", "us": 5},
        {"kind": "matmul", "n": 16},
        {"kind": "gather", "bytes": 4096},
    ):
        torch.manual_seed(3)
        before = torch.get_rng_state()
        plant = Plant(planted, torch.device("cpu"))
        plant()
        assert torch.equal(before, torch.get_rng_state()), planted
        assert plant.cpu_s >= 0 and plant.wall_s >= 0


def test_the_summary_and_the_audit_read_the_planted_studies(planted_runs, tmp_path):
    from prereg.formats.summary import derive

    records = typed(list(planted_runs.values()))
    rows = derive(records).planted
    assert rows is not None and {r["study"] for r in rows} == {"spin_p", "spin_l", "mm_l", "ga_p"}
    by = {(r["study"], r["clock"]): r for r in rows}
    assert by[("spin_p", "CPU")]["truth_origin"].startswith("arithmetic")
    assert by[("mm_l", "wall")].get("reference") is True  # the only lockstep study of its plant


# -- the arithmetic, against scipy ---------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-0.2, 0.2), min_size=3, max_size=30),
    st.floats(0.001, 0.1),
    st.sampled_from([0.9, 0.95, 0.99]),
)
def test_bias_interval_is_scipys_one_sample_t_interval(noise, truth, level):
    d = [truth + e for e in noise]
    t = [truth] * len(d)
    b = bias_of(d, t, level)
    diffs = [x - y for x, y in zip(d, t)]
    if len(set(diffs)) == 1:
        return
    res = ss.ttest_1samp(diffs, 0.0).confidence_interval(level)
    assert b["bias_lo"] == pytest.approx(res.low, abs=1e-9)
    assert b["bias_hi"] == pytest.approx(res.high, abs=1e-9)
    e = ss.ttest_1samp(d, 0.0).confidence_interval(level)
    assert b["covered"] == (e.low <= truth <= e.high)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(0.5, 3.0), min_size=2, max_size=20),
    st.floats(0.0, 0.3),
    st.floats(0.001, 0.05),
)
def test_a_candidate_that_is_its_baseline_plus_the_plant_has_no_bias(cpu, share, step):
    # the plant's CPU seconds, pair by pair, a share of the baseline's that differs from pair to pair
    # (a constant share gives every pair one log ratio: an interval of width zero, nothing to cover)
    s = [c * (share + k * step) for k, c in enumerate(cpu)]
    d = [math.log((c + x) / c) for c, x in zip(cpu, s)]
    t = [spin_truth(c, x) for c, x in zip(cpu, s)]
    b = bias_of(d, t, 0.95)
    assert abs(b["bias"]) < 1e-12 and b["covered"]


@pytest.mark.parametrize("k,n", [(0, 20), (1, 20), (19, 20), (20, 20), (37, 40), (5, 9)])
def test_coverage_bounds_are_clopper_pearson(k, n):
    lo, hi = clopper_pearson(k, n)
    ref = ss.binomtest(k, n).proportion_ci(0.95, method="exact")
    assert lo == pytest.approx(ref.low, abs=1e-9) and hi == pytest.approx(ref.high, abs=1e-9)


def test_coverage_counts_consecutive_replicate_studies():
    d = [0.02, 0.03, 0.01, 0.02] * 5 + [0.5, 0.6, 0.55, 0.52]  # the last group far from the truth
    t = [0.02] * len(d)
    cov = coverage(d, t, 4, 0.95)
    assert cov is not None and cov["studies"] == 6 and cov["covered"] == 5
    assert coverage(d[:4], t[:4], 4, 0.95) is None  # one group is not a coverage


def test_a_measured_plants_bias_is_the_welch_difference_from_the_longest_blocks():
    def pairs(name, values):
        return [
            {
                "order": i,
                "baseline_training_s": 1.0,
                "candidate_training_s": math.exp(v),
                "baseline_training_cpu_s": 1.0,
                "candidate_training_cpu_s": math.exp(v),
            }
            for i, v in enumerate(values)
        ]

    plant = {"kind": "matmul", "n": 288}
    studies = [
        {
            "name": "l1",
            "design": "paired",
            "lockstep": {"block_steps": 1},
            "planted": plant,
            "configs": ["c"],
            "interval_level": 0.95,
        },
        {
            "name": "l50",
            "design": "paired",
            "lockstep": {"block_steps": 50},
            "planted": plant,
            "configs": ["c"],
            "interval_level": 0.95,
        },
        {"name": "pp", "design": "paired", "planted": plant, "configs": ["c"], "interval_level": 0.95},
    ]
    assert reference_study(studies)["name"] == "l50"
    a, r, p = (
        [0.030, 0.036, 0.034, 0.031, 0.033],
        [0.049, 0.052, 0.050, 0.047, 0.055],
        [0.02, 0.09, 0.04, 0.07],
    )
    rows = planted_rows(
        studies, {("l1", "c"): pairs("l1", a), ("l50", "c"): pairs("l50", r), ("pp", "c"): pairs("pp", p)}
    )
    by = {(x["study"], x["clock"]): x for x in rows}
    w = ss.ttest_ind(a, r, equal_var=False).confidence_interval(0.95)
    got = by[("l1", "wall")]
    assert got["bias"] == pytest.approx(100 * (sum(a) / 5 - sum(r) / 5))
    assert got["bias_lo"] == pytest.approx(100 * w.low) and got["bias_hi"] == pytest.approx(100 * w.high)
    assert by[("l50", "CPU")]["reference"] is True and by[("l50", "CPU")]["bias"] == 0.0
    assert "pp" in {s for s, _ in by}


@pytest.mark.parametrize(
    "value,command,key",
    [
        ({"kind": "nap", "us": 3}, False, ("kind",)),
        ({"kind": "sleep", "bytes": 3}, False, ("bytes",)),
        ({"kind": "copy", "bytes": 0}, False, ("bytes",)),
        ({"kind": "alloc", "bytes": 1 << 31}, False, ("bytes",)),
        ({"kind": "gather", "bytes": 64, "toggle_steps": 1}, False, ("toggle_steps",)),
        ({"kind": "gather", "bytes": 64, "toggle_steps": 10}, True, ("toggle_steps",)),
        ({"kind": "spin"}, False, ()),
        ({"kind": "spin", "us": 0}, False, ("us",)),
        ({"kind": "spin", "us": True}, False, ("us",)),
        ({"kind": "spin", "n": 3}, False, ("n",)),
        ({"kind": "matmul", "n": 10**6}, False, ("n",)),
        ({"kind": "matmul", "n": 64}, True, ("kind",)),
        ({"kind": "spin", "us": 5, "replicate_pairs": 1}, False, ("replicate_pairs",)),
        ("spin", False, ()),
    ],
)
def test_plant_problems_name_the_key(value, command, key):
    problems = plant_problems(value, command)
    assert problems and problems[0][0] == key


# -- refusals through the command line ---------------------------------------------------------


@pytest.mark.parametrize(
    "studies,hypotheses,key,words",
    [
        (
            [study("s", arms="[native, cotangent]", extra="    planted: {kind: spin, us: 5}\n")],
            DESCRIPTIVE,
            "studies[0].planted",
            "must be the same arm",
        ),
        (
            [
                study(
                    "s",
                    design="factorial",
                    arms="[native, bucketed, packed, cotangent]",
                    extra="    planted: {kind: spin, us: 5}\n",
                )
            ],
            DESCRIPTIVE,
            "studies[0].planted",
            "belongs to a pair",
        ),
        (
            [study("s", extra="    planted: {kind: spin, us: 5}\n")],
            None,
            "hypotheses.tests[0].study",
            "is planted",
        ),
        (
            [study("s", extra="    planted: {kind: spin}\n")],
            DESCRIPTIVE,
            "studies[0].planted",
            "names its size",
        ),
        (
            [study("s", extra="    warmup_steps: 6\n")],
            DESCRIPTIVE,
            "studies[0].warmup_steps",
            "fewer than steps",
        ),
    ],
)
def test_harness_plan_refuses_with_file_key_and_line(repo, studies, hypotheses, key, words):
    text = planted_protocol(*studies, hypotheses=hypotheses)
    if hypotheses is None:
        text = text.replace("study: pairs", "study: s")
    (repo / "protocols" / "p.yaml").write_text(text)
    out = harness(repo, "plan", "protocols/p.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr
    assert re.search(r"protocols/p\.yaml:\d+, key ", err) and key in err and words in err, err
    assert "Traceback" not in err


def test_an_interleaved_schedule_mixes_the_studies_and_keeps_each_unit_whole(repo):
    text = planted_protocol(
        study("a", seeds="[1, 2, 3, 4]"),
        study("b", "lockstep", seeds="[5, 6, 7, 8]"),
        schedule="schedule: interleaved\n",
        hypotheses=DESCRIPTIVE,
    )
    (repo / "protocols" / "p.yaml").write_text(text)
    plan = make_plan(load_protocol(repo / "protocols" / "p.yaml"))
    assert [r.order for r in plan] == list(range(len(plan)))
    groups = units(plan)
    assert len(groups) == 8 and all(len(g) == 2 and g[0].unit == g[1].unit for g in groups)
    studies = [g[0].study for g in groups]
    assert studies != sorted(studies)  # not one study after the other
    (repo / "protocols" / "q.yaml").write_text(text.replace("schedule: interleaved\n", ""))
    plain = make_plan(load_protocol(repo / "protocols" / "q.yaml"))
    assert [g[0].study for g in units(plain)] == ["a"] * 4 + ["b"] * 4
    # the audit's plan is the harness's (one home: prereg/plan.py)
    from prereg.plan import plan_from_protocol

    doc = load_protocol(repo / "protocols" / "p.yaml")
    shas = {n: c.sha256 for n, c in doc.configs.items()}
    assert plan_from_protocol(doc.spec, doc.sha256, shas) == [r.to_json() for r in plan]


def _calibration_plan(**given):
    """A small calibration plan on tiny_conv: 2 pairs a cell, 8 steps, one thread."""
    from analysis.calibration_study import CalibrationPlan

    fixed = dict(id="cal", config="tiny_conv", pilot="protocols/pilot.yaml", pilot_command="harness run x")
    small = dict(pairs=2, steps=8, warmup_steps=2, matmul_n=32, coverage_designs=(1,))
    return CalibrationPlan(**fixed, **small, seed_base=100, order_seed=7, threads=1, **given)


def _written(plan, tmp_path):
    """The plan's protocol text, its pairs per design, and the protocol as harness loads it."""
    from analysis.calibration_study import protocol_text

    text, counts = protocol_text(plan)
    repo = init_study(tmp_path / "cal")
    (repo / "protocols" / "cal.yaml").write_text(text)
    return text, counts, load_protocol(repo / "protocols" / "cal.yaml")


def test_calibration_study_is_written_from_a_pilot_and_plans(planted_runs, tmp_path):
    from analysis.calibration_study import pilot_step_cpu_us

    records = typed(list(planted_runs.values()))
    us, n = pilot_step_cpu_us(records, "tiny_conv")
    assert us > 0 and n == 8
    plan = _calibration_plan(
        step_cpu_us=us,
        pilot_runs=n,
        sizes=(0.5, 2.0),
        designs=(0, 1, 4),
        coverage_sizes=(2.0,),
        coverage_pairs=4,
        replicate_pairs=2,
        matmul_pairs=2,
    )
    text, counts, proto = _written(plan, tmp_path)
    assert {s.name for s in proto.studies} >= {"spin0p5_paired", "spin2p0_lockstep1", "matmul32_lockstep4"}
    assert counts == {"paired": 2 + 2 + 2, "lockstep1": 2 + 4 + 2, "lockstep4": 2 + 2 + 2}
    assert all(s.planted is not None for s in proto.studies)
    cover = next(s for s in proto.studies if s.name == "spin2p0_lockstep1")
    assert cover.planted["replicate_pairs"] == 2 and len(cover.seeds) == 4


@pytest.mark.parametrize(
    "planted",
    [
        {"kind": "spin", "us": 50},
        {"kind": "gather", "bytes": 4096},
        {"kind": "copy", "bytes": 4096},
        {"kind": "alloc", "bytes": 4096},
        {"kind": "sleep", "us": 50},
    ],
)
def test_a_study_of_command_arms_may_plant_what_its_reporter_runs(planted):
    """The reporter (standard library) runs spin and gather plants; a matmul needs torch."""
    from prereg.planted import plant_problems

    assert plant_problems(planted, command=False) == []
    assert plant_problems(planted, command=True) == []
    [(key, message)] = plant_problems({"kind": "matmul", "n": 64}, command=True)
    assert key == ("kind",) and "needs torch" in message


def test_the_design_bias_table_is_the_committed_calibrations_planted_rows():
    """``benchmarks/design_bias.py`` (the table docs/decisions.md quotes) on the committed records:
    one row per plant and design, its figures the summary's, on both clocks."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[1]
    folder = root / "records" / "calibration-cpu"
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "design_bias.py"), str(folder)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = json.loads((folder / "summary.json").read_text())["planted"]
    lines = [line for line in out.splitlines() if line.startswith("| ") and "design" not in line]
    assert len(lines) == len(rows) // 2  # one line per study, the two clocks side by side
    for r in rows:
        if r.get("bias") is not None and not r.get("reference"):
            cell = f"{r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"
            assert any(r["design"] in line and r["plant"] in line and cell in line for line in lines), r
    assert (
        subprocess.run(
            [sys.executable, str(root / "benchmarks" / "design_bias.py")], capture_output=True
        ).returncode
        == 2
    )


def _with_calibration(text: str, path: str = "protocols/cal.yaml") -> str:
    return text.replace("order_seed:", f"design_calibration: {path}\norder_seed:", 1)


GATHER = "    planted: {kind: gather, bytes: 4096}\n"  # a cache-heavy plant: the default class's cover
SPIN = "    planted: {kind: spin, us: 5}\n"


@pytest.mark.parametrize(
    "cal_studies, studies, key, words",
    [
        # the calibration planted lockstep blocks of 2 and a process per arm: blocks of 3 are not covered
        (
            [study("c2", "lockstep", extra=GATHER), study("cp", extra=GATHER)],
            [study("s", "lockstep").replace("block_steps: 2", "block_steps: 3")],
            "studies[0].block_steps",
            "lockstep, blocks of 3 is not a design the calibration protocols/cal.yaml measured for the effect "
            "class cache-heavy (its planted studies cover: a process per arm (cache-heavy); lockstep, blocks "
            "of 2 (cache-heavy))",
        ),
        # only lockstep calibrated: a process per arm is not covered
        (
            [study("c2", "lockstep", extra=GATHER)],
            [study("s")],
            "studies[0].design",
            "a process per arm is not a design the calibration",
        ),
        # a spin measures the context-free class only: a change of the default class is not covered
        (
            [study("c2", "lockstep", extra=SPIN)],
            [study("s", "lockstep")],
            "studies[0].block_steps",
            "for the effect class cache-heavy (its planted studies cover: lockstep, blocks of 2 (context-free))",
        ),
        # a truth study measures the truth, not a design
        (
            [
                study("c2", "lockstep", extra=SPIN),
                study("t", extra="    planted: {kind: gather, bytes: 64, toggle_steps: 2}\n"),
            ],
            [study("s")],
            "studies[0].design",
            "a process per arm is not a design the calibration",
        ),
        # a calibration that plants nothing measured nothing
        ([study("c2", "lockstep")], [study("s", "lockstep")], "design_calibration", "plants nothing"),
    ],
)
def test_a_design_no_calibration_covers_is_refused_with_file_key_and_line(
    repo, cal_studies, studies, key, words
):
    (repo / "protocols" / "cal.yaml").write_text(planted_protocol(*cal_studies, hypotheses=DESCRIPTIVE))
    (repo / "protocols" / "p.yaml").write_text(
        _with_calibration(planted_protocol(*studies, hypotheses=DESCRIPTIVE))
    )
    out = harness(repo, "plan", "protocols/p.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr
    assert re.search(r"protocols/p\.yaml:\d+, key ", err) and key in err and words in err, err
    assert "Traceback" not in err


def test_the_declared_effect_class_chooses_what_the_calibration_must_cover(repo):
    """``effect_class`` names the class of the change: a spin-only calibration covers a
    context-free change and refuses a cache-heavy one at the key; an unknown class, or a class
    without a calibration to answer for it, is refused with file, key and line, nothing written."""
    (repo / "protocols" / "cal.yaml").write_text(
        planted_protocol(study("c2", "lockstep", extra=SPIN), hypotheses=DESCRIPTIVE)
    )
    text = _with_calibration(planted_protocol(study("s", "lockstep"), hypotheses=DESCRIPTIVE))
    for name, cls, code, words in (
        ("a", "context-free", 0, ""),
        ("b", "cache-heavy", 2, "key effect_class: lockstep, blocks of 2 is not a design"),
        ("c", "bandwidth", 2, "plant a bandwidth cost (copy)"),
        ("d", "cache-hot", 2, "key effect_class"),
    ):
        (repo / "protocols" / f"{name}.yaml").write_text(
            text.replace("order_seed:", f"effect_class: {cls}\norder_seed:", 1)
        )
        out = harness(repo, "plan", f"protocols/{name}.yaml")
        assert out.returncode == code and words in out.stderr, (name, out.stdout + out.stderr)
        assert "Traceback" not in out.stderr
    bare = planted_protocol(study("s", "lockstep"), hypotheses=DESCRIPTIVE)
    (repo / "protocols" / "e.yaml").write_text(
        bare.replace("order_seed:", "effect_class: context-free\norder_seed:", 1)
    )
    out = harness(repo, "plan", "protocols/e.yaml")
    assert out.returncode == 2 and "key effect_class" in out.stderr and "design_calibration" in out.stderr, (
        out.stderr
    )
    assert not (repo / "records").exists()


def test_a_covered_design_plans_and_a_planted_study_beside_it_needs_no_cover(repo):
    (repo / "protocols" / "cal.yaml").write_text(
        planted_protocol(study("c2", "lockstep", extra=GATHER), hypotheses=DESCRIPTIVE)
    )
    text = planted_protocol(
        study("s", "lockstep"),
        study("ref", extra=SPIN),  # a process per arm, but planted
        hypotheses=DESCRIPTIVE,
    )
    (repo / "protocols" / "p.yaml").write_text(_with_calibration(text))
    out = harness(repo, "plan", "protocols/p.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    (repo / "protocols" / "q.yaml").write_text(_with_calibration(text, "protocols/none.yaml"))
    missing = harness(repo, "plan", "protocols/q.yaml")
    assert missing.returncode == 2 and "key design_calibration" in missing.stderr, missing.stderr
    assert "is not a protocol file inside the repository" in missing.stderr


CLASSES_FLAGS = [
    "--sizes",
    "2,5",
    "--designs",
    "0,1,10,50",
    "--pairs",
    "8",
    "--matmul",
    "200",
    "--matmul-pairs",
    "8",
    "--coverage-sizes",
    "2",
    "--coverage-designs",
    "1",
    "--coverage-pairs",
    "8",
    "--replicate-pairs",
    "4",
    "--plants",
    "gather:2097152,copy:1048576,alloc:4194304,sleep:50",
    "--plant-pairs",
    "8",
    "--truth-runs",
    "8",
]


def test_the_committed_calibration_protocols_are_what_the_command_writes(tmp_path):
    """``harness calibration-study`` from the committed pilot writes each committed calibration
    protocol byte for byte (its header names the command), so its sizes keep their origin."""
    root = Path(__file__).resolve().parent.parent
    commands = {
        "calibration-cpu.yaml": [],
        "calibration-cpu-coverage.yaml": [
            "--id",
            "calibration-cpu-coverage",
            "--designs",
            "1",
            "--matmul-pairs",
            "0",
            "--coverage-sizes",
            "0.5,1,2,5",
            "--coverage-designs",
            "1",
            "--seed-base",
            "1100000",
            "--order-seed",
            "20261205",
        ],
        # the effect classes with their truth studies, quiet and under a known load (docs/decisions.md)
        "calibration-classes.yaml": [
            "--id",
            "calibration-classes",
            *CLASSES_FLAGS,
            "--seed-base",
            "1200000",
            "--order-seed",
            "20261206",
        ],
        "calibration-classes-loaded.yaml": [
            "--id",
            "calibration-classes-loaded",
            *CLASSES_FLAGS,
            "--seed-base",
            "1300000",
            "--order-seed",
            "2026120602",
            "--load",
            "python benchmarks/load.py --busy 1 --memory-mib 256",
        ],
    }
    for name, extra in commands.items():
        committed = root / "protocols" / name
        if not committed.exists():
            continue
        # the command reads configs/ above its output: write beside the committed file, then remove
        out = root / "protocols" / f".regen-{tmp_path.name}-{name}"
        try:
            done = harness(
                root, "calibration-study", "protocols/calibration-cpu-pilot.yaml", "--out", str(out), *extra
            )
            assert done.returncode == 0, done.stderr
            assert out.read_text() == committed.read_text(), name
        finally:
            out.unlink(missing_ok=True)


def test_a_spin_only_calibration_counts_coverage_at_every_size(tmp_path):
    plan = _calibration_plan(
        step_cpu_us=3000.0,
        pilot_runs=8,
        sizes=(0.5, 1.0, 5.0),
        designs=(1,),
        matmul_pairs=0,
        coverage_sizes=(0.5, 1.0, 5.0),
        coverage_pairs=8,
        replicate_pairs=4,
    )
    text, counts, proto = _written(plan, tmp_path)
    assert counts == {"lockstep1": 24}
    assert "matmul" not in text
    assert [(s.planted["us"], s.planted["replicate_pairs"], len(s.seeds)) for s in proto.studies] == [
        (15, 4, 8),
        (30, 4, 8),
        (150, 4, 8),
    ]


# -- truth studies: the plant on and off in one process ---------------------------------------------


def test_toggled_runs_the_plant_in_abba_blocks():
    from prereg.planted import toggled

    assert [toggled(i, 2) for i in range(10)] == [
        False,
        False,
        True,
        True,
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert all(toggled(i, None) for i in range(5))


@pytest.mark.parametrize("cost", [0.0, 0.02, 0.08])
def test_a_truth_study_reads_a_plant_of_known_cost(cost):
    """Step times whose planted steps cost ``exp(cost)`` more, and whose first step after a change
    pays a transition: :func:`toggle_truth` leaves each block's first step out and reads ``cost``."""
    from prereg.planted import toggle_means, toggle_truth, toggled

    rng = random.Random(3)
    times = []
    for i in range(400):
        on = toggled(i, 10)
        jump = 0.5 if i and on != toggled(i - 1, 10) else 0.0  # the first step after a change: its cost
        times.append(round(3000 * math.exp((cost if on else 0.0) + jump + rng.gauss(0, 0.01))))
    m = toggle_means(times, 10, 10)
    assert m is not None
    assert toggle_truth(m) == pytest.approx(cost, abs=0.004)
    assert toggle_means(times[:15], 10, 10) is None  # no planted step left once warm-up is out


def test_the_standard_library_plants_run_as_the_harness_plants_them():
    """copy, alloc and sleep from a reporter (command arms) and from the trainer's plant: the
    sleep's wall time is its length and its CPU time a small part of it; a copy writes its target."""
    import time as _time

    from harness.reporter import copy, plant_of

    src, dst = bytearray(b"\x07" * 4096), bytearray(4096)
    copy(src, dst)
    assert dst == src
    nap = plant_of({"kind": "sleep", "us": 20000})
    t0, c0 = _time.perf_counter(), _time.process_time()
    nap()
    wall, cpu = _time.perf_counter() - t0, _time.process_time() - c0
    assert wall >= 0.02 and cpu < 0.01
    for planted in ({"kind": "alloc", "bytes": 1 << 20}, {"kind": "copy", "bytes": 1 << 20}):
        p = Plant(planted, torch.device("cpu"))
        p()
        assert p.wall_s > 0 and p.runs_in(0)
    assert not Plant({"kind": "spin", "us": 1, "toggle_steps": 3}, torch.device("cpu")).runs_in(0)


def test_the_calibration_verdict_names_the_design_with_the_nearest_bias_per_class(tmp_path):
    """``harness calibration-verdict`` on the committed calibration: per class, the design whose bias
    interval's far end lies nearest zero over the class's plants, its figures the summary's."""
    import json

    from analysis.calibration_study import verdicts

    root = Path(__file__).resolve().parent.parent
    folder = root / "records" / "calibration-cpu"
    rows = json.loads((folder / "summary.json").read_text())["planted"]
    vs = verdicts(rows)
    for cls in ("cache-heavy", "context-free"):
        ranked = [v for v in vs if v.effect_class == cls]
        assert ranked and [v.worst for v in ranked] == sorted(v.worst for v in ranked)
        for v in ranked:  # the far end of the worst plant's interval
            assert v.worst == max(max(abs(r["bias_lo"]), abs(r["bias_hi"])) for r in v.rows)
    out = harness(root, "calibration-verdict", str(folder))
    assert out.returncode == 0, out.stderr
    best = next(v for v in vs if v.effect_class == "cache-heavy")
    assert f"cache-heavy (CPU clock): use {best.design}:" in out.stdout
    assert f"{folder}: its load is not in these records" in out.stdout
    bad = harness(root, "calibration-verdict", str(tmp_path))
    assert bad.returncode == 2 and "not a records folder" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "plants,words",
    [
        ("gather:0", "bytes must be an integer from 1"),
        ("teleport:5", "KIND:SIZE with KIND one of"),
        ("copy", "KIND:SIZE"),
    ],
)
def test_a_calibration_study_refuses_a_plant_it_cannot_run(tmp_path, plants, words):
    root = Path(__file__).resolve().parent.parent
    out = harness(
        root,
        "calibration-study",
        "protocols/calibration-cpu-pilot.yaml",
        "--out",
        str(tmp_path / "c.yaml"),
        "--plants",
        plants,
        "--truth-runs",
        "4",
    )
    assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "c.yaml").exists()


def test_a_calibration_study_with_every_class_plans_a_truth_study_for_each_plant(tmp_path):
    """``--plants`` and ``--truth-runs``: each plant through every design and a truth study of its
    own (a process per arm, the plant toggled), which covers no design."""
    from harness.protocol import load_protocol
    from prereg.planted import calibrated_designs
    from prereg.yamlsub import yaml_subset

    root = Path(__file__).resolve().parent.parent
    repo = init_study(tmp_path / "s", copy=("configs", "protocols", "records/calibration-cpu-pilot"))
    out = harness(
        repo,
        "calibration-study",
        "protocols/calibration-cpu-pilot.yaml",
        "--out",
        "protocols/c.yaml",
        "--id",
        "c",
        "--sizes",
        "2",
        "--designs",
        "0,1",
        "--matmul-pairs",
        "0",
        "--coverage-designs",
        "1",
        "--coverage-pairs",
        "4",
        "--plants",
        "gather:4194304,copy:1048576,alloc:4194304,sleep:50",
        "--plant-pairs",
        "4",
        "--truth-runs",
        "3",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    proto = load_protocol(repo / "protocols" / "c.yaml")
    truths = [s for s in proto.studies if s.name.endswith("_truth")]
    assert sorted(s.name for s in truths) == sorted(
        ["spin2p0_truth", "gather4m_truth", "copy1m_truth", "alloc4m_truth", "sleep50us_truth"]
    )
    assert all(s.planted["toggle_steps"] == 2 and s.steps == 600 and len(s.seeds) == 3 for s in truths)
    doc = yaml_subset((repo / "protocols" / "c.yaml").read_text())
    assert calibrated_designs(doc) == {
        None: {"context-free", "cache-heavy", "bandwidth", "allocation", "wall-only"},
        1: {"context-free", "cache-heavy", "bandwidth", "allocation", "wall-only"},
    }
    assert root.exists()
