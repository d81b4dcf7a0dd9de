"""Command arms: a study whose two arms are programs of their own (a ``train.py``), refused at plan
time, naming the file, key and line, when they cannot run as planned.

The core (:mod:`prereg.commands`, through the protocol's reader) declares and checks every key of a
command arm and of its study's metric (the argument list and its placeholders, the form of the
working directory and the commit, the environment, the metrics); this module checks on top what
needs the file system: the working directory a folder inside the repository, the ``ref`` a commit
of it, the program found. It also fills a run's placeholders (:func:`substitute`).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from harness import gitutil
from prereg.commands import ROLES
from prereg.protocol.schema import CommandArm, Document, KeyPath


def check_arms(doc: Document, arms: Mapping[str, CommandArm], kp: KeyPath, root: Path) -> None:
    """A command study's two arms (the core's, :func:`prereg.commands.command_arms`) found where they
    run: each arm's ``ref`` a commit of the repository at ``root``, else its working directory a
    folder inside it and its program there."""
    for role in ROLES:
        _check_where(doc, arms[role], kp + (role,), root)


def _check_where(doc: Document, a: CommandArm, kp: KeyPath, root: Path) -> None:
    """The arm's ``ref`` (if any) a commit of the repository; without one, its working directory a
    folder inside the repository and its program found there."""
    cwd, ref = a["cwd"], a["ref"]
    if ref is not None:
        repo = gitutil.toplevel(root)
        got = gitutil.git(repo, "cat-file", "-t", ref, check=False) if repo else None
        if got is None or got.returncode != 0 or got.stdout.strip() != "commit":
            raise doc.error(kp + ("ref",), f"{ref}: not a commit of the repository at {repo or root}")
        return
    if not (root / cwd).resolve().is_relative_to(root.resolve()) or not (root / cwd).is_dir():
        raise doc.error(kp + ("cwd",), f"{cwd!r}: not a folder inside the repository {root}")
    _program(doc, a["command"], kp + ("command",), root / cwd)


def _program(doc: Document, argv: list[str], kp: KeyPath, cwd: Path) -> None:
    """The program is found (on PATH, or a file in the working directory), and a Python script
    that ``python`` is given is a file there (a ref arm's are checked in its checkout, at run time)."""
    prog = argv[0]
    if "{" in prog:
        return
    if prog not in ("python", "python3") and shutil.which(prog) is None and not (cwd / prog).is_file():
        raise doc.error(kp + (0,), f"command not found: {prog} (not on PATH, nor a file in {cwd})")
    if prog in ("python", "python3") and len(argv) > 1 and argv[1].endswith(".py") and "{" not in argv[1]:
        if not (cwd / argv[1]).is_file():
            raise doc.error(kp + (1,), f"{argv[1]}: no such script in {cwd}")


def substitute(arg: str, values: dict[str, str]) -> str:
    """One argument with its placeholders replaced (``{{`` and ``}}`` are literal braces)."""
    return arg.format_map(values)
