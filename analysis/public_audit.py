#!/usr/bin/env python3
"""Public audit of the Cotangent study's records, with the Python standard library alone.

Usage: ``python analysis/public_audit.py [RECORDS_DIR ...] [--head SEQ:SHA256] [--anchor REMOTE]
[--allowed-signers FILE]`` (default: every folder under ``records/`` that holds a MANIFEST).
Runs as ``python -I -S -B analysis/public_audit.py`` too, and as ``python -m audit``.

This file is the entry point and nothing imports it. The audit is the package ``audit/`` (its
command line, the folder's checks, the tag's signature and anchors, the published texts) over the
core ``prereg/`` (the records format and every rule), both standard library only. A script run by
its path has only its own folder on ``sys.path`` (and under ``-I`` not even that), so this file, and
nothing else of the project, puts the repository's root there: the packages then load once, under
their one name.

The audit's own code is read as source only: every module of its root is compiled from its ``.py``
file (a ``__pycache__`` beside it is never read, none is written), anything else that would import
from there (a sourceless ``.pyc``, an extension module) is refused, and so is any file of
``audit/`` or ``prereg/`` that is not Python source when git tracks it (or, outside a git checkout,
as in a folder extracted from the signed tag with ``git archive``, when it is there at all).
docs/provenance.md says how to run the audit taken from the signed tag.
"""

import os
import subprocess
import sys
from importlib.machinery import PathFinder, SourceFileLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The audit's own packages: nothing but Python source may be in them.
OWN = ("audit", "prereg")
sys.dont_write_bytecode = True


class _Source(SourceFileLoader):
    def get_code(self, fullname):  # type: ignore[no-untyped-def]
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class _SourceOnly:
    """Modules of the audit's root come from their source file, never from bytecode."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):  # type: ignore[no-untyped-def]
        spec = PathFinder.find_spec(name, path, target)
        if spec is None or not spec.origin or not os.path.realpath(spec.origin).startswith(ROOT + os.sep):
            return spec
        origin = os.path.realpath(spec.origin)
        if type(spec.loader) is not SourceFileLoader:
            raise ImportError(f"{origin}: not Python source; the audit imports nothing else from {ROOT}")
        spec.loader = _Source(spec.loader.name, spec.loader.path)
        return spec


def not_source() -> list[str]:
    """The files of the audit's own packages that are not Python source: those git tracks, or,
    outside a git checkout of this root, every one there."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *OWN], cwd=ROOT, capture_output=True, text=True, check=False
        )
        checkout = top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(ROOT)
    except OSError:
        checkout = False
    if checkout:
        files = [f for f in listed.stdout.split("\0") if f]
    else:
        files = [
            os.path.relpath(os.path.join(base, n), ROOT)
            for d in OWN
            for base, dirs, names in os.walk(os.path.join(ROOT, d))
            for n in names + [x for x in dirs if x == "__pycache__"]
        ]
    return sorted(f for f in files if not f.endswith(".py") or "__pycache__" in f.split(os.sep))


if __name__ == "__main__":
    stray = not_source()
    if stray:
        print(
            "public audit: refused: the audit's own packages hold files that are not Python source "
            f"({', '.join(stray[:5])}{', ...' if len(stray) > 5 else ''}): bytecode or a module there "
            "could run instead of the audit's source. Take the audit from the signed tag "
            "(docs/provenance.md, 'Verifying a study')."
        )
        sys.exit(1)
    sys.meta_path.insert(0, _SourceOnly)
    sys.path.insert(0, ROOT)
    try:
        from audit.cli import entry
    except ImportError as e:
        print(f"public audit: refused: {e}")
        sys.exit(1)
    sys.exit(entry(sys.argv[1:]))
