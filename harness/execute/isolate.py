"""Each lockstep command arm in a PID namespace of its own (Linux), so that neither arm can
signal, trace or read the ``/proc`` of its partner.

The worker starts each arm of a pair with :func:`launcher` as the child's last step before it
runs the program (``subprocess.Popen``'s ``preexec_fn``). In that child, which the worker forked:

1. ``unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS)``: a user namespace that maps the
   worker's own uid and gid to themselves (no privilege is needed where the kernel allows
   unprivileged user namespaces, and a root worker's arm gives up its capabilities outside it), a
   PID namespace for its next child, and a mount namespace of its own;
2. ``fork``: the child of that fork is process 1 of the new PID namespace. It mounts a ``/proc``
   of that namespace (so ``/proc`` lists its own processes only) and goes on to run the program;
3. the first process (the *relay*, still in the worker's namespaces) closes every descriptor
   but its report pipe, waits for the program and tells the worker each stop and continue the
   kernel reports of it (``S`` and ``C`` on the pipe, after ``P<pid>``, the program's pid as
   the worker sees it), then ends with the program's exit status. It sleeps in ``waitpid`` the
   whole run: no per-step work.

The partner's pid is then no process in an arm's namespace: ``kill``, ``ptrace`` and
``pidfd_open`` name none, ``/proc`` does not show it, and ``SO_PEERCRED`` on the lockstep socket
gives pid 0. A process an arm leaves behind cannot outlive it: when process 1 of a PID namespace
exits, the kernel kills every process left in it before the relay's ``waitpid`` returns.

Where the kernel refuses (user namespaces off, ``user.max_user_namespaces`` 0, a seccomp or LSM
rule, a ``/proc`` that may not be mounted there), :func:`unavailable` says why once per worker,
the arms run unisolated as before, and each arm's record says so (``process.isolation``), which
the audit names ("arms not isolated"). The kernel's view (:mod:`harness.execute.watch`) watches the
arm's whole process tree, the relay's descendants, either way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
from collections.abc import Callable
from functools import lru_cache

__all__ = ["ISOLATED", "NOT_ISOLATED", "launcher", "read_reports", "unavailable"]

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1

#: ``process.isolation`` of an arm in a PID namespace of its own.
ISOLATED = "pid namespace"
#: What the record's ``process.isolation`` starts with, and the audit names, where it is not.
NOT_ISOLATED = "arms not isolated"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enter(uid: int, gid: int) -> None:
    """New user, PID (for the next child) and mount namespaces, the ids mapped to themselves."""
    _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _own_proc() -> None:
    """In process 1 of the new PID namespace: mounts private to it, and its own ``/proc``."""
    libc = _libc()
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")


def _die_with_parent() -> None:
    _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _relay(pid: int, report: int) -> None:
    """The relay's whole life: the program's pid, its stops and continues, then its exit status."""
    os.closerange(0, report)  # the exec-error pipe, the lockstep socket, the log: the program's
    os.closerange(report + 1, os.sysconf("SC_OPEN_MAX"))
    os.write(report, f"P{pid}\n".encode())
    while True:
        try:
            _, status = os.waitpid(pid, os.WUNTRACED | os.WCONTINUED)
        except InterruptedError:
            continue
        if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
            os.write(report, b"S\n" if os.WIFSTOPPED(status) else b"C\n")
            continue
        break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        except (OSError, ValueError, RuntimeError):
            pass
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def launcher(report: int) -> Callable[[], None]:
    """The ``preexec_fn`` that puts the program in its own namespaces, the relay reporting on the
    pipe's write end ``report`` (which the program does not keep)."""
    uid, gid = os.getuid(), os.getgid()

    def launch() -> None:
        _die_with_parent()  # the relay dies with the worker
        _enter(uid, gid)
        pid = os.fork()
        if pid == 0:  # process 1 of the new namespace: goes on to run the program
            os.close(report)
            _die_with_parent()  # and with the relay
            _own_proc()
            return
        try:
            _relay(pid, report)
        finally:
            os._exit(1)

    return launch


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why this worker cannot put an arm in namespaces of its own (None: it can), tried once in a
    child process exactly as :func:`launcher` does."""
    if not sys.platform.startswith("linux"):
        return f"{NOT_ISOLATED}: PID namespaces are Linux's, this is {sys.platform}"
    r, w = os.pipe()
    uid, gid = os.getuid(), os.getgid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(r)
        code = 0
        try:
            _enter(uid, gid)
            inner = os.fork()
            if inner == 0:
                try:
                    _own_proc()
                    os._exit(0 if os.getpid() == 1 else 3)
                except OSError as e:
                    os.write(w, str(e).encode()[:500])
                    os._exit(2)
            code = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1])
        except OSError as e:
            os.write(w, str(e).encode()[:500])
            code = 2
        os._exit(code)
    os.close(w)
    why = b""
    while chunk := os.read(r, 512):
        why += chunk
    os.close(r)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code == 0:
        return None
    return f"{NOT_ISOLATED}: the kernel refused a PID namespace for each arm ({_why(why, code)}; {_limits()})"


def _why(raw: bytes, code: int) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text or f"the trial process ended with status {code}"


def _limits() -> str:
    """The kernel's settings that allow unprivileged user namespaces, as they read here."""
    out = []
    for path in (
        "/proc/sys/user/max_user_namespaces",
        "/proc/sys/kernel/unprivileged_userns_clone",
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    ):
        try:
            with open(path, "rb") as f:
                out.append(f"{path.rsplit('/', 1)[1]} = {f.read(64).decode().strip()}")
        except OSError:
            continue
    return ", ".join(out) or "no namespace settings readable"


def read_reports(fd: int, events: list[tuple[float, str]], tree: list[int]) -> None:
    """The worker's side of a relay's pipe (a thread, until the relay ends): the program's pid
    into ``tree``, each stop and continue into ``events`` as the kernel's reports to a parent are."""
    import time

    buf = b""
    while True:
        try:
            chunk = os.read(fd, 256)
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            break
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"P") and line[1:].isdigit():
                tree.append(int(line[1:]))
            elif line in (b"S", b"C"):
                events.append((time.monotonic(), "stopped" if line == b"S" else "continued"))
    os.close(fd)
