"""The node side of the Ray executor (:mod:`harness.execute.ray`): what runs on each node, and the
``ray start`` command that offers a node's timing devices.

A unit's task (:func:`run_unit`) checks the node once per Ray worker process (its code, corpus,
torch and device against the driver's), announces each run and waits at the driver's :class:`Gate`
until its started entry is in the ledger, runs it as a fresh worker process through the protocol's
launcher and sends its outcome back through the driver's queue. A run the driver refuses at the
gate (the failure rule stopped the study after an earlier run's record) does not start, and
neither do the unit's further runs.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal, Protocol, TypedDict, Union

from harness.execute.grouping import process_job, split
from harness.execute.job import Job, JobFile, LockstepJob
from harness.execute.launchers import LAUNCHERS, Launcher, Outcome, launch, worker_env
from prereg.errors import RefusedError
from prereg.formats.record import canonical

if TYPE_CHECKING:
    from prereg.protocol.schema import CorpusFiles

RESOURCE = "harness-{device}"


class NodeInfo(TypedDict):
    """The Ray node a unit's task runs on, as its messages and a record's ``node`` name it."""

    id: str
    host: str
    pid: int


class Expect(TypedDict):
    """What every node must match (:meth:`harness.execute.ray.RayExecutor._expect`)."""

    code: dict[str, str]  # the packages' source hashes (harness.freeze.code_sha256)
    torch: str | None
    protocol: str
    corpus: str
    device: str
    launcher: str
    corpus_sha256: dict[str, str]  # by split
    threads: int | None
    phase_sha256: str | None  # the driver's verified phase.c build
    tree: dict[str, str]  # the shipped working directory's files, by path, with their sha256


#: A unit's messages to the driver: a run about to start, a run's outcome, the task's end.
Started = tuple[Literal["start"], str, int, NodeInfo]
Done = tuple[Literal["done"], str, int, NodeInfo, Outcome]
Ended = tuple[Literal["end"], str]
Message = Union[Started, Done, Ended]


class MessageQueue(Protocol):
    """The driver's queue (``ray.util.queue.Queue``), as the units and the driver use it."""

    def put(self, item: Message) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> Message: ...


class RemoteCall(Protocol):
    """An actor's method, called through Ray (``handle.method.remote(...)``)."""

    def remote(self, *args: object) -> object: ...


class GateHandle(Protocol):
    """The driver's :class:`Gate` actor, as a Ray handle."""

    @property
    def wait(self) -> RemoteCall: ...

    @property
    def open(self) -> RemoteCall: ...


def driver_tree(root: Path, excluded: list[str]) -> dict[str, str]:
    """What every node's shipped working directory must hold: each file of the study's root that
    git does not ignore (tracked, or new and not ignored: what Ray ships) under a top-level entry
    the freeze does not exempt (:func:`harness.freeze.exempt`: plug-ins, ``arms/``, ``configs/``,
    the packages), by path under ``root``, with its sha256; files Ray does not ship (``excluded``:
    :data:`harness.execute.ray.EXCLUDES` and the corpus sent apart) left out. Empty outside a git
    repository's top level (nothing to compare with there)."""
    import hashlib

    from harness import gitutil
    from harness.freeze import exempt

    repo = gitutil.toplevel(root)
    if repo is None or repo.resolve() != root.resolve():
        return {}
    listed = gitutil.git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", check=False)
    out = {}
    for rel in sorted(set(listed.stdout.split("\0"))):
        if not rel or exempt(rel.split("/", 1)[0]) or _excluded(rel, excluded):
            continue
        path = root / rel
        if path.is_file() and not path.is_symlink():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _excluded(rel: str, excluded: list[str]) -> bool:
    """Whether Ray leaves ``rel`` out of the working directory it ships (its ``excludes``)."""
    import fnmatch

    parts = rel.split("/")
    for pat in excluded:
        if pat.startswith("/"):
            if rel == pat[1:] or rel.startswith(pat[1:].rstrip("/") + "/"):
                return True
        elif pat.endswith("/"):
            if pat[:-1] in parts[:-1]:
                return True
        elif any(fnmatch.fnmatch(p, pat) for p in parts):
            return True
    return False


def shipped_problems(expect: dict[str, str], cwd: Path, label: str) -> list[str]:
    """The node's shipped working directory against the driver's (:func:`driver_tree`): each file
    missing or different, and each source file (``*.py``, ``*.c``) under a frozen entry the driver
    does not have, named; the node then runs nothing (as a local worker's sources are checked
    against the tag's before any run)."""
    import hashlib

    out = []
    for rel, sha in sorted(expect.items()):
        path = cwd / rel
        if not path.is_file() or path.is_symlink():
            out.append(f"node {label}: {rel} is missing from the shipped working directory")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            out.append(f"node {label}: {rel} differs from the driver's (its sha256 is not the frozen file's)")
    for top in sorted({rel.split("/", 1)[0] for rel in expect}):
        base = cwd / top
        extra = (
            [p for p in [*base.rglob("*.py"), *base.rglob("*.c")] if "__pycache__" not in p.parts]
            if base.is_dir()
            else []
        )
        out += [
            f"node {label}: {p.relative_to(cwd).as_posix()} is a source the driver did not ship"
            for p in sorted(extra)
            if p.relative_to(cwd).as_posix() not in expect
        ]
    return out


def node_dir() -> Path:
    return Path(os.environ.get("HARNESS_NODE_DIR", Path.home() / "cotangent-harness-node"))


#: Per Ray worker process (Ray reuses it for the next unit): the launchers started, keyed by
#: (launcher, working directory, visible CUDA devices), and the node checks already passed.
_LAUNCHERS: dict[tuple[str, str, str], Launcher] = {}
_CHECKED: dict[str, tuple[str, CorpusFiles | None]] = {}


def _check_node(
    expect: Expect, corpus: dict[str, bytes] | None, label: str, probe: Callable[[], Outcome]
) -> CorpusFiles | None:
    """Refuse (RefusedError) unless this node's code, PyTorch, device and corpus are the driver's;
    return the local corpus the workers read (the shipped splits, written here and pinned).
    ``probe`` asks a worker process for PyTorch's version and devices (:func:`harness.execute.worker.probe`)."""
    from harness.data import LocalCorpus, PinnedFile, load_corpus
    from harness.freeze import code_sha256

    problems = []
    if code_sha256() != expect["code"]:
        problems.append(f"code on node {label} hashes {code_sha256()}, the driver's {expect['code']}")
    found = probe().result
    if "torch" not in found:
        raise RefusedError(
            f"node {label}: a worker process could not start to report PyTorch and its devices"
        )
    if expect.get("torch") and found["torch"].split("+")[0] != expect["torch"]:
        problems.append(f"node {label} has PyTorch {found['torch']}, the protocol names {expect['torch']}")
    if not found["devices"].get(expect["device"], False):
        problems.append(
            f"node {label} advertises a {expect['device']} timing device but torch cannot use one"
        )
    local: CorpusFiles | None = None
    try:
        if corpus is None:  # the embedded corpus: this node's own copy must hash as the driver's
            got = load_corpus(expect["corpus"]).sha256()
            if got != expect["corpus_sha256"]:
                problems.append(
                    f"corpus on node {label} hashes {got}, the driver's {expect['corpus_sha256']}"
                )
        else:  # shipped through the object store: written here, pinned to the driver's hashes, verified
            where = node_dir() / "data" / expect["corpus"]
            where.mkdir(parents=True, exist_ok=True)
            files = {}
            for split, blob in corpus.items():
                path = where / f"{expect['corpus_sha256'][split]}.{split}"
                if not path.is_file():
                    tmp = path.with_suffix(".tmp")
                    tmp.write_bytes(blob)
                    tmp.replace(path)
                files[split] = PinnedFile(str(path), len(blob), expect["corpus_sha256"][split])
            shipped = LocalCorpus(expect["corpus"], files)
            shipped.load()  # every split verifies against the driver's sha256, or DataError
            local = shipped.as_dict()
    except Exception as e:  # noqa: BLE001 - any failure to produce the verified corpus refuses the node
        problems.append(f"corpus on node {label}: {e}")
    if problems:
        raise RefusedError("; ".join(problems))
    return local


class Gate:
    """Opens each run for its node once the driver has written its started entry, or refuses it
    (the failure rule stopped the study: the run does not start; an async actor)."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}
        self.verdicts: dict[str, bool] = {}

    def _event(self, key: str) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())

    async def wait(self, key: str) -> bool:
        """Whether the run may start, once the driver has said so."""
        await self._event(key).wait()
        return self.verdicts.get(key, True)

    async def open(self, key: str, go: bool = True) -> None:
        self.verdicts[key] = go
        self._event(key).set()


def _test_hold(point: str) -> None:
    """Tests only (see the module's notes): stop here for good when the hold file names ``point``."""
    path = os.environ.get("HARNESS_TEST_HOLD")
    if not path or not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        if f.read().strip() != point:
            return
    os.unlink(path)
    with open(path + ".held", "w", encoding="utf-8") as f:
        f.write(point)
    while True:
        time.sleep(3600)


def run_unit(
    jobs: list[JobFile],
    expect: Expect,
    corpus: dict[str, bytes] | None,
    queue: MessageQueue,
    gate: GateHandle | None = None,
) -> str:
    """The Ray task: check this node, then run the unit's jobs one after another, each as a fresh
    worker process, reporting ``("start", ...)`` (and waiting at ``gate`` until the driver has
    appended the started entry) and ``("done", ...)`` on ``queue``."""
    import ray

    ctx = ray.get_runtime_context()
    node: NodeInfo = {"id": ctx.get_node_id(), "host": socket.gethostname(), "pid": os.getpid()}
    label = f"{node['host']}/{node['id'][:8]}"
    base = node_dir() / expect["protocol"]
    cwd = Path.cwd()
    launcher = _launcher(expect["launcher"], cwd)
    env = node_env(expect, cwd, label)
    local = _checked_corpus(expect, corpus, label, launcher, base / "work" / f"probe-{os.getpid()}", cwd, env)
    for k, shipped in enumerate(jobs, 1):  # one worker process each: a run, or a lockstep pair
        each = _node_jobs(shipped, base, local)
        for job in each:
            queue.put(("start", job.spec.run_id, job.attempt, node))
        if not _admitted(ray, gate, each):
            break  # the failure rule stopped the study: the unit's further runs do not start
        first = each[0]
        work = f"{first.spec.run_id if len(each) == 1 else first.spec.unit}.a{first.attempt}"
        outcome = launch(
            launcher,
            process_job(each),
            base / "work" / work,
            cwd,
            env,
            partial(_test_hold, f"during:{k}"),
        )
        group = [job.spec for job in each]
        for job, out in zip(each, split(outcome, group)):
            queue.put(("done", job.spec.run_id, job.attempt, node, out))
        _test_hold(f"between:{k}")
    queue.put(("end", label))  # the driver stops waiting on messages and collects this task at once
    return label


def node_env(expect: Expect, cwd: Path, label: str) -> dict[str, str]:
    """The workers' environment on this node, for each unit: refused (RefusedError) unless the
    shipped working directory is the driver's (:func:`shipped_problems`); its frozen entries'
    sources are among those a worker verifies each import against (``HARNESS_SOURCES``), as a
    local worker's are."""
    from harness.freeze import EXEMPT
    from harness.packages import package_dirs

    tree = expect.get("tree") or {}
    problems = shipped_problems(tree, cwd, label)
    if problems:
        raise RefusedError(
            "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        )
    return worker_env(
        sorted({str(p.parent) for p in package_dirs()}),  # where Ray unpacked each package
        threads=expect.get("threads"),
        frozen=[str(cwd / top) for top in sorted({rel.split("/", 1)[0] for rel in tree})],
        exempt=sorted(EXEMPT),
        phase_sha256=expect.get("phase_sha256"),  # the driver's verified phase.c build, if this is it
    )


def _admitted(ray: ModuleType, gate: GateHandle | None, each: list[Job]) -> bool:
    """Wait at the driver's gate until it has appended each run's started entry (True) or refused
    the runs, writing nothing (False: the failure rule, :mod:`prereg.failstop`, stopped the study)."""
    if gate is None:
        return True
    verdicts = [ray.get(gate.wait.remote(f"{job.spec.run_id}.a{job.attempt}"), timeout=600) for job in each]
    return all(verdicts)


def _launcher(name: str, cwd: Path) -> Launcher:
    """This Ray worker process's launcher of that name, started once per working directory and
    visible CUDA devices."""
    lkey = (name, str(cwd), os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if lkey not in _LAUNCHERS:
        _LAUNCHERS[lkey] = LAUNCHERS[name]()
    return _LAUNCHERS[lkey]


def _checked_corpus(
    expect: Expect,
    corpus: dict[str, bytes] | None,
    label: str,
    launcher: Launcher,
    probe_dir: Path,
    cwd: Path,
    env: dict[str, str],
) -> CorpusFiles | None:
    """Check this node once per Ray worker process (:func:`_check_node`; RefusedError, also for a
    node that cannot be checked); return the local corpus the workers read."""
    key = canonical(expect).decode()
    if key not in _CHECKED:
        try:
            _CHECKED[key] = (
                label,
                _check_node(
                    expect,
                    corpus,
                    label,
                    lambda: launch(launcher, {"probe": True}, probe_dir, cwd, env, lambda: None),
                ),
            )
        except RefusedError:
            raise
        except Exception as e:  # a node that cannot even be checked refuses (it would fail every unit)
            raise RefusedError(f"node {label} could not be checked: {type(e).__name__}: {e}") from e
    return _CHECKED[key][1]


def _node_jobs(shipped: JobFile, base: Path, local: CorpusFiles | None) -> list[Job]:
    """A shipped job (a run, or a lockstep pair's two) with this node's checkpoint path and corpus."""
    return [
        replace(
            job,
            checkpoint_path=str(base / "checkpoints" / Path(job.checkpoint_path).name),
            corpus=local if local is not None else job.corpus,
        )
        for job in (
            LockstepJob.from_json(shipped).jobs if "lockstep" in shipped else [Job.from_json(shipped)]
        )
    ]


def node_command(
    device: str, address: str | None, port: int = 6379, devices: int | None = None, block: bool = True
) -> list[str]:
    """The ``ray start`` command line for a node that offers its timing devices to the harness."""
    count = devices
    if count is None:
        if device == "cuda":
            import torch

            count = torch.cuda.device_count()
        else:
            count = 1
    resources = f'{{"{RESOURCE.format(device=device)}": {count}}}'
    cmd = ["ray", "start", f"--resources={resources}", "--disable-usage-stats"]
    cmd += [f"--address={address}"] if address else ["--head", f"--port={port}", "--include-dashboard=false"]
    if device == "cuda":
        cmd.append(f"--num-gpus={count}")
    return cmd + (["--block"] if block else [])
