"""The runner's state machine, in process: claims, resume after a crash, the budget rule, failed
and retried units, units another runner holds, two runners on one folder, and the ledger each
leaves. The worker is :class:`fake_trainer.FakeTrainer` (no model, no process), so each scenario
takes a second or so; the same scenarios through the real CLI and real workers are in the process
tier (``-m process``: test_protocol_cli, test_run_endings, test_attempts), and
test_runner_scenarios reads how each ends as ``harness run`` says it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import init_study, record_dicts, tiny_protocol
from fake_trainer import Crash, FakeTrainer
from filelock import FileLock

from harness.execute.inprocess import InProcessExecutor
from harness.execute.runner import Runner
from harness.ledger import load_entries
from harness.protocol import load_protocol
from prereg.attempts import completeness
from prereg.formats.record import MANIFEST, load_records
from prereg.formats.summary import records_json

RECS = Path("records") / "tiny"


def study(tmp_path: Path, **kw) -> Path:
    text = tiny_protocol(steps=5, **kw).replace("arms: [native, cotangent]", "arms: [native, native]")
    return init_study(tmp_path / "study", protocol=text.replace("seeds: [1, 2]", "seeds: [1, 2, 3]"))


def run(repo: Path, trainer: FakeTrainer, lines: list[str] | None = None, **kw):
    out = lines if lines is not None else []
    runner = Runner(
        load_protocol(repo / "protocols" / "tiny.yaml"),
        echo=out.append,
        executor=InProcessExecutor(train=trainer),
        **kw,
    )
    return runner.run()


def chain_is_linear(repo: Path) -> list[int]:
    entries = load_entries(repo / RECS)
    seqs = [e["ledger"]["seq"] for e in entries]
    assert seqs == list(range(1, len(seqs) + 1))
    assert all(b["ledger"]["prev"] == a["sha256"] for a, b in zip(entries, entries[1:]))
    manifest = json.loads((repo / RECS / MANIFEST).read_text())
    assert manifest["ledger_head"]["seq"] == len(seqs)  # written when the runner stopped
    assert len(manifest["records"]) + len(manifest["started"]) == len(seqs)
    return seqs


def test_a_study_runs_every_run_once_in_plan_order(tmp_path):
    repo = study(tmp_path)
    fake = FakeTrainer()
    lines: list[str] = []
    end = run(repo, fake, lines)
    assert (end.planned, end.left, end.failed, end.stopped_for_budget) == (6, 0, 0, False)
    recs = record_dicts(repo / RECS)
    assert [r["spec"]["order"] for r in recs] == list(range(6)) and {r["status"] for r in recs} == {"ok"}
    assert len(chain_is_linear(repo)) == 12  # a started entry and a record per run
    assert sum("0 done, 6 left; budget 0 of 600 s spent, 600 s left" in x for x in lines) == 1
    assert any("5 done, 1 left; budget 5 of 600 s spent, 595 s left; ETA 0m01s" in x for x in lines)
    again = run(repo, FakeTrainer())
    assert again.left == 0 and len(record_dicts(repo / RECS)) == 6  # nothing runs twice


def test_a_crash_mid_run_is_recorded_interrupted_and_resumed(tmp_path):
    repo = study(tmp_path)
    with pytest.raises(Crash):
        run(repo, FakeTrainer(crash_at=3))
    assert Counter(r["status"] for r in record_dicts(repo / RECS)) == {"ok": 2}
    lines: list[str] = []
    fake = FakeTrainer()
    end = run(repo, fake, lines)
    assert end.left == 0
    crashed = "pairs.tiny_conv.pair001"
    assert any(x.startswith(f"noted interrupted attempt 1 of {crashed}") for x in lines), lines
    recs = record_dicts(repo / RECS)
    assert Counter(r["status"] for r in recs) == {"ok": 6, "interrupted": 1}
    interrupted = next(r for r in recs if r["status"] == "interrupted")
    assert interrupted["attempt"] == 1 and "did not finish" in interrupted["reason"]
    assert fake.calls[0] == (interrupted["spec"]["run_id"], 2)  # resumed as attempt 2, first
    chain_is_linear(repo)


def test_the_budget_rule_stops_before_the_unit_that_would_exceed_it(tmp_path):
    # each run 1.0 s: the first unit always starts (no ok run to predict from), 2 s spent; the
    # second would need 2 more (2 x the mean of 1.0), 4 > 3.5: no further unit starts
    repo = study(tmp_path, budget=3.5)
    end = run(repo, FakeTrainer(device_s=1.0))
    assert end.stopped_for_budget and end.left == 4 and end.budget is not None
    assert (end.budget.unit, end.budget.todo, end.budget.spent, end.budget.expected) == (
        "pairs.tiny_conv.pair001",
        2,
        2.0,
        2.0,
    )
    done = completeness(records_json(load_records(repo / RECS)))
    assert done.budget_stop is True
    assert "the next unit in plan order (pairs.tiny_conv.pair001: 2 runs, about 2.0 s)" in done.text
    again = run(repo, FakeTrainer())
    assert again.stopped_for_budget and len(record_dicts(repo / RECS)) == 2


def test_a_budget_that_still_fits_is_not_a_budget_stop(tmp_path):
    repo = study(tmp_path, budget=4.0)  # 2 spent + 2 expected = 4: not more than the budget
    end = run(repo, FakeTrainer(device_s=1.0))
    assert end.stopped_for_budget and end.budget is not None and end.budget.unit == "pairs.tiny_conv.pair002"
    assert len(record_dicts(repo / RECS)) == 4  # the third unit: 4 + 2 > 4


def test_a_failed_unit_is_final_until_retried_whole(tmp_path):
    repo = study(tmp_path)
    proto = repo / "protocols" / "tiny.yaml"  # max_attempts: 2, before any run
    proto.write_text(proto.read_text().replace("order_seed: 1", "order_seed: 1\nmax_attempts: 2"))
    victim = "pairs.tiny_conv.pair001.candidate"
    end = run(repo, FakeTrainer(fail={victim}))
    assert end.failed == 1 and end.left == 0  # the unit with a failure is final: nothing left to do
    failed = [r for r in record_dicts(repo / RECS) if r["status"] == "failed"]
    assert [r["spec"]["run_id"] for r in failed] == [victim]
    assert f"deliberate failure of {victim}" in failed[0]["reason"]
    fake = FakeTrainer()
    end = run(repo, fake, retry_failed=True)
    assert end.failed == 0 and end.left == 0
    assert [c[0].rsplit(".", 1)[0] for c in fake.calls] == ["pairs.tiny_conv.pair001"] * 2  # whole
    latest = [r for r in record_dicts(repo / RECS) if r["spec"]["unit"] == "pairs.tiny_conv.pair001"]
    assert sorted((r["unit_attempt"], r["status"]) for r in latest) == [
        (1, "failed"),
        (1, "ok"),
        (2, "ok"),
        (2, "ok"),
    ]


def test_units_another_runner_holds_are_left_to_it(tmp_path):
    repo = study(tmp_path)
    locks = repo / "runs" / "tiny" / "locks"
    locks.mkdir(parents=True)
    with FileLock(str(locks / "pairs.tiny_conv.pair002.lock")):
        end = run(repo, FakeTrainer())
    assert end.left == 2 and end.held_elsewhere == 2 and not end.stopped_for_budget
    assert run(repo, FakeTrainer()).left == 0


def test_two_runners_on_one_folder_make_one_chain(tmp_path):
    """While the first runner's first run is in progress, a second runner does everything else;
    the first then finds nothing left. Every run once, one linear chain, each runner's index kept
    current through the ledger's mark."""
    repo = study(tmp_path)
    second: list[object] = []

    def start_second(job) -> None:
        if not second:
            second.append(run(repo, FakeTrainer()))

    first = FakeTrainer(before=start_second)
    end = run(repo, first)
    assert end.left == 0 and [c[0] for c in first.calls] == ["pairs.tiny_conv.pair000.baseline"] * 1 + [
        "pairs.tiny_conv.pair000.candidate"
    ]
    assert second[0].left == 2 and second[0].held_elsewhere == 2  # the first runner's unit
    recs = record_dicts(repo / RECS)
    assert sorted(Counter(r["spec"]["run_id"] for r in recs).values()) == [1] * 6
    chain_is_linear(repo)
