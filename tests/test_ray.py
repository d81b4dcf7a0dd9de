"""A protocol on a two-node Ray cluster on localhost: placement, bitwise results, node and driver faults.

The cluster runs in private network and PID namespaces (tests/ray_scenarios.py), so Ray listens on
127.0.0.1 only and every process it starts ends with the scenario script: the test stops only what
it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, failing_arm, harness, init_study, pinned_corpus, record_dicts, tiny_protocol

from audit.cli import NOT_VERIFIED
from harness.plan import make_plan
from harness.protocol import load_protocol

pytestmark = pytest.mark.process  # a Ray cluster and real workers: the process tier

pytest.importorskip("ray", reason="Ray is an optional extra: python -m pip install -e '.[ray]'")

SEEDS = "[1, 2]"  # two units: one on each node at once (each node advertises one harness-cpu)
PAIRS = len(SEEDS.split(","))
#: the node-kill scenarios: where in its first unit the second node is killed, and how many
#: attempts of the unit's first unit attempt are then superseded by the one that completes it
KILLS = {"node-during1": 1, "node-between": 1, "node-during2": 2}


def study(base: Path, name: str) -> Path:
    """The tiny protocol on a local corpus (shipped to the nodes through the object store), each node
    keeping one fork server for its units; ``lockstep``: the same pairs in lockstep; ``failing``:
    a candidate that fails at start-up (:func:`conftest.failing_arm`), its first pair candidate first."""
    (base / name).mkdir()
    if name.startswith("failing"):  # the plug-in and the protocol uncommitted, as a user tries a change
        init_study(base / name)
        (base / name / "protocols" / "tiny.yaml").write_text(failing_arm(base / name, steps=6))
        return base / name
    corpus = pinned_corpus(base / name)
    text = tiny_protocol(steps=6, corpus=corpus).replace("seeds: [1, 2]", f"seeds: {SEEDS}")
    if name == "lockstep":
        text = text.replace("design: paired", "design: lockstep\n    block_steps: 2")
    return init_study(base / name, protocol=text)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("ray")
    for name in ("full", "lockstep", "driver", *KILLS, "local", "failing", "failing-local"):
        study(work, name)
    local = harness(work / "local", "run", "protocols/tiny.yaml", "--quiet", "--no-report")
    assert local.returncode == 0, local.stdout + local.stderr
    failing = harness(work / "failing-local", "run", "protocols/tiny.yaml", "--quiet", "--no-report")
    r = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            str(ROOT / "tests" / "ray_scenarios.py"),
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = json.loads((work / "scenarios.json").read_text())
    return work, {
        **out,
        "failing_local_rc": failing.returncode,
        "failing_local_log": failing.stdout + failing.stderr,
    }


def analysed(recs: list[dict]) -> list[dict]:
    """The records of each unit's latest unit attempt (the one the analysis uses)."""
    latest: dict[str, int] = {}
    for x in recs:
        latest[x["spec"]["unit"]] = max(latest.get(x["spec"]["unit"], 1), x.get("unit_attempt", 1))
    return [x for x in recs if x.get("unit_attempt", 1) == latest[x["spec"]["unit"]]]


def ok_by_run(repo: Path) -> dict[str, dict]:
    """Every planned run, once: one ok record in its unit's analysed unit attempt."""
    recs = analysed(record_dicts(repo / "records" / "tiny"))
    oks = Counter(x["spec"]["run_id"] for x in recs if x["status"] == "ok")
    assert len(oks) == 2 * PAIRS and set(oks.values()) == {1}, oks  # every planned run, once
    return {x["spec"]["run_id"]: x for x in recs if x["status"] == "ok"}


def test_every_run_once_on_both_nodes_and_bitwise_as_local(scenarios):
    work, out = scenarios
    assert out["head"] == 0 and out["second"] == 0 and out["full_rc"] == 0, out["full_log"]
    ray_runs, local_runs = ok_by_run(work / "full"), ok_by_run(work / "local")
    nodes = {x["node"]["id"] for x in ray_runs.values()}
    assert len(nodes) == 2  # both nodes executed units
    for rid, x in ray_runs.items():
        y = local_runs[rid]
        assert [c[1] for c in x["curve"]] == [c[1] for c in y["curve"]]  # per-step losses, bit for bit
        assert x["test_bpb"] == y["test_bpb"] and x["val_bpb"] == y["val_bpb"]
        assert (
            x["checkpoint"]["sha256"] and str(work / "node-") in x["checkpoint"]["path"]
        )  # stays on the node
        assert x["timings"]["device_s_source"] == "worker"
        assert x["env"]["device_name"] and x["env"]["device_name"] != "x86_64"
        assert x["env"]["corpus_sha256"] == y["env"]["corpus_sha256"] and x["spec"]["corpus"] == "topics"
    shipped = [f for n in ("head", "second") for f in (work / f"node-{n}" / "data" / "topics").glob("*")]
    assert {f.suffix for f in shipped} == {
        ".train",
        ".valid",
        ".test",
    }  # the verified splits, written on the nodes
    units: dict[str, set[str]] = {}
    for x in ray_runs.values():
        units.setdefault(x["spec"]["unit"], set()).add(x["node"]["id"])
    assert all(len(v) == 1 for v in units.values())  # a pair never spans two devices
    assert f"ledger head: seq {4 * PAIRS}" in out["full_log"]  # a started entry and a record per run
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), "records/tiny"],
        cwd=work / "full",
        capture_output=True,
        text=True,
    )
    rep = harness(work / "full", "report", "protocols/tiny.yaml", "--quiet")
    assert rep.returncode == 0 and a.returncode == NOT_VERIFIED, a.stdout


def test_lockstep_pairs_run_one_pair_per_node_bitwise_as_local(scenarios):
    work, out = scenarios
    assert out["lockstep_rc"] == 0, out["lockstep_log"]
    ray_runs, local_runs = ok_by_run(work / "lockstep"), ok_by_run(work / "local")
    assert len({x["node"]["id"] for x in ray_runs.values()}) == 2  # both nodes ran pairs
    units: dict[str, set[str]] = {}
    for rid, x in ray_runs.items():
        y = local_runs[rid]  # the same run alone, in a process of its own on this machine
        assert [c[1] for c in x["curve"]] == [c[1] for c in y["curve"]]
        assert x["test_bpb"] == y["test_bpb"] and x["val_bpb"] == y["val_bpb"]
        assert x["env"]["lockstep"]["partner"] == x["spec"]["partner"]
        assert "half of its lockstep pair's process" in x["timings"]["device_s_source"]
        units.setdefault(x["spec"]["unit"], set()).add(x["node"]["id"])
    assert all(len(v) == 1 for v in units.values())  # a pair's two arms on one node, in one process
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), "records/tiny"],
        cwd=work / "lockstep",
        capture_output=True,
        text=True,
    )
    assert a.returncode == NOT_VERIFIED, a.stdout


def test_driver_killed_and_restarted_completes(scenarios):
    work, out = scenarios
    assert out["driver_records_at_kill"] >= 1 and out["driver_rc"] == 0, out["driver_log"]
    ok_by_run(work / "driver")
    recs = record_dicts(work / "driver" / "records" / "tiny")
    interrupted = [x for x in recs if x["status"] == "interrupted"]
    assert all("did not finish" in x["reason"] for x in interrupted)


@pytest.mark.parametrize("name", sorted(KILLS))
def test_node_killed_at_a_fixed_point_reruns_its_unit_whole(scenarios, name):
    """The second node killed while its first unit's first run trains, between its runs, or while
    its second run trains: the unit runs again whole as a new unit attempt; the earlier attempt's
    runs stay, superseded; analysis and audit use one unit attempt per unit; every planned run once."""
    work, out = scenarios
    assert out[f"{name}_held"], out[f"{name}_log"]  # the kill landed at its point
    assert out[f"{name}_rc"] == 0 and out[f"{name}_restart"] == 0, out[f"{name}_log"]
    repo = work / name
    runs = ok_by_run(repo)
    recs = record_dicts(repo / "records" / "tiny")
    rerun = {x["spec"]["unit"] for x in recs if x.get("unit_attempt", 1) > 1}
    assert len(rerun) == 1, rerun
    (unit,) = rerun
    superseded = [x for x in recs if x["spec"]["unit"] == unit and x.get("unit_attempt", 1) == 1]
    assert len(superseded) == KILLS[name], [(x["spec"]["run_id"], x["status"]) for x in superseded]
    interrupted = [x for x in recs if x["status"] == "interrupted"]
    if name == "node-between":  # the first run ended ok before the kill; the second never started
        assert not interrupted and [x["status"] for x in superseded] == ["ok"]
    else:
        assert len(interrupted) == 1 and interrupted[0] in superseded
        assert "/" in interrupted[0]["reason"]  # the node is named (host/node id)
        assert interrupted[0]["timings"]["device_s_source"].startswith("ledger:")
    assert "runs again, whole" in out[f"{name}_log"]
    units: dict[str, set[str]] = {}
    for x in runs.values():
        units.setdefault(x["spec"]["unit"], set()).add(x["node"]["id"])
    assert all(len(v) == 1 for v in units.values())  # both arms from one unit attempt on one node
    rep = harness(repo, "report", "protocols/tiny.yaml", "--quiet")
    assert rep.returncode == 0, rep.stderr
    summary = json.loads((repo / "records" / "tiny" / "summary.json").read_text())
    assert summary["records"]["superseded"] == KILLS[name] and summary["completeness"]["complete"]
    assert summary["studies"][0]["configs"][0]["pairs_used"] == PAIRS
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), "records/tiny"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert a.returncode == 4, a.stdout  # intact; the unit drawn again is named in the verdict
    assert "REDRAWN:" in a.stdout and unit in a.stdout.split("REDRAWN:", 1)[1]
    assert (
        f"unit {unit} ran again whole: analysed from its unit attempt 2; {KILLS[name]} superseded" in a.stdout
    )


def entries_of(repo: Path) -> tuple[list[str], list[tuple[str, int, str, bool]]]:
    """A study's started entries (file names) and records (run id, attempt, status, whether it
    trained), in ledger order."""
    folder = repo / "records" / "tiny"
    started = sorted(p.name for p in folder.glob("*.started.json"))
    recs = [
        (x["spec"]["run_id"], x["attempt"], x["status"], bool(x.get("curve"))) for x in record_dicts(folder)
    ]
    return started, recs


def test_the_failure_rule_stops_a_pair_after_its_first_run_as_locally(scenarios):
    """The first pair's candidate fails before its first training step (a plug-in arm that raises):
    under Ray, as under the local executor, the pair's baseline never starts (no started entry, no
    record), no further unit starts, the failure rule's line is printed, the exit status is the
    local one, and both leave the same started entries and records; the summary's completeness
    (what --retry-failed and a resume read) says the same stop."""
    work, out = scenarios
    ray_log, local_log = out["failing_log"], out["failing_local_log"]
    assert out["failing_rc"] == out["failing_local_rc"] == 1, ray_log + local_log
    for log in (ray_log, local_log):
        assert "failure rule: every run of an arm so far failed before its first training step" in log, log
        assert "deliberate failure of this arm" in log, log
    plan = make_plan(load_protocol(work / "failing" / "protocols" / "tiny.yaml"))
    first, second = plan[0], plan[1]
    assert first.unit == second.unit and (first.role, second.role) == ("candidate", "baseline")
    started, recs = entries_of(work / "failing")
    assert recs == [(first.run_id, 1, "failed", False)], recs
    assert not any(name.startswith(f"{second.run_id}.") for name in started), started  # never started
    assert (started, recs) == entries_of(work / "failing-local")
    reasons = [x["reason"] for x in record_dicts(work / "failing" / "records" / "tiny")]
    assert "deliberate failure of this arm" in reasons[0], reasons
    texts = []
    for name in ("failing", "failing-local"):
        harness(work / name, "report", "protocols/tiny.yaml", "--quiet")
        summary = json.loads((work / name / "records" / "tiny" / "summary.json").read_text())
        texts.append(summary["completeness"]["text"])
    assert texts[0] == texts[1] and texts[0].startswith("STOPPED BY THE FAILURE RULE: 4 of 4"), texts
