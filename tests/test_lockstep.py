"""Lockstep pairs (``design: lockstep``): both arms of a pair trained in one process, alternating
blocks of ``block_steps`` steps in ABBA order.

* Each arm's trajectory is bitwise the one its seed gives alone: losses, validation, test BPB and
  the trained weights, for every model family (the four tiny configurations) and every built-in
  arm, against the same runs one at a time (in process here; against runs in processes of their
  own through the CLI in the long tier, ``test_lockstep_cli.py``).
* The plan balances which arm is built first against which steps first; the audit's plan is the
  harness's; what lockstep cannot measure is refused at plan time with the reason.
* An arm that writes its partner's tensors or draws from the global random state fails the pair,
  named; a runner that dies mid-pair leaves both attempts recorded, and the pair runs again whole.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import init_study, pinned_corpus, record_dicts, tiny_protocol
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from harness.execute.inprocess import InProcessExecutor  # noqa: E402
from harness.execute.lockstep import blocks  # noqa: E402
from harness.execute.runner import Runner  # noqa: E402
from harness.plan import make_plan, units  # noqa: E402
from harness.protocol import load_protocol  # noqa: E402
from prereg.errors import InputError
from prereg.plan import expected_summary, plan_from_protocol
from prereg.protocol.read import protocol_from_text

RECS = Path("records") / "tiny"
FAMILIES = "[tiny_conv, tiny_transformer, tiny_gqa, tiny_medium]"
CORPUS_BYTES = 120_000  # the lockstep fixture's corpus: the embedded one's first bytes (a quarter of them)


def protocol(design: str, *, steps: int = 6, block: int = 2, seeds: str = "[1, 2]", extra: str = "") -> str:
    """Two studies (every built-in arm: native against cotangent, bucketed against packed) over the
    four model families."""
    text = tiny_protocol(steps=steps).replace("study: pairs\n", "study: pairs\n      config: tiny_conv\n")
    study = text[text.index("  - name: pairs") :]
    lock = f"\n    block_steps: {block}" if design == "lockstep" else ""
    study = (
        study.replace("design: paired", f"design: {design}{lock}")
        .replace("configs: [tiny_conv]", f"configs: {FAMILIES}")
        .replace("seeds: [1, 2]", f"seeds: {seeds}")
    )
    other = study.replace("name: pairs", "name: others").replace("[native, cotangent]", "[bucketed, packed]")
    return text[: text.index("  - name: pairs")] + study + other + extra


def run(repo: Path, lines: list[str] | None = None, executor: InProcessExecutor | None = None):
    out = lines if lines is not None else []
    proto = load_protocol(repo / "protocols" / "tiny.yaml")
    return Runner(proto, echo=out.append, executor=executor or InProcessExecutor()).run()


def by_run(repo: Path) -> dict[str, dict]:
    return {r["spec"]["run_id"]: r for r in record_dicts(repo / RECS)}


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict], dict[str, dict]]:
    """The same two studies run one run at a time and in lockstep (2 seeds, 6 steps, blocks of 2),
    over the embedded corpus's first 120,000 bytes as a pinned local corpus (a quarter): the final
    evaluation scores every byte of the valid and test splits (the test split twice, re-scored), which
    over the whole corpus was more than half of these 64 runs' time; six steps train on a few
    kilobytes of either."""
    tmp = tmp_path_factory.mktemp("lockstep")
    studies = []
    for name, design in (("solo", "paired"), ("lock", "lockstep")):
        corpus = pinned_corpus(tmp / name, size=CORPUS_BYTES)
        text = protocol(design)
        assert "corpus: pydoc-topics\n" in text
        studies.append(init_study(tmp / name, protocol=text.replace("pydoc-topics", corpus, 1)))
    solo, lock = studies
    for repo in studies:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(repo)  # as a worker runs: the corpus file read from its study's root
            assert run(repo).left == 0
    return by_run(solo), by_run(lock)


def test_every_family_and_arm_trains_bitwise_as_alone(both):
    solo, lock = both
    assert set(solo) == set(lock) and len(solo) == 2 * 2 * 4 * 2  # studies x seeds x families x arms
    arms = Counter()
    for rid, a in solo.items():
        b = lock[rid]
        assert b["status"] == a["status"] == "ok", (rid, b.get("reason"))
        assert [c[:2] for c in b["curve"]] == [c[:2] for c in a["curve"]], rid  # (step, loss), exact
        assert [v[:2] for v in b["val_curve"]] == [v[:2] for v in a["val_curve"]], rid
        assert (b["val_bpb"], b["test_bpb"]) == (a["val_bpb"], a["test_bpb"]), rid
        wa, wb = load_file(a["checkpoint"]["path"]), load_file(b["checkpoint"]["path"])
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), rid
        arms[b["spec"]["arm"]] += 1
    assert set(arms) == {"native", "cotangent", "bucketed", "packed"}


def test_each_record_names_its_partner_order_and_clocks(both):
    _, lock = both
    for rid, r in lock.items():
        spec, env = r["spec"], r["env"]["lockstep"]
        partner = lock[spec["partner"]]
        assert partner["spec"]["partner"] == rid and partner["spec"]["unit"] == spec["unit"]
        assert spec["block_steps"] == env["block_steps"] == 2
        assert env["built"] == ("first" if spec["position"] == 0 else "second")
        assert env["steps"] == ("first" if spec["steps_first"] else "second")
        assert spec["steps_first"] != partner["spec"]["steps_first"]
        t = r["timings"]
        assert 0 < t["training_cpu_s"] and t["training_cpu_clock"].startswith("time.thread_time")
        assert t["device_s"] == pytest.approx(t["pair_device_s"] / 2)
        pt = partner["timings"]  # one process ran both: its total is the pair's, said so
        assert t["total_s"] == pt["total_s"] and t["total_s_of"] == "the lockstep pair's process"
        assert t["total_s"] > t["setup_s"] + pt["setup_s"] + t["evaluation_s"] + pt["evaluation_s"]
        assert "half of its lockstep pair's process" in t["device_s_source"]
        assert "primary" not in r["memory"] and "pair's" in r["memory"]["shared"]


def test_paired_runs_record_cpu_time_too(both):
    solo, _ = both
    for r in solo.values():
        assert 0 < r["timings"]["training_cpu_s"] and "spec" in r and "partner" not in r["spec"]


@given(steps=st.integers(1, 60), block=st.integers(1, 60))
def test_blocks_alternate_abba_and_give_each_arm_its_steps(steps, block):
    block = min(block, steps)
    seq = list(blocks(steps, block))
    assert sum(n for a, n in seq if a == 0) == steps == sum(n for a, n in seq if a == 1)
    assert all(0 < n <= block for _, n in seq)
    full = [a for a, n in seq]
    want = [(0, 1, 1, 0)[k % 4] for k in range(len(full))]
    # ABBA until one arm is done; the other's last blocks follow
    k = next((i for i, (x, y) in enumerate(zip(full, want)) if x != y), len(full))
    assert all(a == full[-1] for a in full[k:]) and seq[0][0] == 0


def test_the_plan_crosses_build_order_with_who_steps_first(tmp_path):
    repo = init_study(tmp_path / "s", protocol=protocol("lockstep", seeds="{count: 8, base: 10}"))
    proto = load_protocol(repo / "protocols" / "tiny.yaml")
    plan = make_plan(proto)
    for study in ("pairs", "others"):
        for config in ("tiny_conv", "tiny_gqa"):
            us = [u for u in units(plan) if u[0].study == study and u[0].config == config]
            combos = [(u[0].role, u[0].steps_first) for u in us]
            for g in (combos[:4], combos[4:]):  # each group of four pairs: all four combinations
                assert sorted(g) == sorted(
                    [("baseline", True), ("baseline", False), ("candidate", True), ("candidate", False)]
                )
            for u in us:
                a, b = u
                assert (a.position, b.position) == (0, 1) and a.partner == b.run_id and b.partner == a.run_id
                assert a.steps_first != b.steps_first and a.block_steps == b.block_steps == 2
                assert a.design == "lockstep"  # its own name (records schema 6 on)
    text = (repo / "protocols" / "tiny.yaml").read_text()
    shas = {c: cfg.sha256 for c, cfg in proto.configs.items()}
    assert plan_from_protocol(protocol_from_text(text.encode(), "tiny.yaml"), proto.sha256, shas) == [
        r.to_json() for r in plan
    ]
    summary = proto.summary()
    assert (
        summary["studies"][0]["lockstep"] == {"block_steps": 2}
        and summary["studies"][0]["design"] == "lockstep"
    )
    audit_summary = expected_summary(
        protocol_from_text(text.encode(), "tiny.yaml"), proto.sha256, summary["path"]
    )
    assert audit_summary["studies"] == summary["studies"]


@pytest.mark.parametrize(
    "change, key, says",
    [
        (("block_steps: 2", ""), "studies[0]", "block_steps"),
        (("block_steps: 2", "block_steps: 7"), "studies[0].block_steps", "exceeds steps"),
        (("compile: false", "compile: true"), "compile", "lockstep study runs eagerly"),
        (("endpoint: test_bpb", "endpoint: peak_memory"), "hypotheses.tests[0].endpoint", "memory peak"),
        (("endpoint: test_bpb", "endpoint: total_time"), "hypotheses.tests[0].endpoint", "start-up"),
        (("preregistered: false", "preregistered: true"), "origins", "origins.block_steps"),
    ],
)
def test_what_lockstep_cannot_measure_is_refused_at_plan_time(tmp_path, change, key, says):
    text = protocol("lockstep").replace(*change, 1)
    if "total_time" in change[1] or "peak_memory" in change[1]:
        text = text.replace("estimand: difference", "estimand: log_ratio").replace(
            "non_inferiority", "superiority"
        )
    repo = init_study(tmp_path / "s", protocol=text)
    with pytest.raises(InputError) as e:
        load_protocol(repo / "protocols" / "tiny.yaml")
    assert f"key {key}" in str(e.value) and says in str(e.value), str(e.value)


def test_block_steps_belongs_to_lockstep_and_cpu_time_to_the_cpu(tmp_path):
    text = protocol("paired").replace("design: paired", "design: paired\n    block_steps: 2", 1)
    repo = init_study(tmp_path / "a", protocol=text)
    with pytest.raises(InputError, match="block_steps belongs to a lockstep study"):
        load_protocol(repo / "protocols" / "tiny.yaml")
    text = (
        protocol("paired")
        .replace("device: cpu", "device: cuda")
        .replace("endpoint: test_bpb", "endpoint: training_cpu_time")
        .replace("estimand: difference", "estimand: log_ratio")
        .replace("non_inferiority", "superiority")
    )
    repo = init_study(tmp_path / "b", protocol=text)
    with pytest.raises(InputError, match="training_cpu_time on device 'cuda'"):
        load_protocol(repo / "protocols" / "tiny.yaml")


PLUGIN = '''
import torch
from harness.arms import ArmContext, resolve

SEEN = []


class Meddler:
    """Native, and ({what}): as the second of two such arms built, a write to its partner's weights
    (a module-level cache shared between instances); or a draw from the global random state."""

    def __init__(self, ctx: ArmContext) -> None:
        self.inner = resolve("native")(ctx)
        self.optimizer = self.inner.optimizer
        SEEN.append(ctx.params)
        self.others = SEEN[-2] if len(SEEN) % 2 == 0 else None  # the partner's, built just before
        if self.others is not None and "{what}" == "build":
            with torch.no_grad():
                self.others[0].add_(1.0)
        if "{what}" == "threads":
            torch.set_num_threads(2)

    def phase(self):
        out = self.inner.phase()
        if self.others is not None and "{what}" == "partner":
            with torch.no_grad():
                self.others[0].add_(1.0)
        if self.others is not None and "{what}" == "data":  # no version counter sees this write
            self.others[0].data.add_(1.0)
        if "{what}" == "rng":
            torch.rand(1)
        if "{what}" == "precision" and not hasattr(self, "flipped"):  # once per arm, in every pair
            self.flipped = "medium" if torch.get_float32_matmul_precision() == "highest" else "highest"
            torch.set_float32_matmul_precision(self.flipped)
        return out

    def set_lr(self, lr):
        self.inner.set_lr(lr)

    def zero_grad(self):
        self.inner.zero_grad()


def build(ctx):
    return Meddler(ctx)
'''


SHARED = ("partner", "data", "build")  # cases where the arm built second meddles with its partner


@pytest.mark.parametrize(
    "what, says",
    [
        ("partner", "wrote its partner's tensors during its block"),
        ("data", "wrote its partner's tensors during its block"),
        ("build", "wrote its partner's tensors while it was built"),
        ("rng", "global random state"),
        ("threads", "changed process-wide torch settings while it was built (threads 1 -> 2"),
        ("precision", "changed process-wide torch settings during its block (float32 matmul precision"),
    ],
)
def test_an_arm_that_leaks_fails_the_pair_named(tmp_path, monkeypatch, what, says):
    module = f"meddle_{what}"  # a module per case: this process imports each once
    arms = f"[{module}:build, {module}:build]" if what in SHARED else f"[native, {module}:build]"
    text = protocol("lockstep", seeds="[1, 2]").replace("[bucketed, packed]", arms)
    text = text.replace(f"configs: {FAMILIES}", "configs: [tiny_conv]")
    repo = tmp_path / "s"
    repo.mkdir()
    (repo / f"{module}.py").write_text(PLUGIN.replace("{what}", what))
    init_study(repo, protocol=text)
    monkeypatch.syspath_prepend(str(repo))  # as a worker has the study's root on its path
    end = run(repo)
    recs = by_run(repo)
    others = {rid: r for rid, r in recs.items() if rid.startswith("others.")}
    # an arm that fails before its first step stops the study after its first pair (prereg/failstop.py)
    pairs_run = 1 if end.stopped_for_failure else 2
    assert end.failed == len(others) == 2 * pairs_run and {r["status"] for r in others.values()} == {"failed"}
    assert end.stopped_for_failure is None or "others" in end.stopped_for_failure
    for rid, r in others.items():
        meddles = r["spec"]["position"] == 1 if what in SHARED else r["spec"]["arm"] != "native"
        culprit = rid if meddles else r["spec"]["partner"]
        if rid == culprit:
            assert says in r["reason"] and f"{module}:build" in r["reason"], r["reason"]
        else:
            assert r["reason"].startswith(f"its lockstep partner {culprit} failed:") and says in r["reason"]
    assert all(r["status"] == "ok" for rid, r in recs.items() if rid.startswith("pairs."))
    torch.set_num_threads(1)  # as the pair's process found them (this test's process goes on)
    torch.set_float32_matmul_precision("highest")


class Crash(BaseException):
    """The runner's process dying mid-pair (not an Exception: nothing records it)."""


def test_a_runner_that_dies_mid_pair_leaves_both_attempts_and_the_pair_runs_again_whole(
    tmp_path, monkeypatch
):
    import harness.execute.lockstep as lockstep

    text = protocol("lockstep").replace(f"configs: {FAMILIES}", "configs: [tiny_conv]")
    repo = init_study(tmp_path / "s", protocol=text)
    real, calls = lockstep.execute_pair, []

    def dies_on_the_third(job, partials):
        calls.append(job)
        if len(calls) == 3:
            raise Crash
        return real(job, partials)

    monkeypatch.setattr(lockstep, "execute_pair", dies_on_the_third)
    with pytest.raises(Crash):
        run(repo)
    monkeypatch.setattr(lockstep, "execute_pair", real)
    lines: list[str] = []
    assert run(repo, lines).left == 0
    crashed = calls[2].jobs
    for job in crashed:
        assert any(x.startswith(f"noted interrupted attempt 1 of {job.spec.run_id}") for x in lines), lines
    recs = record_dicts(repo / RECS)
    mine = [r for r in recs if r["spec"]["unit"] == crashed[0].spec.unit]
    assert sorted((r["status"], r["attempt"], r["unit_attempt"]) for r in mine) == [
        ("interrupted", 1, 1),
        ("interrupted", 1, 1),
        ("ok", 2, 2),
        ("ok", 2, 2),
    ]
    assert len(recs) == 8 + 2  # every planned run once ok, and the two interrupted attempts


@settings(deadline=None)  # the first example imports scipy
@given(
    a=st.lists(st.integers(-500_000, 500_000).map(lambda k: k / 1e6), min_size=2, max_size=30),
    b=st.lists(st.integers(-500_000, 500_000).map(lambda k: k / 1e6), min_size=2, max_size=30),
    level=st.sampled_from([0.9, 0.95, 0.99]),
)
def test_the_design_difference_is_welchs_interval_as_scipy_gives_it(a, b, level):
    from scipy import stats

    from prereg.designs import welch_difference

    if len(set(a)) == len(set(b)) == 1:  # log ratios to the microunit: spread 0 or at least 1e-6
        with pytest.raises(ValueError):
            welch_difference(a, b, level)
        return
    got = welch_difference(a, b, level)
    want = stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)
    scale = max(1.0, abs(got.difference), got.se)
    assert got.lo == pytest.approx(want.low, rel=1e-9, abs=1e-9 * scale)
    assert got.hi == pytest.approx(want.high, rel=1e-9, abs=1e-9 * scale)


def test_power_plans_a_lockstep_target_from_the_pilots_lockstep_pairs_only():
    """A pilot with A/A pairs in both designs: harness power's noise for a lockstep study is its
    lockstep pairs' of the same block size, for a paired study the process-per-arm pairs'."""
    import math
    import random

    from conftest import synthetic_record

    from analysis.power import aa_noise

    rng = random.Random(5)
    recs = []
    studies = []
    for name, block, sd in (("solo", None, 0.2), ("lock1", 1, 0.01), ("lock25", 25, 0.05)):
        studies.append({"name": name, "design": "paired", "arms": ["native", "native"], "configs": ["c"]})
        for i in range(12):
            b = math.exp(rng.gauss(0, 0.1))
            for role, t in (("baseline", b), ("candidate", b * math.exp(rng.gauss(0, sd)))):
                lock = {"block_steps": block, "partner": f"{name}.u{i}.x", "steps_first": role == "baseline"}
                recs.append(
                    synthetic_record(
                        {"study": name, "unit": f"{name}.u{i}", "role": role, **(lock if block else {})},
                        protocol={"studies": studies},
                        test_bpb=3.0,
                        timings={"training_s": t, "training_cpu_s": t},
                    )
                )
    got = {b: aa_noise(recs, "training_cpu_time", "log_ratio", b)["c"] for b in (None, 1, 25)}
    assert all(n.pairs == 12 for n in got.values())
    assert 0.1 < got[None].sd < 0.3 and got[1].sd < 0.02 and 0.02 < got[25].sd < 0.1


def test_a_half_recorded_pair_is_pending_and_runs_again_whole(tmp_path, monkeypatch):
    """The runner dies after one arm's record and before its partner's: that arm is not done
    (``harness status`` says both are pending), and the pair runs again whole as a new unit attempt."""
    from harness.execute.state import status_table

    text = protocol("lockstep").replace(f"configs: {FAMILIES}", "configs: [tiny_conv]")
    repo = init_study(tmp_path / "s", protocol=text)
    real, calls = Runner.finished, []

    def dies_between_the_arms(self, spec, attempt, outcome, node=None):
        calls.append(spec.run_id)
        if len(calls) == 4:  # the second pair's second arm
            raise Crash
        return real(self, spec, attempt, outcome, node)

    monkeypatch.setattr(Runner, "finished", dies_between_the_arms)
    with pytest.raises(Crash):
        run(repo)
    monkeypatch.setattr(Runner, "finished", real)
    proto = load_protocol(repo / "protocols" / "tiny.yaml")
    rows = {r["study"]: r for r in status_table(proto)[0]}
    assert (rows["pairs"]["done"], rows["pairs"]["pending"]) == (2, 2), rows
    end = run(repo)
    assert end.left == 0
    mine = [
        r for r in record_dicts(repo / RECS) if r["spec"]["unit"] == by_run(repo)[calls[3]]["spec"]["unit"]
    ]
    assert sorted((r["spec"]["run_id"] == calls[2], r["status"], r["unit_attempt"]) for r in mine) == [
        (False, "interrupted", 1),
        (False, "ok", 2),
        (True, "ok", 1),
        (True, "ok", 2),
    ]
    rows = {r["study"]: r for r in status_table(proto)[0]}
    assert (rows["pairs"]["done"], rows["pairs"]["pending"], rows["pairs"]["superseded_attempts"]) == (
        4,
        0,
        2,
    )


def _after_own(text: str, design: str = "lockstep") -> str:
    """The tiny protocol's H1 on the after-own CPU time of a study in ``design`` (blocks of 1)."""
    text = text.replace(
        "endpoint: test_bpb\n      estimand: difference\n      type: non_inferiority\n      margin: 0.01",
        "endpoint: own_step_cpu_time\n      estimand: relative_reduction\n      type: superiority\n      margin: 0",
    )
    if design == "lockstep":
        text = text.replace("design: paired", "design: lockstep\n    block_steps: 1")
    return text.replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4]")


def test_a_lockstep_study_decides_on_its_arms_steps_after_their_own(tmp_path):
    """``own_step_cpu_time``: each arm's mean CPU step time over its steps after its own step (the
    worker joins an arm's consecutive blocks into one turn, and says so); its hypothesis is decided
    on ``ln(m_c / m_b)`` of those means, which the summary's pair columns hold and the audit's plan
    recomputes."""
    import math

    from prereg.carryover import follows, own_step_means
    from prereg.formats.record import load_records
    from prereg.formats.summary import derive

    repo = init_study(tmp_path / "s", protocol=_after_own(tiny_protocol(steps=12)))
    assert run(repo).left == 0
    recs = by_run(repo)
    for r in recs.values():
        assert r["env"]["lockstep"]["turns"] == "joined"
    summary = derive(load_records(repo / RECS))
    [pairs] = [c.pairs for s in summary.studies for c in s.configs]
    assert len(pairs) == 4
    for p in pairs:
        b, c = recs[f"{p.unit}.baseline"], recs[f"{p.unit}.candidate"]
        for role, r in (("baseline", b), ("candidate", c)):
            after = follows(12, 1)[0 if r["spec"]["steps_first"] else 1]
            want = own_step_means(r["step_times"]["cpu_us"], after, r["spec"].get("warmup_steps") or 0)
            assert p.value(role, "own_step_cpu_us") == want
    [d] = summary.hypotheses.decisions
    values = [math.log(p.candidate_own_step_cpu_us / p.baseline_own_step_cpu_us) for p in pairs]
    mean = sum(values) / len(values)
    assert d.decision.test is not None and d.decision.status != "not reached", d.decision.reason
    assert d.decision.estimate == pytest.approx(100 * (1 - math.exp(mean)))  # the reduction, percent


def test_the_after_own_endpoint_is_refused_off_lockstep(tmp_path):
    from conftest import harness

    repo = init_study(tmp_path / "s", protocol=_after_own(tiny_protocol(steps=12), design="paired"))
    out = harness(repo, "plan", "protocols/tiny.yaml")
    assert out.returncode == 2 and "key hypotheses.tests[0].endpoint" in out.stderr, out.stderr
    assert "own_step_cpu_time is the mean step time after the arm's own step" in out.stderr
    assert "Traceback" not in out.stderr
