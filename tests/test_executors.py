"""One executor interface: the in-process executor drives the same runner, ledger and records as the
local one (claims, started entries, records that link to them), and the training it runs gives the
same bits as the worker processes' (same seed, weights and batches)."""
from __future__ import annotations

import shutil

from conftest import harness, init_study, tiny_protocol

from harness.execute.inprocess import InProcessExecutor
from harness.execute.runner import Runner
from harness.protocol import load_protocol
from harness.records import load_records


def test_in_process_executor_matches_the_local_one(tmp_path):
    repo = init_study(tmp_path / "study", protocol=tiny_protocol(steps=6))
    r = harness(repo, "run", "protocols/tiny.yaml", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    local = {x["spec"]["run_id"]: x for x in load_records(repo / "records" / "tiny")}
    shutil.rmtree(repo / "records")
    shutil.rmtree(repo / "runs")
    lines: list[str] = []
    left = Runner(load_protocol(repo / "protocols" / "tiny.yaml"), echo=lines.append,
                  executor=InProcessExecutor()).run()
    assert left == 0
    mine = {x["spec"]["run_id"]: x for x in load_records(repo / "records" / "tiny")}
    assert set(mine) == set(local) and all(x["status"] == "ok" for x in mine.values())
    for rid, rec in mine.items():
        assert rec["spec"] == local[rid]["spec"] and rec["start"]["seq"] < rec["ledger"]["seq"]
        losses = [point[:2] for point in rec["curve"]]  # (step, loss); the third entry is the clock
        assert losses == [point[:2] for point in local[rid]["curve"]] and rec["test_bpb"] == local[rid]["test_bpb"], rid
    r = harness(repo, "status", "protocols/tiny.yaml")
    assert r.returncode == 0 and "Traceback" not in r.stderr
