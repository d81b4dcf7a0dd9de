"""One executor interface: the in-process executor drives the same runner, ledger and records as the
local one (claims, started entries, records that link to them), and the training it runs gives the
same bits as the worker processes' (same seed, weights and batches)."""

from __future__ import annotations

import shutil
import time

import pytest
from conftest import git, harness, init_study, record_dicts, tiny_protocol

from harness.execute.inprocess import InProcessExecutor
from harness.execute.launchers import Outcome
from harness.execute.runner import Runner
from harness.protocol import load_protocol


@pytest.mark.process
def test_in_process_executor_matches_the_local_one(tmp_path):
    repo = init_study(tmp_path / "study", protocol=tiny_protocol(steps=6))
    r = harness(repo, "run", "protocols/tiny.yaml", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    local = {x["spec"]["run_id"]: x for x in record_dicts(repo / "records" / "tiny")}
    shutil.rmtree(repo / "records")
    shutil.rmtree(repo / "runs")
    lines: list[str] = []
    end = Runner(
        load_protocol(repo / "protocols" / "tiny.yaml"), echo=lines.append, executor=InProcessExecutor()
    ).run()
    assert end.left == 0 and end.failed == 0 and not end.stopped_for_budget
    mine = {x["spec"]["run_id"]: x for x in record_dicts(repo / "records" / "tiny")}
    assert set(mine) == set(local) and all(x["status"] == "ok" for x in mine.values())
    for rid, rec in mine.items():
        assert rec["spec"] == local[rid]["spec"] and rec["start"]["seq"] < rec["ledger"]["seq"]
        losses = [point[:2] for point in rec["curve"]]  # (step, loss); the third entry is the clock
        assert (
            losses == [point[:2] for point in local[rid]["curve"]]
            and rec["test_bpb"] == local[rid]["test_bpb"]
        ), rid
    r = harness(repo, "status", "protocols/tiny.yaml")
    assert r.returncode == 0 and "Traceback" not in r.stderr


class _UnreadableResults:
    """An executor whose every worker reports a field this runner does not know."""

    name = "unreadable"

    def execute(self, runner: Runner) -> None:
        for claim in runner.claims():
            try:
                for spec in claim.todo:
                    attempt = runner.next_attempt(spec)
                    runner.started(spec, attempt, unit_attempt=claim.unit_attempt)
                    result = {"status": "ok", "gpu_s": 1.0, "timings": {"device_s": 0.25}}
                    runner.finished(
                        spec, attempt, Outcome(code=0, result=result, wall_s=0.5, started_at=time.time())
                    )
            finally:
                claim.release()


def test_a_worker_result_the_runner_cannot_read_is_recorded_as_failed_naming_it(tmp_path):
    repo = init_study(tmp_path / "study", protocol=tiny_protocol(steps=6))
    Runner(
        load_protocol(repo / "protocols" / "tiny.yaml"), echo=lambda _: None, executor=_UnreadableResults()
    ).run()
    recs = record_dicts(repo / "records" / "tiny")
    assert recs and all(r["status"] == "failed" for r in recs)
    assert all(
        r["reason"] == "the worker's result is not one this runner reads: worker result: unknown fields gpu_s"
        for r in recs
    ), recs[0]["reason"]
    assert all(r["timings"]["device_s"] == 0.25 and "gpu_s" not in r for r in recs)


@pytest.mark.parametrize(
    "args, said",
    [
        (("--executor", "nosuch"), "--executor nosuch: no executor of that name (one of: local, ray)"),
        (
            ("--executor", "local", "--ray", "auto"),
            "--executor local and --ray auto: --ray is --executor ray; name one",
        ),
    ],
)
def test_an_executor_harness_run_does_not_offer_is_refused_with_nothing_written(tmp_path, args, said):
    """An unknown executor name (or --ray beside another executor): one line naming it, exit 2, no
    traceback, and nothing written (no runs/ or records/ folder: git sees no file, ignored or not)."""
    repo = init_study(tmp_path / "study", protocol=tiny_protocol(steps=6))
    r = harness(repo, "run", "protocols/tiny.yaml", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"harness run: error: {said}; nothing was run"], r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
    assert git(repo, "status", "--porcelain", "--ignored") == ""
    assert not (repo / "runs").exists() and not (repo / "records").exists()


def test_executors_are_chosen_by_name_and_ray_is_executor_ray():
    from harness.execute.local import LocalExecutor
    from harness.execute.ray import RayExecutor
    from harness.execute.registry import DEFAULT, EXECUTORS, executor_named

    assert DEFAULT == "local" and sorted(EXECUTORS) == ["local", "ray"]
    assert isinstance(executor_named(None), LocalExecutor)
    assert isinstance(executor_named("local"), LocalExecutor)
    ray = executor_named("ray")
    assert isinstance(ray, RayExecutor) and ray.address == "auto"
    for named in (executor_named(None, "10.0.0.2:6379"), executor_named("ray", "10.0.0.2:6379")):
        assert isinstance(named, RayExecutor) and named.address == "10.0.0.2:6379"
    assert {n: type(EXECUTORS[n](None)).name for n in EXECUTORS} == {"local": "local", "ray": "ray"}


def test_an_executor_reads_the_run_through_a_context_it_cannot_change(tmp_path):
    """The runner hands an executor the claim-and-report port and a frozen, read-only context: the
    study, folders, plan and ledger it reads; an assignment to the context is refused."""
    import dataclasses

    seen: list[object] = []

    class Reader(_UnreadableResults):
        def execute(self, runner: Runner) -> None:
            ctx = runner.context
            seen.extend([ctx.proto.spec.id, ctx.root, ctx.host, len(ctx.runs), ctx.ledger.head()["seq"]])
            with pytest.raises(dataclasses.FrozenInstanceError):
                ctx.live = True  # type: ignore[misc]

    repo = init_study(tmp_path / "study", protocol=tiny_protocol(steps=6))
    runner = Runner(load_protocol(repo / "protocols" / "tiny.yaml"), echo=lambda _: None, executor=Reader())
    with pytest.raises(RuntimeError, match="made by run"):
        runner.context  # noqa: B018 - before run() there is none
    runner.run()
    assert seen == ["tiny", runner.root, runner.host, len(runner.runs), 0]
