"""The public audit's and the harness's command lines run in this test process, as the tests that
start them many times over read them: the same ``main`` that ``python analysis/public_audit.py``
(:func:`audit.cli.entry`) and ``python -m harness.cli`` (:func:`harness.cli.main`) call, in the
study's folder, their standard output and error captured, and the exit status they return, given
back as the :class:`subprocess.CompletedProcess` a process gives. An exception the command does not
turn into a message is written to standard error as the traceback a process prints, with exit
status 1, so a test's ``"Traceback" not in`` check still fails on it.

What a process of its own adds (the audit under ``python -I -S`` with its sources compiled afresh,
the harness's console entry point) is kept by at least one test per module that starts the real
process: an interpreter start and the imports for each of dozens of calls were most of the fast
tier's time in the modules that use this."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def _called(
    where: Path, argv: list[str], main: Callable[[list[str]], int], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``main(argv)`` with ``where`` as the working directory and ``env`` added to the environment,
    its output captured; the working directory, ``sys.path``, the environment and the SIGTERM
    handler restored afterwards (the harness's ``run`` sets one; ``compare-arms`` puts the study's
    root on the path), and the modules it imported from ``where`` (a plug-in, its package)
    forgotten, so that the next study's are its own."""
    out, err = io.StringIO(), io.StringIO()
    before = (os.getcwd(), list(sys.path), dict(os.environ), signal.getsignal(signal.SIGTERM))
    modules = set(sys.modules)
    os.environ.update(env or {})
    os.chdir(where)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's usage errors, as the process exits with them
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except Exception:  # what a process would print before it exits 1
                traceback.print_exc()
                code = 1
    finally:
        cwd, path, env, term = before
        os.chdir(cwd)
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGTERM, term)
        root = os.path.realpath(where) + os.sep
        for name in set(sys.modules) - modules:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            paths = list(getattr(sys.modules[name], "__path__", None) or [])
            if any(os.path.realpath(f).startswith(root) for f in [origin, *paths] if f):
                del sys.modules[name]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def audit_here(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -I -S analysis/public_audit.py ARGS`` run in ``repo``, in this process."""
    from audit.cli import entry

    return _called(repo, list(args), entry)


def harness_here(
    repo: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``harness ARGS`` run in ``repo`` with ``env`` added to the environment, in this process. For
    commands that train nothing (a refusal, ``plan``, ``report``): a run that trains starts
    workers, which is the process tier's."""
    from harness.cli import main

    return _called(repo, list(args), main, env)
