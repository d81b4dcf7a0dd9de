"""The Cotangent study harness: preregistered paired-seed experiments on training speed.

Public entry points: :mod:`cotangent` (the method), ``harness`` (the command line).
"""

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

# The runner writes no bytecode into the repository (docs/provenance.md, "No bytecode, no hooks"):
# a cache it wrote could not be told from a planted one, and a run refuses both.
sys.dont_write_bytecode = True

#: The project's packages: each module of them is compiled from its source file, never read from a
#: ``__pycache__`` beside it (an unchecked-hash ``.pyc`` is loaded whatever its source says).
SOURCE_ONLY = ("harness", "prereg", "cotangent", "analysis", "audit")


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A source file's loader that compiles the source every time and never reads its cache."""

    def get_code(self, fullname: str) -> CodeType:
        return self.source_to_code(self.get_data(self.path), self.path)


class SourceOnlyFinder(importlib.abc.MetaPathFinder):
    """Finds the project's modules as the path finder does, loading each from its source only: the
    runner's own bytecode check (``harness.freeze.bytecode_problems``) and every module it guards
    cannot be replaced by a planted cache. A sourceless ``.pyc`` is left to that check, which
    refuses it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in SOURCE_ONLY:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _SourceOnlyLoader(spec.loader.name, spec.loader.path)
        return spec


if not any(isinstance(f, SourceOnlyFinder) for f in sys.meta_path):
    # just before the path finder: a finder placed ahead of it (a worker's bootstrap, which checks
    # each source's sha256 too, harness.execute.launchers.BOOT) keeps its place and its checks
    _at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), 0)
    sys.meta_path.insert(_at, SourceOnlyFinder())

__version__ = "0.1.0"
