"""The processes a command leaves behind: found, killed and counted at the end of its run (Linux).

A command runs in a process group of its own, and its wall-clock limit kills that group; but a
descendant can leave the group (``setsid``, a double fork) and outlive the command, stalling the
runs that come after it or rewriting the command's reporter file once the command has exited. So
the worker makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): every descendant
orphaned while a command runs is re-parented to the worker rather than to init, and stays in the
worker's tree of processes, which ``/proc`` shows. When the command has ended, every process in
that tree that was not there before the command started is a survivor: it is killed (with its own
descendants), waited for until it is gone, and named; the run fails with that reason. Only then is
the reporter file read and hashed, so nothing of the run is left to write it.

An orphan that has already exited by the end is counted too (the worker reaps it, and names it):
it outlived the process that started it, which an honest training script's helpers (joined data
loaders, ``multiprocessing`` workers) do not. Orphans that exit while their command is still
running are reaped on the way (:meth:`Reaper.reap_exited`), and are not survivors: whatever they
did, they did while the command ran.

Elsewhere than Linux (no ``/proc``, no subreaper) :class:`Reaper` finds nothing; the process group
is then all the harness ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass

__all__ = ["Reaper", "Survivor"]

#: ``prctl``'s options that make a process the reaper of its orphaned descendants, and read it
#: (Linux 3.4).
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
#: How long the worker waits for the survivors it killed to be gone (seconds).
KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class Survivor:
    """A process of the run still there when its command had ended."""

    pid: int
    argv: str  # its command line, as /proc shows it (shortened)
    state: str  # "running" (killed by the harness) or "exited" (it had ended after its command)

    def describe(self) -> str:
        return f"pid {self.pid} ({self.argv}), {self.state}"


def _stat(pid: int) -> tuple[int, str] | None:
    """A process's parent and state letter, from ``/proc/<pid>/stat`` (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
    try:
        return int(rest[1]), rest[0]
    except (IndexError, ValueError):
        return None


def _argv(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return "?"
    text = " ".join(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p)
    return (text[:120] + "...") if len(text) > 120 else (text or "?")


def _tree(root: int) -> dict[int, tuple[int, str]]:
    """Every process below ``root`` (pid: its parent and state), from one scan of ``/proc``."""
    parents: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit():
            got = _stat(int(name))
            if got is not None:
                parents[int(name)] = got
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[int, str]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in out and pid in parents:
            out[pid] = parents[pid]
            todo += children.get(pid, [])
    return out


class Reaper:
    """The worker's end of a command's processes: built before the command starts (it makes the
    worker a subreaper and notes which processes below it are not the run's), then
    :meth:`reap_exited` while the command runs, :meth:`end` when it has ended and :meth:`close`
    (the worker's earlier setting back: a process that runs commands in turn, as the tests do,
    is left as it was)."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self.enabled = sys.platform.startswith("linux") and os.path.isdir(f"/proc/{self.me}")
        self.before: set[int] = set()
        self.commands: set[int] = set()
        if not self.enabled:
            return
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        self._libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        self._was = was.value
        if self._libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            self.enabled = False
            return
        self.before = set(_tree(self.me))

    def close(self) -> None:
        """The worker's subreaper setting as it was before."""
        if self.enabled and not self._was:
            self._libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            self.enabled = False

    def started(self, pid: int) -> None:
        """A command the worker started (its own child, reaped by its runner, not a survivor)."""
        if self.enabled:
            self.commands.add(pid)

    def _orphans(self) -> dict[int, tuple[int, str]]:
        """The run's processes below the worker that are not its commands, nor below a command
        still running (those are the command's own business until it ends)."""
        tree = _tree(self.me)
        inside: set[int] = set()
        for pid in self.commands:
            if pid in tree and tree[pid][1] != "Z":
                todo = [pid]
                while todo:
                    p = todo.pop()
                    inside.add(p)
                    todo += [q for q, (pp, _) in tree.items() if pp == p and q not in inside]
        return {
            pid: v
            for pid, v in tree.items()
            if pid not in self.before and pid not in self.commands and pid not in inside
        }

    def reap_exited(self) -> None:
        """Reap the orphans that have exited while every command still runs (not survivors: what
        they did, they did during the run). Once a command has ended, nothing is reaped here: an
        orphan that exits after its command is a survivor, counted by :meth:`end`."""
        if not self.enabled or not self.commands:
            return
        dead = [pid for pid, (ppid, state) in self._orphans().items() if ppid == self.me and state == "Z"]
        if not dead or not all((s := _stat(pid)) is not None and s[1] != "Z" for pid in self.commands):
            return  # read after the scan: every command outlived the orphans found dead in it
        for pid in dead:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def end(self) -> list[Survivor]:
        """Every process of the run still there now that its commands have ended: each killed
        (SIGKILL, its descendants with it), waited for until gone, and returned."""
        if not self.enabled:
            return []
        found: dict[int, Survivor] = {}
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            left = {pid: v for pid, v in self._orphans().items() if pid not in self.commands}
            for pid, (_, state) in left.items():
                if pid not in found:
                    found[pid] = Survivor(pid, _argv(pid), "exited" if state == "Z" else "running")
                if state != "Z":
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            for pid, (ppid, _) in left.items():
                if ppid == self.me:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return sorted(found.values(), key=lambda s: s.pid)
