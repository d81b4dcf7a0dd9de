"""How one run starts on its machine: a fresh process per run.

* ``spawn``: ``python -m harness.execute.worker JOB RESULT``, a new interpreter per run;
* ``forkserver``: ``python -m harness.execute.worker --serve`` imports everything once and forks a fresh
  child per run (Linux), so each run still starts from a pristine process without paying the
  interpreter's and torch's start-up.

Both return an :class:`Outcome`: the worker's exit code, its result (``timings.device_s`` is the
worker's own measure of its time; when the process died before it could say, the launcher's wall
time stands in and ``device_s_source`` says so) and the tail of its log. The result comes back
through a pipe the worker inherits (``fd:N`` in place of a result file), never through a file, so
no other process can read an outcome before the runner has sealed it into the ledger.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.records import atomic_write, canonical


@dataclass
class Outcome:
    code: int
    result: dict[str, Any]
    wall_s: float
    started_at: float  # time.time() at launch
    finished_at: float = 0.0  # time.time() when the worker process ended
    log_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def status_reason(self) -> tuple[str, str | None]:
        if self.code == 0 and self.result.get("status") == "ok":
            return "ok", None
        if self.code < 0:
            return "failed", f"worker killed by signal {signal.Signals(-self.code).name}"
        return "failed", self.result.get("reason") or f"worker exited with code {self.code}"

    def device_s(self) -> tuple[float, str]:
        own = (self.result.get("timings") or {}).get("device_s")
        return (float(own), "worker") if own is not None else (self.wall_s, "launcher wall time (worker died)")


class Launcher(Protocol):
    name: str

    def start(self, cwd: Path, env: dict[str, str] | None) -> None:
        """Get ready to run (a fork server imports everything), outside any run's time."""

    def run(self, job: Path, log: Path, cwd: Path, env: dict[str, str] | None,
            beat: Callable[[], None]) -> tuple[int, bytes]:
        """Run one job; return the worker's exit code and the result it wrote to its pipe."""

    def close(self) -> None: ...


class Spawn:
    name = "spawn"

    def start(self, cwd: Path, env: dict[str, str] | None) -> None:
        pass

    def run(self, job: Path, log: Path, cwd: Path, env: dict[str, str] | None,
            beat: Callable[[], None]) -> tuple[int, bytes]:
        r, w = os.pipe()
        try:
            with open(log, "wb") as out:
                proc = subprocess.Popen([sys.executable, "-m", "harness.execute.worker", str(job), f"fd:{w}"],
                                        stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, pass_fds=(w,))
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
            self.proc = subprocess.Popen([sys.executable, "-m", "harness.execute.worker", "--serve"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, cwd=cwd, env=env, text=True, bufsize=1)
            assert self.proc.stdout is not None
            ready = self.proc.stdout.readline().strip()
            if ready != "READY":
                raise RuntimeError(f"the fork server did not start (said {ready!r}, exit {self.proc.poll()})")
        return self.proc

    def run(self, job: Path, log: Path, cwd: Path, env: dict[str, str] | None,
            beat: Callable[[], None]) -> tuple[int, bytes]:
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
    chunks = []
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


def launch(launcher: Launcher, job: dict[str, Any], work: Path, cwd: Path, env: dict[str, str] | None,
           beat: Callable[[], None]) -> Outcome:
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


def worker_env(extra_paths: list[str]) -> dict[str, str]:
    """The environment for a worker that must import the harness from ``extra_paths`` first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_paths, *filter(None, [env.get("PYTHONPATH")])])
    return env
