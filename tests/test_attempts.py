"""Every attempt in the ledger, under faults an unlucky operator or a hostile reviewer would cause.

Each test drives the real CLI in subprocesses on a temporary git repository (a tiny protocol, one
pair): the runner paused, its worker's outcome looked for and the runner killed, ``runs/`` deleted;
file times moved; the runner alone killed with its worker running; a kill between a record and the
MANIFEST rewrite (``HARNESS_TEST_KILL_AT``, a hook used only by tests); a records folder that is a
symlink or inside a frozen entry. The full-filesystem scenario is in ``tests/fullfs_scenario.py``.

The tests that run a study are in the process tier (``-m process``); tests/test_runner_scenarios.py
drives the cut-off attempt, ``runs/`` deleted, file times moved and MANIFEST behind the chain in
process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    harness,
    harness_in_process,
    hydrated,
    init_study,
    private_copy,
    record_dicts,
    tiny_protocol,
    typed,
)

from audit.cli import NOT_VERIFIED
from harness.ledger import load_entries
from prereg.formats.record import SCHEMA_VERSION, load_started

PROTO = "protocols/tiny.yaml"
RECS = "records/tiny"


def audit(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), RECS],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


def study(base: Path, seeds: str = "[1, 2]", steps: int = 6) -> Path:
    text = tiny_protocol(steps=steps).replace("seeds: [1, 2]", f"seeds: {seeds}")
    return init_study(base / "study", protocol=text)


@pytest.fixture(scope="module")
def done_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One complete run of the tiny study (``--no-report``), made once for the module: the tests that
    start from a finished study read it or take a copy (:func:`done_copy`), never change it."""
    repo = study(tmp_path_factory.mktemp("attempts-done"))
    r = harness(repo, "run", PROTO, "--quiet", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    return repo


@pytest.fixture
def done_copy(done_study: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`done_study` for a test that changes it."""
    return private_copy(done_study, tmp_path / "study")


def start(repo: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", PROTO, "--quiet", "--no-report"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )


def wait_for(cond, timeout: float = 300.0, what: str = "condition"):
    t = time.monotonic()
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() - t > timeout:
            raise TimeoutError(what)
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def running_worker(repo: Path) -> tuple[Path, int] | None:
    """The first worker process of a run that is alive now: its work folder and pid."""
    for f in sorted((repo / "runs" / "tiny" / "work").glob("*/worker.pid")):
        try:
            pid = int(f.read_text())
        except ValueError:
            continue
        if alive(pid):
            return f.parent, pid
    return None


def kill_runner_while_its_worker_runs(repo: Path, *, pause: bool) -> tuple[str, int]:
    """Start ``harness run``; once the first worker runs, (pause the runner and let the worker end,
    then) kill the runner alone. Returns the run's id and the worker's pid."""
    p = start(repo)

    def worker() -> tuple[Path, int] | None:
        if p.poll() is not None:
            raise AssertionError(f"the runner ended first: {p.communicate()[0]}")
        return running_worker(repo)

    work, pid = wait_for(worker, what="a running worker")
    assert alive(pid), "the worker ended before the runner could be paused or killed"
    if pause:
        p.send_signal(signal.SIGSTOP)
        wait_for(lambda: not alive(pid), what="the worker to end while its runner is paused")
    p.send_signal(signal.SIGKILL)
    p.wait()
    return work.name.rsplit(".a", 1)[0], pid


@pytest.mark.process
def test_peeked_outcome_cannot_be_discarded(tmp_path):
    """Runner paused, its worker's outcome looked for, runner killed, runs/ deleted, study resumed:
    the attempt stays in the ledger and is recorded interrupted with its start time."""
    repo = study(tmp_path)
    run_id, _ = kill_runner_while_its_worker_runs(repo, pause=True)
    # the finished worker's outcome went into a pipe the dead runner held: no file anywhere holds it
    leaked = [
        f
        for f in repo.rglob("*")
        if f.is_file() and ".git" not in f.parts and b"rescore_identical" in f.read_bytes()
    ]
    assert leaked == []
    started = load_started(repo / RECS)
    assert [(e.run_id, e.attempt) for e in started] == [(run_id, 1)] and not record_dicts(repo / RECS)
    subprocess.run(["rm", "-rf", str(repo / "runs")], check=True)  # every marker and lock under runs/
    st = harness(repo, "status", PROTO)
    assert st.returncode == 0, st.stderr
    assert f"interrupted: {run_id} attempt 1 started at {started[0].started_at}" in st.stdout
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"noted interrupted attempt 1 of {run_id}" in r.stdout
    recs = {(x["spec"]["run_id"], x["attempt"]): x for x in record_dicts(repo / RECS)}
    first = recs[(run_id, 1)]
    assert first["status"] == "interrupted" and first["started_at"] == started[0].started_at
    assert first["start"] == {"seq": started[0].ledger["seq"], "sha256": started[0].sha256}
    assert recs[(run_id, 2)]["status"] == "ok"
    a = audit(repo)
    # the redraw after a possible peek is a finding of the verdict, with its own exit status
    assert a.returncode == 4, a.stdout
    assert "interrupted 1" in a.stdout and "attempts in the ledger" in a.stdout
    assert "REDRAWN:" in a.stdout and run_id in a.stdout.split("REDRAWN:", 1)[1]
    assert "Some runs were REDRAWN (see above)" in a.stdout
    md = (repo / RECS / "report.md").read_text()
    assert "1 interrupted" in md


@pytest.mark.process
def test_file_times_do_not_charge_device_seconds(tmp_path):
    """Every file time moved two hours back before the resume: the interrupted attempt is charged
    the ledger's time from its start to its record, and the budget rule is not triggered."""
    repo = study(tmp_path)
    run_id, _ = kill_runner_while_its_worker_runs(repo, pause=False)
    back = time.time() - 7200
    for f in [*(repo / "runs").rglob("*"), *(repo / "records").rglob("*")]:
        os.utime(f, (back, back), follow_symlinks=False)
    t0 = time.time()
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    bound = time.time() - t0 + 60.0
    (x,) = [x for x in record_dicts(repo / RECS) if x["status"] == "interrupted"]
    assert 0.0 <= x["timings"]["device_s"] < bound, x["timings"]
    assert x["timings"]["device_s_source"].startswith("ledger: from its started entry")
    md = (repo / RECS / "report.md").read_text()
    assert md.startswith("**complete: all 4 planned runs have an ok record.**"), md[:200]
    assert audit(repo).returncode == 4  # intact, and the interrupted run was drawn again (named)


@pytest.mark.process
def test_runner_killed_alone_leaves_no_worker_running(tmp_path):
    """kill -9 of the runner alone, then an immediate resume: its worker died with it, so the
    resumed runner never times a run beside it."""
    repo = study(tmp_path, steps=100)  # the worker still runs when its runner is killed (asserted)
    _, pid = kill_runner_while_its_worker_runs(repo, pause=False)
    wait_for(lambda: not alive(pid), timeout=10, what="the orphaned worker to die with its runner")
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ending a live worker" not in r.stdout  # nothing was left to end
    assert audit(repo).returncode == 4  # intact, and the killed run was drawn again (named)


@pytest.mark.process
def test_runner_ends_a_live_worker_of_an_earlier_runner(tmp_path):
    """A worker an earlier runner left on the device (here one that cannot die with its parent) is
    ended before the new runner times anything."""
    repo = study(tmp_path)
    work = repo / "runs" / "tiny" / "work" / "old.a1"
    work.mkdir(parents=True)
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "harness.execute.worker"]
    )
    try:
        (work / "worker.pid").write_text(str(orphan.pid))
        locks = repo / "runs" / "locks"
        locks.mkdir(parents=True)
        (locks / f"device-{socket.gethostname()}-cpu.json").write_text(
            json.dumps({"runner": 1, "work": str(work)})
        )
        r = harness(repo, "run", PROTO, "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        lines = r.stdout.splitlines()
        ended = next(i for i, x in enumerate(lines) if f"ending a live worker (pid {orphan.pid})" in x)
        assert ended < next(i for i, x in enumerate(lines) if x.strip().startswith("ok ("))
    finally:
        orphan.kill()
        orphan.wait()


@pytest.mark.process
def test_kill_between_record_and_manifest_is_repaired(tmp_path):
    """The runner killed after a record is written and before MANIFEST is rewritten: the audit fails
    until harness status (or report, or run) reconciles MANIFEST with the chain."""
    repo = study(tmp_path)
    p = start(repo, HARNESS_TEST_KILL_AT="manifest:2")  # seq 2: the first record
    p.communicate(timeout=600)
    assert p.returncode == -signal.SIGKILL
    assert len(record_dicts(repo / RECS)) == 1
    a = audit(repo)
    assert a.returncode == 1 and "record not listed in MANIFEST" in a.stdout
    st = harness(repo, "status", PROTO)
    assert st.returncode == 0 and "MANIFEST reconciled with the chain: 1 entry after seq 1" in st.stderr, (
        st.stderr
    )
    a = audit(repo)
    assert a.returncode == NOT_VERIFIED, a.stdout
    p = start(repo, HARNESS_TEST_KILL_AT="manifest:6")  # a later record, written by the resumed runner
    p.communicate(timeout=600)
    assert audit(repo).returncode == 1
    rep = harness(repo, "report", PROTO, "--quiet")
    assert rep.returncode == 0 and "MANIFEST reconciled" in rep.stderr, rep.stderr
    assert audit(repo).returncode == NOT_VERIFIED
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert audit(repo).returncode == NOT_VERIFIED
    seqs = [e["ledger"]["seq"] for e in load_entries(repo / RECS)]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.process
def test_reconcile_leaves_evidence_alone(done_copy):
    """A listed record that changed is not laundered into MANIFEST: the audit still names it."""
    repo = done_copy
    rec = sorted((repo / RECS).glob("*.record.json"))[0]
    rec.write_text(rec.read_text().replace('"status":"ok"', '"status":"failed"'))
    st = harness(repo, "status", PROTO)
    assert "MANIFEST reconciled" not in st.stderr
    a = audit(repo)
    assert a.returncode == 1 and "differs from MANIFEST" in a.stdout


@pytest.mark.parametrize("case", ["default-symlink", "parent-symlink", "frozen", "outside-by-symlink"])
def test_records_folder_paths_are_refused(tmp_path, case):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    repo = tmp_path / "study"
    repo.mkdir()
    extra = ""
    if case == "frozen":
        extra = "records_dir: harness/records\n"
    elif case == "parent-symlink":
        extra = "records_dir: results/tiny\n"
    text = tiny_protocol().replace("order_seed: 1\n", f"order_seed: 1\n{extra}")
    init_study(repo, protocol=text)
    if case in ("default-symlink", "outside-by-symlink"):
        (repo / "records").mkdir()
        (repo / "records" / "tiny").symlink_to(
            outside if case == "outside-by-symlink" else repo / "protocols"
        )
        link = repo / "records" / "tiny"
    elif case == "parent-symlink":
        (repo / "results").symlink_to(repo / "records-real", target_is_directory=True)
        (repo / "records-real").mkdir()
        link = repo / "results"
    for cmd in ("run", "status", "report"):
        # the command line's main in this process (the same parser, checks, message and exit
        # status); one case's run through the installed entry point in a fresh process
        call = harness if (cmd, case) == ("run", "outside-by-symlink") else harness_in_process
        r = call(repo, cmd, PROTO, "--quiet") if cmd != "status" else call(repo, cmd, PROTO)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and f"{PROTO}, key records_dir" in r.stderr
        if case == "frozen":
            assert "inside the frozen entry 'harness'" in r.stderr
        else:
            assert f"{link} is a symbolic link" in r.stderr
    assert not list(outside.iterdir()) and not (repo / "runs").exists()


def _tmpfs_possible() -> str | None:
    try:
        r = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d && rmdir $d",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot start unshare: {e}"
    return (
        None
        if r.returncode == 0
        else f"cannot mount a tmpfs in a private mount namespace: {r.stderr.strip()}"
    )


@pytest.mark.process
def test_full_filesystem_stops_cleanly_and_resumes(tmp_path):
    """The records folder's filesystem full (a 1 MiB tmpfs): at the first write, and at the record
    that ends an attempt. Each stops with exit 2, the file and the free space named, no traceback,
    nothing half-written; once space is freed the study resumes and audits clean."""
    why = _tmpfs_possible()
    if why:
        pytest.skip(why)
    repo = study(tmp_path)
    out = tmp_path / "fullfs.json"
    r = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            str(ROOT / "tests" / "fullfs_scenario.py"),
            str(repo),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    for step in ("full", "record"):
        got = res[step]
        assert got["rc"] == 2, got
        assert "Traceback" not in got["stderr"] and "No space left on device" in got["stderr"], got["stderr"]
        assert (
            "bytes free on its filesystem" in got["stderr"] and "run the same command again" in got["stderr"]
        )
        assert got["tmp"] == [], got["files"]
    assert ".started.json" in res["full"]["stderr"] and res["full"]["files"] == []
    # the folder's first record writes its protocol snapshot first: the full disk names that file
    assert ".record.json" in res["record"]["stderr"] or "/protocol." in res["record"]["stderr"]
    assert [n for n in res["record"]["files"] if n.endswith(".record.json")] == []
    assert any(n.endswith(".started.json") for n in res["record"]["files"])
    assert res["resumed"]["rc"] == 0, res["resumed"]
    assert "noted interrupted attempt 1" in res["resumed"]["stdout"]
    assert res["audit"]["rc"] == 4, res["audit"]["stdout"]  # intact; the run cut short was drawn again
    assert "REDRAWN:" in res["audit"]["stdout"]
    oks = [x["spec"]["run_id"] for x in res["records"] if x["status"] == "ok"]
    assert len(oks) == len(set(oks)) == 4


@pytest.mark.process
def test_one_unit_attempt_per_unit_in_analysis_and_audit(done_study):
    """A unit that ran again whole: the analysis and the audit pair both arms from its latest unit
    attempt only, count the superseded attempts, and never mix arms of two unit attempts."""
    from prereg.formats.summary import derive
    from prereg.recompute import compare, recompute

    recs = record_dicts(done_study / RECS)  # read only: the variants below live in memory
    unit = recs[0]["spec"]["unit"]
    again = []
    for r in (x for x in recs if x["spec"]["unit"] == unit):
        r2 = json.loads(json.dumps(r))
        r2.update(attempt=2, unit_attempt=2)
        r2["timings"]["training_s"] = r["timings"]["training_s"] * 0.5
        again.append(r2)

    def check(records, expect_pair: bool) -> dict:
        s = derive(typed(records)).to_json()
        mine = recompute(records)
        problems: list[str] = []
        compare("summary", mine, json.loads(json.dumps(s)), problems, "unit attempts")
        assert not problems, problems
        pairs = {p["unit"]: p for p in s["studies"][0]["configs"][0]["pairs"]}
        assert (unit in pairs) is expect_pair
        return s

    s = check(recs + again, True)
    pair = next(p for p in s["studies"][0]["configs"][0]["pairs"] if p["unit"] == unit)
    by_role = {r["spec"]["role"]: r for r in again}
    assert pair["baseline_training_s"] == by_role["baseline"]["timings"]["training_s"]
    assert pair["candidate_training_s"] == by_role["candidate"]["timings"]["training_s"]
    assert s["records"]["superseded"] == 2 and sum(r["superseded"] for r in s["runs"]) == 2
    assert sum(f["superseded_attempts"] for f in s["flow"]) == 2 and s["completeness"]["complete"]
    # the second unit attempt got only one arm done: the first attempt's other arm is not borrowed
    s = check(recs + again[:1], False)
    assert s["records"]["superseded"] == 2 and not s["completeness"]["complete"]
    assert any(e["unit"] == unit for e in s["exclusions"])


@pytest.mark.process
def test_records_written_before_started_entries_still_audit(done_copy):
    """A study whose records are schema 2 (no started entries, no unit attempts, MANIFEST without
    ``started``) audits clean, reports, shows its status and resumes into the current schema."""
    from harness.ledger import write_manifest
    from prereg.formats.record import canonical, read_snapshots, seal

    repo = done_copy
    for f in (repo / RECS).glob("*.started.json"):
        f.unlink()
    prev = record_dicts(repo / RECS)[0]["protocol"]["sha256"]  # not preregistered: the chain starts there
    for i, f in enumerate(
        sorted((repo / RECS).glob("*.record.json"), key=lambda p: json.loads(p.read_text())["ledger"]["seq"]),
        1,
    ):
        r = hydrated(json.loads(f.read_text()), read_snapshots(repo / RECS))  # schema 2: the full protocol
        for k in ("start", "unit_attempt"):
            r.pop(k)
        r.update(schema_version=2, ledger={"seq": i, "prev": prev})
        r = seal(r)
        prev = r["sha256"]
        f.write_text(canonical(r).decode() + "\n")
    for f in (repo / RECS).glob("protocol.*.json"):
        f.unlink()  # schema 2 folders have no snapshot
    recs = record_dicts(repo / RECS)
    write_manifest(repo / RECS, repo, [repo / PROTO], recs[0]["protocol"], {"seq": 4, "sha256": prev})
    m = json.loads((repo / RECS / "MANIFEST").read_text())
    m.pop("started")
    m["schema_version"] = 2
    (repo / RECS / "MANIFEST").write_text(json.dumps(m))
    assert harness(repo, "report", PROTO, "--quiet").returncode == 0
    a = audit(repo)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert "0 started entries" in a.stdout
    st = harness(repo, "status", PROTO)
    assert st.returncode == 0 and "ledger head: seq 4" in st.stdout and "MANIFEST reconciled" not in st.stderr
    last = max((repo / RECS).glob("*.record.json"), key=lambda p: json.loads(p.read_text())["ledger"]["seq"])
    last.unlink()  # its run is left to do: a resume appends current-schema entries after the old chain
    rebuilt = json.loads((repo / RECS / "MANIFEST").read_text())
    rebuilt["records"].pop(last.name)
    (repo / RECS / "MANIFEST").write_text(json.dumps(rebuilt))
    assert harness(repo, "run", PROTO, "--quiet", "--no-report").returncode == 0
    new = [x for x in record_dicts(repo / RECS) if x["schema_version"] == SCHEMA_VERSION]
    assert len(new) == 1 and new[0]["start"]["seq"] == 4 and new[0]["ledger"]["seq"] == 5
