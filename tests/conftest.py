"""Shared fixtures: temporary git repositories holding configs and protocols, and the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

#: Generated tests run fixed (derandomized) examples by default, so a CI run is reproducible and a
#: green commit stays green; ``HYPOTHESIS_PROFILE=random`` draws new ones, and the ``thorough``
#: tests (``-m thorough``) always do.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("random", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))

#: ``ATEN_CPU_CAPABILITY=avx2 python -m pytest`` on an AVX-512 machine runs the in-process tests (the
#: method, its kernels, the models) at the instruction set it names, fixed here before any kernel
#: runs; the variable then leaves the environment the tests' subprocesses inherit, because
#: ``harness run`` refuses it by design (a protocol, not the environment, says the code path) and
#: the tests that start the CLI check the harness, not the dispatch (test_kernel sets it per process).
CPU_CAPABILITY = os.environ.get("ATEN_CPU_CAPABILITY")
if CPU_CAPABILITY is not None:
    import torch

    torch.backends.cpu.get_cpu_capability()  # computed once per process, from the variable
    del os.environ["ATEN_CPU_CAPABILITY"]


#: PackedAdamW's mode where a test leaves it unset: packed, so that a test's path is the same every run
#: (``mode="auto"`` times the first iterations and may then step natively: the same bits, another path).
#: tests/test_modes.py covers "auto" and "native" by naming them; subprocesses inherit this too.
os.environ.setdefault("COTANGENT_MODE", "packed")


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread() -> None:
    """The in-process tests run torch with one intra-op thread, as every run of a study does (its
    protocol's ``threads``, which the worker sets): two test processes on two cores, one thread each,
    instead of each starting a thread per core for tensors of a few kilobytes, which on a busy
    machine wait on each other (test_kernel's ``native_phase_bitwise_three_calls``: 36 s with the
    default two threads, 4.9 s with one, on the 2-core Xeon beside other work). The subprocesses
    the tests start are not touched: their environment is the test's."""
    import torch

    torch.set_num_threads(1)


def pytest_report_header() -> str | None:
    if CPU_CAPABILITY is None:
        return None
    import torch

    return f"in-process tests at ATEN_CPU_CAPABILITY={CPU_CAPABILITY} (torch: {torch.backends.cpu.get_cpu_capability()})"


#: The modules that take longest (their set-up is a whole study, or a Ray cluster), collected first,
#: largest first, so that the two test processes (``-n 2 --dist loadscope`` in pyproject.toml)
#: finish together: the process tier's first, then the fast tier's (its order from module sums at
#: -n 0 on one core: test_integrity, test_errors, test_analysis, test_kernel about 95-155 s there
#: beside other work, test_decision_numerics 45 s).
SLOWEST_FIRST = (
    "test_ray.py",
    "test_demo_e2e.py",
    "test_attempts.py",
    "test_protocol_cli.py",
    "test_run_endings.py",
    "test_provenance.py",
    "test_integrity.py",
    "test_errors.py",
    "test_analysis.py",
    "test_kernel.py",
    "test_compare_cmd.py",
    "test_calibrated_report.py",
    "test_cotangent.py",
    "test_plugins.py",
    "test_decision_numerics.py",
)

#: The process tier (``python -m pytest -q -m process``, CI's second command): the scenarios that
#: need real processes (harness runs whose workers train models, kills and signals, Ray, the
#: browser, torch.compile, the benchmark scripts). The default command deselects it (pyproject's
#: addopts) and runs the fast tier, where tests/fake_trainer.py drives the runner's state machine
#: in process. Every ``long`` scenario is in the process tier.
PROCESS = "process"


@pytest.hookimpl(tryfirst=True)  # before pytest's -m selection reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("long") is not None and item.get_closest_marker(PROCESS) is None:
            item.add_marker(PROCESS)
    order = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: file order otherwise


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Say, after the default command, that the process tier did not run and how to run it."""
    if "not process" in (config.option.markexpr or ""):
        terminalreporter.write_line(
            "fast tier only: the process tier (real processes, Ray, the browser) did not run; "
            "python -m pytest -q -m process runs it (CI runs both)"
        )


#: The ``long`` scenarios run at a reduced size by default (the README's test command, CI);
#: ``HARNESS_TEST_FULL_SIZE=1 python -m pytest -m long`` runs them at their full size.
FULL_SIZE = os.environ.get("HARNESS_TEST_FULL_SIZE") == "1"


def benchmark_module(name: str) -> object:
    """``benchmarks/<name>.py`` imported as a module (its folder on the path while it loads, as
    when it runs as a script)."""
    import importlib.util

    folder = ROOT / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"benchmark_{name}", folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(folder))
    return mod


def tiny_protocol(**kw) -> str:
    """The tiny study's protocol (:func:`harness.tiny.tiny_protocol`, the one builder the Ray
    benchmark shares)."""
    from harness.tiny import tiny_protocol as build

    return build(**kw)


def design_doc(design: str, seeds: int = 4) -> dict:
    """A protocol's data (before :func:`prereg.protocol.read.protocol_from_data` types it) with one
    study of ``design``: one configuration ``c``, arms ``native`` and ``cotangent``, ``seeds`` seeds
    from 1, four steps, and a lockstep study's ``block_steps`` 2 (the design tests' one fixture)."""
    return {
        "id": "d",
        "budget_device_seconds": 60,
        "studies": [
            {
                "name": "s",
                "design": design,
                "arms": ["native", "cotangent"],
                "configs": ["c"],
                "seeds": {"base": 1, "count": seeds},
                "steps": 4,
                "val_every": 2,
                "val_target_bpb": 7.9,
                **({"block_steps": 2} if design == "lockstep" else {}),
            }
        ],
    }


def failing_arm(repo: Path, **kw) -> str:
    """A tiny protocol (``kw`` as :func:`tiny_protocol`'s) whose candidate is a plug-in arm that
    raises when the worker builds it, before its first training step; under ``order_seed: 1`` the
    first pair runs its candidate first."""
    (repo / "boom.py").write_text(
        "def build(ctx):\n    raise RuntimeError('deliberate failure of this arm')\n"
    )
    return tiny_protocol(**kw).replace("arms: [native, cotangent]", 'arms: [native, "boom:build"]')


def pinned_corpus(repo: Path, rel: str = "corpus/topics.txt", size: int | None = None) -> str:
    """Write a local corpus file into ``repo`` (the embedded corpus's bytes, in one file; its first
    ``size`` bytes where given) and return the protocol's ``corpus`` value pinning it, as one flow
    mapping."""
    import hashlib

    from harness.data import load_corpus

    c = load_corpus("pydoc-topics")
    data = (c.train + c.valid + c.test)[:size]
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_bytes(data)
    return (
        f"{{name: topics, file: {{path: {rel}, size: {len(data)}, sha256: {hashlib.sha256(data).hexdigest()}}}, "
        "split: {train: 0.9, valid: 0.05, test: 0.05}}"
    )


def record_dicts(folder: Path) -> list[dict]:
    """A records folder's record files as the JSON objects the analysis reads, in ledger order: what
    was written, a schema 4 record's ``protocol`` stub read over the folder's snapshot
    (:func:`prereg.formats.record.load_records` reads the same files as typed records)."""
    from prereg.formats.record import read_entry, read_snapshots, record_files

    snapshots = read_snapshots(folder)
    out = [hydrated(read_entry(p), snapshots) for p in record_files(folder)]
    out.sort(key=lambda r: (r.get("ledger", {}).get("seq", 0), r["spec"]["run_id"], r["attempt"]))
    return out


def hydrated(record: dict, snapshots: dict) -> dict:
    """A record's JSON with a schema 4 ``protocol`` stub read over the snapshot it names (``snapshots``:
    :func:`prereg.formats.record.read_snapshots`); other records unchanged."""
    import copy

    from prereg.formats.ledger import with_snapshot

    if record.get("schema_version", 1) < 4 or "snapshot_sha256" not in (record.get("protocol") or {}):
        return record
    full = with_snapshot(record["protocol"], snapshots)
    assert full is not None, "the folder holds no protocol snapshot the record names"
    return {**record, "protocol": copy.deepcopy(full)}  # each its own: a test may edit one record's


def typed(records: list[dict]) -> list:
    """Record JSON objects (as :func:`record_dicts` gives them, or edited by a test) as the analysis
    reads them: a schema 4 record's full ``protocol`` split into its stub and its snapshot again."""
    from prereg.formats.ledger import protocol_stub, snapshot_of
    from prereg.formats.record import RunRecord

    out = []
    for r in records:
        if r.get("schema_version", 1) >= 4 and "snapshot_sha256" not in r["protocol"]:
            out.append(
                RunRecord.from_json(
                    {**r, "protocol": protocol_stub(r["protocol"])},
                    "record",
                    {protocol_stub(r["protocol"])["snapshot_sha256"]: snapshot_of(r["protocol"])},
                )
            )
        else:
            out.append(RunRecord.from_json(r))
    return out


def edit_record(path: Path, edit) -> dict:
    """A consistent forgery of one record file: ``edit`` applied to the record as the analysis reads it
    (a schema 4 record's protocol over the folder's snapshot), a snapshot of its own written where the
    edit changed the protocol, the record resealed (its ``ledger`` as the edit leaves it). Returns the sealed JSON."""
    import json

    from prereg.formats.ledger import protocol_stub, snapshot_of
    from prereg.formats.record import canonical, read_snapshots, seal, write_snapshot

    rec = hydrated(json.loads(path.read_text()), read_snapshots(path.parent))
    edit(rec)
    if (
        rec.get("schema_version", 1) >= 4
        and rec.get("kind") != "started"
        and isinstance(rec.get("protocol"), dict)
    ):
        write_snapshot(path.parent, snapshot_of(rec["protocol"]))  # the forger's own snapshot
        rec["protocol"] = protocol_stub(rec["protocol"])
    rec = seal(rec)
    path.write_text(canonical(rec).decode() + "\n")
    return rec


def synthetic_record(spec: dict, **fields) -> object:
    """A record for the analysis with only the fields a test sets (the rest made up, never read)."""
    from prereg.formats.record import SCHEMA_VERSION, RunRecord, RunSpec

    full = {
        "run_id": f"{spec.get('study', 'p')}.{spec.get('unit', 'u')}.{spec.get('role', 'r')}",
        "protocol_id": "synthetic",
        "protocol_sha256": "0" * 64,
        "study": "p",
        "design": "paired",
        "config": "c",
        "config_sha256": "0" * 64,
        "arm": "native",
        "role": "baseline",
        "seed": 0,
        "unit": "u",
        "position": 0,
        "order": 0,
        "steps": 1,
        "val_every": 1,
        "val_target_bpb": 1.0,
        "corpus": "synthetic",
        "data_dir": None,
        "device": "cpu",
        "compile": False,
        "threads": 1,
        **spec,
    }
    return RunRecord(
        **{
            "schema_version": SCHEMA_VERSION,
            "protocol": {},
            "plan_sha256": "0" * 64,
            "attempt": 1,
            "git": {"commit": None, "dirty": None},
            "status": "ok",
            **fields,
            "spec": RunSpec(**full),
        }
    )


def completeness(d: dict) -> object:
    """A completeness (prereg.results.Completeness) from the few fields a decision reads, as the
    audit's own decide takes them."""
    from prereg.results import Completeness

    return Completeness(
        planned_runs=d.get("planned_runs"),
        ok_runs=0,
        missing_runs=d.get("missing_runs"),
        complete=d.get("complete"),
        budget_stop=d.get("budget_stop"),
        text="",
    )


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def init_study(r: Path, copy: tuple[str, ...] = ("configs",), protocol: str | None = None) -> Path:
    """A git repository at ``r`` holding copies of the project's ``copy`` folders, a protocols/ folder
    (with ``protocols/tiny.yaml`` when ``protocol`` is given), everything committed."""
    (r / "protocols").mkdir(parents=True, exist_ok=True)
    for sub in copy:
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    if protocol is not None:
        (r / "protocols" / "tiny.yaml").write_text(protocol)
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "init")
    return r


def private_copy(study: Path, dst: Path) -> Path:
    """A copy of a finished ``study`` at ``dst`` (links kept) for a test that changes it."""
    shutil.copytree(study, dst, symlinks=True)
    return dst


def harness_in_process(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``harness ARGS`` in ``repo`` as :func:`harness` runs it, but through the command line's own
    ``main`` in this process: the same parser, protocol and tag checks, error messages and exit
    status, without a fresh interpreter (and, for ``run``, a torch import per run). ``harness run``'s
    ``local`` executor stands in as :class:`~harness.execute.inprocess.InProcessExecutor` with the
    real trainer: the models trained and the records written, sealed and reported as the command
    does; the launchers themselves are the process tier's (``-m process``). Returns what the
    command would: its exit status and its standard output and error."""
    import contextlib
    import io
    import signal

    from harness.cli import main
    from harness.execute import registry
    from harness.execute.inprocess import InProcessExecutor

    out, err = io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)  # harness run sets its own
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.EXECUTORS, "local", lambda address: InProcessExecutor())
        mp.chdir(repo)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        except SystemExit as e:  # the parser's usage errors, as the command exits with them
            code = e.code if isinstance(e.code, int) else 1
        finally:
            signal.signal(signal.SIGTERM, handler)
    return subprocess.CompletedProcess(["harness", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def tagged_done_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny preregistered study (``test_integrity.make_study``: the harness and analysis copied in,
    tagged) run to the end once for the session, through ``harness run``'s own code in this process
    (:func:`harness_in_process`; test_integrity's process-tier twin runs it under its launcher and audits
    it). ``test_integrity``, ``test_provenance`` and others read it or work on copies of it; no test
    changes it."""
    from test_integrity import PROTO, make_study

    r = make_study(tmp_path_factory.mktemp("tagged-done"))
    run = harness_in_process(r, "run", PROTO, "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines().count("  ok") == 6  # each run's status (the local executor's
    # "ledger head" after each unit: test_integrity's twin under the launcher)
    return r


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with the project's configs and a protocols/ folder."""
    return init_study(tmp_path / "study")


def harness(
    repo: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None, **kw
) -> subprocess.CompletedProcess[str]:
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )
