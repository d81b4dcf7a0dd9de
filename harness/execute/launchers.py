"""How one run starts on its machine: a fresh process per run.

* ``spawn``: ``python -m harness.execute.worker JOB fd:N`` (through :data:`BOOT`), a new interpreter per run;
* ``forkserver``: ``python -m harness.execute.worker --serve`` imports everything once and forks a fresh
  child per run (Linux), so each run still starts from a pristine process without paying the
  interpreter's and torch's start-up.

Both return an :class:`Outcome`: the worker's exit code, its result (``timings.device_s`` is the
worker's own measure of its time; when the process died before it could say, the launcher's wall
time stands in and ``device_s_source`` says so) and the tail of its log. The result comes back
through a pipe the worker inherits (``fd:N`` in place of a result file), never through a file, so
no other process can read an outcome before the runner has sealed it into the ledger.

Workers run hermetically: ``python -I`` (no ``PYTHONPATH``, no user site; the study's root only at
the end of the path, for plug-ins, so it shadows no installed package; site-packages stay, so torch
and numpy come from the installation), an allow-listed
environment (:func:`worker_env`; what changes a code path comes from the protocol), and a
bootstrap (:data:`BOOT`) that puts the verified harness first on the path, compiles every module of
the harness, the analysis and the study's frozen entries from its source (never from a bytecode
cache, stale or planted), and refuses to import anything from an entry the freeze exempts.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.packages import package_dirs
from prereg.files import atomic_write
from prereg.formats.ledger import PACKAGES
from prereg.formats.record import canonical


@dataclass
class Outcome:
    code: int
    result: dict[str, Any]
    wall_s: float
    started_at: float  # time.time() at launch
    finished_at: float = 0.0  # time.time() when the worker process ended
    log_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    share: int = 1  # the runs its process ran (2: a lockstep pair's arm; wall_s is then its share)

    def status_reason(self) -> tuple[str, str | None]:
        if self.code == 0 and self.result.get("status") == "ok":
            return "ok", None
        if self.code < 0:
            return "failed", f"worker killed by signal {signal.Signals(-self.code).name}"
        return "failed", self.result.get("reason") or f"worker exited with code {self.code}"

    def device_s(self) -> tuple[float, str]:
        timings = self.result.get("timings") or {}
        own = timings.get("device_s")
        if own is None:
            if self.share > 1:
                return self.wall_s, "launcher wall time (worker died), half of its lockstep pair's process"
            return self.wall_s, "launcher wall time (worker died)"
        if "pair_device_s" in timings:
            return float(own), "worker: half of its lockstep pair's process (pair_device_s)"
        return float(own), "worker"


class Launcher(Protocol):
    name: str

    def start(self, cwd: Path, env: dict[str, str] | None) -> None:
        """Get ready to run (a fork server imports everything), outside any run's time."""

    def run(
        self, job: Path, log: Path, cwd: Path, env: dict[str, str] | None, beat: Callable[[], None]
    ) -> tuple[int, bytes]:
        """Run one job; return the worker's exit code and the result it wrote to its pipe."""

    def close(self) -> None: ...


#: The worker's first code, run as ``python -I -c BOOT``: see the module docstring.
BOOT = r"""
import os, sys, json, hashlib
from importlib.machinery import PathFinder, SourceFileLoader
_roots = [os.path.realpath(p) for p in os.environ.get("HARNESS_FRESH_ROOTS", "").split(os.pathsep) if p]
_study = os.path.realpath(os.getcwd())
_exempt = set(filter(None, os.environ.get("HARNESS_EXEMPT", "").split(",")))
_sources = os.environ.get("HARNESS_SOURCES")
_sources = None if _sources is None else {(os.path.join(r, f) if f else r): h
                                          for r, fs in json.loads(_sources).items() for f, h in fs.items()}
def _under(p, r):
    return p == r or p.startswith(r + os.sep)
class _FromSource(SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        data = self.get_data(path)  # read once: these bytes are checked, and these are compiled
        if _sources is not None:
            want = _sources.get(os.path.realpath(path))
            if want is None:
                raise ImportError(f"{fullname} ({path}) is not among the sources the runner verified before "
                                  "the run (a file added to a frozen folder after the check)")
            if hashlib.sha256(data).hexdigest() != want:
                raise ImportError(f"{fullname} ({path}): its bytes are not the ones the runner verified "
                                  "before the run (the file changed while the run started)")
        return self.source_to_code(data, path)
class _Frozen:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = PathFinder.find_spec(name, path, target)
        if spec is None or not spec.origin or not os.path.isabs(spec.origin):
            return spec
        origin = os.path.realpath(spec.origin)
        if _under(origin, _study) and not any(_under(origin, r) for r in _roots):
            top = os.path.relpath(origin, _study).split(os.sep)[0]
            if top in _exempt or top.endswith(".md"):
                raise ImportError(f"{name} ({origin}) lies in {top}/, which the freeze exempts: frozen code cannot "
                                  "import it (move the helper into a frozen folder)")
        if any(_under(origin, r) for r in _roots):
            if isinstance(spec.loader, SourceFileLoader):
                spec.loader = _FromSource(spec.loader.name, spec.loader.path)
            elif _sources is not None:
                raise ImportError(f"{name} ({origin}) is compiled code in a frozen folder: its bytes cannot be "
                                  "checked against the verified sources (import it from an installed package)")
        return spec
    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()
sys.meta_path.insert(0, _Frozen)
sys.path[:0] = [p for p in os.environ.get("HARNESS_CODE_PATH", "").split(os.pathsep) if p]
sys.path.append(_study)  # plug-ins at the study's root, after every installed package (none is shadowed)
import runpy
runpy.run_module("harness.execute.worker", run_name="__main__", alter_sys=True)
"""


def worker_command(*args: str) -> list[str]:
    """``python -I -B`` (no bytecode written) with hash-based bytecode always checked, running
    :data:`BOOT`."""
    return [sys.executable, "-I", "-B", "--check-hash-based-pycs", "always", "-c", BOOT, *args]


class Spawn:
    name = "spawn"

    def start(self, cwd: Path, env: dict[str, str] | None) -> None:
        pass

    def run(
        self, job: Path, log: Path, cwd: Path, env: dict[str, str] | None, beat: Callable[[], None]
    ) -> tuple[int, bytes]:
        r, w = os.pipe()
        try:
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    worker_command(str(job), f"fd:{w}"),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=env,
                    pass_fds=(w,),
                )
                os.close(w)
                w = -1
                data = read_pipe(r, beat, lambda: proc.poll() is not None)
                while True:
                    try:
                        return proc.wait(timeout=1.0), data
                    except subprocess.TimeoutExpired:
                        beat()
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)

    def close(self) -> None:
        pass


class ForkServer:
    """Client of ``python -m harness.execute.worker --serve`` (see :func:`harness.execute.worker.serve`)."""

    name = "forkserver"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, cwd: Path, env: dict[str, str] | None) -> None:
        self._start(cwd, env)

    def _start(self, cwd: Path, env: dict[str, str] | None) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            import tempfile

            from prereg.errors import RefusedError

            errors = tempfile.TemporaryFile()  # what the server says if it cannot start (an import refused)
            self.proc = subprocess.Popen(
                worker_command("--serve"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                cwd=cwd,
                env=env,
                text=True,
                bufsize=1,
            )
            assert self.proc.stdout is not None
            ready = self.proc.stdout.readline().strip()
            if ready != "READY":
                code = self.proc.wait()
                errors.seek(0)
                said = errors.read().decode("utf-8", "replace").strip().splitlines()
                errors.close()
                raise RefusedError(
                    f"the fork server did not start (exit {code}): {said[-1] if said else 'it said nothing'}; "
                    "no run of this unit was started"
                )
        return self.proc

    def run(
        self, job: Path, log: Path, cwd: Path, env: dict[str, str] | None, beat: Callable[[], None]
    ) -> tuple[int, bytes]:
        proc = self._start(cwd, env)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{job} -\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return -int(signal.SIGPIPE), b""
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                beat()
                continue
            line = proc.stdout.readline()
            if not line:  # the server died: the child is gone with it
                return (-int(signal.SIGKILL) if proc.wait() < 0 else 1), b""
            _pid, _, rest = line.rstrip("\n").partition(" ")
            status, _, data = rest.partition(" ")
            if status != "START":
                return int(status), data.encode("ascii")

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def read_pipe(fd: int, beat: Callable[[], None], ended: Callable[[], bool]) -> bytes:
    """Everything written to the pipe ``fd`` until its writers close it or the writer process has
    ``ended`` (a process it started may still hold the pipe open), calling ``beat`` each second."""
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            continue
        if ended():
            os.set_blocking(fd, False)
            try:
                while chunk := os.read(fd, 1 << 16):
                    chunks.append(chunk)
            except BlockingIOError:
                pass
            return b"".join(chunks)
        beat()


LAUNCHERS: dict[str, Callable[[], Launcher]] = {"spawn": Spawn, "forkserver": ForkServer}


def launch(
    launcher: Launcher,
    job: Mapping[str, object],
    work: Path,
    cwd: Path,
    env: dict[str, str] | None,
    beat: Callable[[], None],
) -> Outcome:
    """Write ``job`` into ``work``, run it as one fresh worker process, collect its outcome."""
    work.mkdir(parents=True, exist_ok=True)
    job_path, log_path = work / "job.json", work / "worker.log"
    atomic_write(job_path, canonical(job), overwrite=True)
    launcher.start(cwd, env)  # a fork server's start-up is not the run's time
    started = time.time()
    t0 = time.monotonic()
    code, data = launcher.run(job_path, log_path, cwd, env, beat)
    wall = time.monotonic() - t0
    finished = time.time()
    result: dict[str, Any] = {}
    if data.strip():
        try:
            result = json.loads(data)
        except ValueError:
            result = {}
    tail = ""
    if not result and log_path.exists():
        tail = log_path.read_bytes()[-2000:].decode("utf-8", "replace")
    return Outcome(code, result, wall, started, finished, tail)


#: What a worker inherits from the runner's environment: where things are (paths, caches, locale,
#: the devices Ray assigned), nothing that changes a code path.
ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "TERM",
        "SYSTEMROOT",
        "XDG_CACHE_HOME",
        "COTANGENT_NATIVE_CACHE",
        "HARNESS_DATA",
        "HARNESS_NODE_DIR",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)

#: The most the verified-sources map may take in a worker's environment (Linux limits one
#: environment string to 128 KiB).
SOURCES_MAX = 120_000


def source_hashes(roots: list[str]) -> dict[str, dict[str, str]]:
    """Every source file (``*.py``, ``*.c``) under ``roots``, by real root and path within it, with
    its sha256, each file read once. A root that is itself a source file (a frozen top-level
    module, such as a plug-in at the repository's root) is listed under its own path with the
    empty relative path.

    A worker's bootstrap (:data:`BOOT`) compiles a module of these folders only from bytes whose
    hash is the one here, and ``phase.c`` is compiled only from such bytes, so a file swapped while
    a worker or the fork server imports it (and restored after) makes the import fail instead
    of running unseen: what ran is what the runner read, which it compared with the tag's blobs
    (:func:`harness.freeze.check`) and whose hash the records hold (:func:`harness.freeze.code_sha256`)."""
    out: dict[str, dict[str, str]] = {}
    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        base = Path(root)
        if base.is_file() and base.suffix in (".py", ".c"):
            out[root] = {"": hashlib.sha256(base.read_bytes()).hexdigest()}
            continue
        if not base.is_dir() or any(root.startswith(r + os.sep) for r in out):
            continue
        files = sorted(p for p in [*base.rglob("*.py"), *base.rglob("*.c")] if "__pycache__" not in p.parts)
        out[root] = {
            p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
        }
    size = len(json.dumps(out))
    if size > SOURCES_MAX:
        raise ValueError(
            f"the frozen folders hold too much source for a worker's environment ({size} bytes of "
            f"hashes, at most {SOURCES_MAX}): move what the runs do not import to an exempt folder"
        )
    return out


def worker_env(
    extra_paths: list[str],
    *,
    threads: int | None = None,
    frozen: list[str] | None = None,
    exempt: list[str] | None = None,
    phase_sha256: str | None = None,
    environ: dict[str, str] | None = None,
) -> dict[str, str]:
    """The allow-listed environment of a worker that imports the harness from ``extra_paths``.

    ``threads`` (the protocol's) sets the OpenMP and MKL pools; ``frozen`` names the study's frozen
    top-level entries (compiled from source) and ``exempt`` the exempt ones (not importable);
    ``phase_sha256`` is the verified ``phase.c`` build the worker may load without rebuilding."""

    src = dict(os.environ) if environ is None else environ
    env = {k: v for k, v in src.items() if k in ALLOWED or k.startswith("LC_")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["HARNESS_CODE_PATH"] = os.pathsep.join(extra_paths)
    pkgs = package_dirs()
    roots = [str(p) for p in pkgs] + [str(Path(e).resolve()) for e in frozen or []]
    roots += [str(Path(p) / pkg) for p in extra_paths for pkg in PACKAGES]
    env["HARNESS_FRESH_ROOTS"] = os.pathsep.join(roots)
    env["HARNESS_SOURCES"] = json.dumps(source_hashes(roots), sort_keys=True, separators=(",", ":"))
    env["HARNESS_EXEMPT"] = ",".join(sorted(exempt or []))
    if phase_sha256:
        env["COTANGENT_PHASE_SHA256"] = phase_sha256
    if "HARNESS_TEST_SLOWDOWN" in src:  # the test knob (harness.execute.hermetic.SLOWDOWN)
        env["HARNESS_TEST_SLOWDOWN"] = src["HARNESS_TEST_SLOWDOWN"]
    return env
