"""The reporter: what a training script of its own tells the harness, standard library only.

One file, no dependency but Python's standard library: a script imports it
(``from harness.reporter import Reporter``) or copies this file next to itself. The harness runs the
script as a *command arm* (``docs/your-change.md``, "Your own script") and derives every endpoint
from the file the reporter writes::

    from harness.reporter import Reporter

    r = Reporter.from_env()           # just before the training loop
    for step in range(1, steps + 1):
        loss = train_step()
        r.step(step, loss, tokens=batch_tokens)
        if step % eval_every == 0:
            with r.untimed():         # evaluation and checkpoints: off the training clock
                r.eval(step, {"val_loss": evaluate()})
    r.done()

Outside the harness (``HARNESS_REPORT`` unset) :meth:`Reporter.from_env` gives a reporter that
writes nothing, so the script runs as before.

The file (format 1) is JSON lines, one object a line, each with ``kind`` and ``t``
(:func:`time.monotonic`, the machine's one clock, which the harness checks against its own):

* ``start``: ``format``, ``pid``, ``cpu`` (:func:`time.process_time`): the clock starts here;
* ``step``: ``step`` (1, 2, ...), ``loss``, ``tokens`` (or null), ``cpu``, and ``dt`` and
  ``cpu_dt``: the step's wall and CPU seconds on the training clock since the previous step (the
  first: since the start), less the ``untimed`` blocks between; after a lockstep hand-over, since
  the turn came back;
* ``eval``: ``step`` (the last step reported), ``metrics`` (name: number);
* ``untimed``: an untimed block's ``t0``, ``t1``, ``cpu0``, ``cpu1`` (the outermost block only);
* ``wait``: a lockstep pair's hand-over (or its start barrier): ``t0``, ``t1``, ``cpu``;
* ``plant``: a planted study's candidate (``HARNESS_PLANT``): the plant's ``t0``, ``t1``, ``cpu0``,
  ``cpu1``, run at the end of each step, before its ``step`` line (so on the training clock);
* ``done``: ``steps`` (how many were reported), ``cpu``.

Every ``dt`` is the difference of the file's own stamps, so the harness and the audit recompute
the clock from them (``prereg/evidence.py``) and refuse a file whose ``dt`` says otherwise.

Lockstep (``design: lockstep``): the harness starts both arms of a pair at once and hands each a
socket (``HARNESS_LOCKSTEP_FD``) to the other. :meth:`Reporter.from_env` is a start barrier (the
arm that steps first, ``HARNESS_STEPS_FIRST``, waits until its partner has built its reporter);
the blocks of ``HARNESS_BLOCK_STEPS`` steps go in ABBA order, an arm's two consecutive blocks one
turn, and at the end of each turn the reporter passes it to the partner and waits for it back, so
only one arm trains at a time and half of each arm's blocks follow its own step (its start line
says ``turns: joined``). A partner that has finished (or died) closes its
end; the other then runs on alone (and the harness fails the pair when one arm failed).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

FORMAT = 1
#: The environment the harness sets for a command arm's process.
ENV_REPORT = "HARNESS_REPORT"
ENV_LOCKSTEP_FD = "HARNESS_LOCKSTEP_FD"
ENV_BLOCK_STEPS = "HARNESS_BLOCK_STEPS"
ENV_STEPS_FIRST = "HARNESS_STEPS_FIRST"
#: A planted study's candidate: its plant as JSON (``{"kind": "spin", "us": N}`` or
#: ``{"kind": "gather", "bytes": N}``: ``prereg/planted.py``), which :meth:`Reporter.step` runs.
ENV_PLANT = "HARNESS_PLANT"


def spin(us: int) -> None:
    """Busy-wait until the calling thread has spent ``us`` microseconds of CPU time (its own clock,
    read each turn: a thread descheduled meanwhile spins on when it runs again)."""
    end = time.thread_time_ns() + us * 1000
    while time.thread_time_ns() < end:
        pass


def gather(buf: bytearray) -> None:
    """Read one byte of every 64-byte line of ``buf`` (a strided copy, discarded)."""
    buf[::64]  # noqa: B018  (the read is the cost)


def copy(src: bytearray, dst: bytearray) -> None:
    """Copy ``src`` into ``dst`` (one ``memmove`` of the whole buffer: memory bandwidth)."""
    dst[:] = src


def alloc(n: int) -> None:
    """A fresh zeroed buffer of ``n`` bytes, dropped at once (the allocator's churn)."""
    bytearray(n)


def sleep(us: int) -> None:
    """``us`` microseconds of wall time asleep (a wall-only cost: no CPU clock sees it)."""
    time.sleep(us / 1e6)


def plant_of(planted: Mapping[str, Any] | None) -> Callable[[], object] | None:
    """The plant a reporter runs each step (the standard-library kinds), or None."""
    if not planted:
        return None
    kind = planted.get("kind")
    if kind in ("spin", "sleep"):
        us = int(planted["us"])
        return (lambda: spin(us)) if kind == "spin" else (lambda: sleep(us))
    if kind in ("gather", "copy", "alloc"):
        n = int(planted["bytes"])
        if kind == "alloc":
            return lambda: alloc(n)
        buf = bytearray(b"\x01" * n)  # written once, so its pages exist before the first step
        if kind == "gather":
            return lambda: gather(buf)
        dst = bytearray(n)
        return lambda: copy(buf, dst)
    raise ValueError(f"{ENV_PLANT}: a reporter runs spin, gather, copy, alloc and sleep plants, not {kind!r}")


class Reporter:
    """Reports a training run's steps, evaluations and end to the harness (see the module's text).

    Build it with :meth:`from_env`; a reporter with no file (``path`` None) accepts every call and
    writes nothing."""

    def __init__(
        self,
        path: str | None,
        *,
        lockstep_fd: int | None = None,
        block_steps: int | None = None,
        steps_first: bool = True,
        planted: Mapping[str, object] | None = None,
    ) -> None:
        self._plant = plant_of(planted)
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115
        self._sock: socket.socket | None = None
        self._block = block_steps
        self._first = steps_first
        self._steps = 0
        self._depth = 0  # untimed blocks open (only the outermost is off the clock, once)
        self._done = False
        self._mark, self._cpu_mark = time.monotonic(), time.process_time()
        start = {
            "kind": "start",
            "format": FORMAT,
            "pid": os.getpid(),
            "t": self._mark,
            "cpu": self._cpu_mark,
        }
        if lockstep_fd is not None and block_steps:
            start["turns"] = "joined"  # it hands over at the end of a turn (:meth:`_turn_ends`)
        self._write(start)
        if lockstep_fd is not None and block_steps:
            self._sock = socket.socket(fileno=lockstep_fd)
            if steps_first:  # a start barrier: the partner's start-up is not beside this arm's first block
                self._wait()
            else:
                self._send(b"R")
                self._wait()

    @classmethod
    def from_env(cls, path: str | None = None) -> Reporter:
        """The reporter the harness asked for: its file is ``path`` or ``$HARNESS_REPORT`` (none:
        a reporter that writes nothing), and in a lockstep pair its hand-over socket."""
        fd = os.environ.get(ENV_LOCKSTEP_FD)
        block = os.environ.get(ENV_BLOCK_STEPS)
        return cls(
            path or os.environ.get(ENV_REPORT) or None,
            lockstep_fd=int(fd) if fd else None,
            block_steps=int(block) if block else None,
            steps_first=os.environ.get(ENV_STEPS_FIRST, "1") == "1",
            planted=json.loads(os.environ[ENV_PLANT]) if os.environ.get(ENV_PLANT) else None,
        )

    def _write(self, obj: dict[str, object]) -> None:
        if self._file is None:
            return
        obj.setdefault("t", time.monotonic())
        self._file.write(json.dumps(obj, sort_keys=True, allow_nan=True) + "\n")
        self._file.flush()

    def step(self, step: int, loss: float, tokens: int | None = None) -> None:
        """One training step has ended: its number (1, 2, ...), its loss (a float, or a 0-d tensor:
        read with ``float``, which waits for the device) and, optionally, how many tokens it
        trained on. Not inside :meth:`untimed` (a step is training)."""
        if self._depth:
            raise RuntimeError("Reporter.step() inside Reporter.untimed(): a training step is on the clock")
        value = float(loss)
        if self._plant is not None:  # a planted candidate: the known cost, on the training clock
            t0, c0 = time.monotonic(), time.process_time()
            self._plant()
            t1, c1 = time.monotonic(), time.process_time()
            self._write({"kind": "plant", "t0": t0, "t1": t1, "cpu0": c0, "cpu1": c1, "t": t1})
        now, cpu = time.monotonic(), time.process_time()
        self._write(
            {
                "kind": "step",
                "step": int(step),
                "loss": value if math.isfinite(value) else str(value),
                "tokens": None if tokens is None else int(tokens),
                "t": now,
                "cpu": cpu,
                "dt": now - self._mark,
                "cpu_dt": cpu - self._cpu_mark,
            }
        )
        self._mark, self._cpu_mark = now, cpu
        self._steps += 1
        if self._sock is not None and self._turn_ends():
            self._send(b"T")
            self._wait()

    def _turn_ends(self) -> bool:
        """Whether this arm's turn ends with the step just reported. The blocks of ``block_steps``
        steps go in ABBA order (``prereg/carryover.py``, ``blocks``) and an arm's consecutive blocks
        are one turn: the arm that steps first hands over after ``b``, ``3b``, ``5b``, ... steps,
        the other after ``2b``, ``4b``, ...: each arm's second block of a turn follows its own
        step with nothing of its partner's between (the after-own steps)."""
        b = self._block or 0
        if not b:
            return False
        return (self._steps - b) % (2 * b) == 0 if self._first else self._steps % (2 * b) == 0

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """An evaluation after ``step``: each metric a number (call it inside :meth:`untimed`)."""
        self._write(
            {"kind": "eval", "step": int(step), "metrics": {str(k): float(v) for k, v in metrics.items()}}
        )

    @contextmanager
    def untimed(self) -> Iterator[None]:
        """Time spent in this block (evaluation, checkpoints, logging) is off the training clock; the
        file says how much (an ``untimed`` line). A block inside another counts once."""
        self._depth += 1
        t0, c0 = time.monotonic(), time.process_time()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                t1, c1 = time.monotonic(), time.process_time()
                self._mark += t1 - t0
                self._cpu_mark += c1 - c0
                self._write({"kind": "untimed", "t0": t0, "t1": t1, "cpu0": c0, "cpu1": c1, "t": t1})

    def done(self) -> None:
        """The run has ended well: without this line the harness records a failed run."""
        if self._done:
            return
        self._done = True
        self._write({"kind": "done", "steps": self._steps, "cpu": time.process_time()})
        if self._sock is not None:
            self._send(b"T")  # the partner's turn for good (it then runs on alone)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _send(self, what: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(what)
        except OSError:  # the partner has gone: run on alone
            self._sock.close()
            self._sock = None

    def _wait(self) -> None:
        """Wait for the partner's turn (or its ready, at the start); the clock restarts when it comes."""
        if self._sock is None:
            return
        t0 = time.monotonic()
        try:
            got = self._sock.recv(1)
        except OSError:
            got = b""
        if not got:  # the partner has finished or gone: run on alone
            self._sock.close()
            self._sock = None
        self._mark, self._cpu_mark = time.monotonic(), time.process_time()
        self._write({"kind": "wait", "t0": t0, "t1": self._mark, "t": self._mark, "cpu": self._cpu_mark})
