"""Where the project's packages are: the folders beside this harness, one per name in the core's
:data:`prereg.formats.ledger.PACKAGES` (hashed for the records, shipped to Ray nodes, compiled by workers
only from verified bytes)."""

from __future__ import annotations

from pathlib import Path

from prereg.formats.ledger import PACKAGES


def package_dirs() -> list[Path]:
    """The folders of the project's packages (the core's :data:`PACKAGES`): beside this harness at
    the root it runs from, else where the import system would find the package without loading it
    (a Ray node unpacks each package into a folder of its own); a package found nowhere (an
    installed harness without the report) is left out."""
    import importlib.util

    import harness

    assert harness.__file__ is not None  # a regular package, imported from its files
    top = Path(harness.__file__).resolve().parent.parent
    out = []
    for pkg in PACKAGES:
        if (top / pkg / "__init__.py").is_file():
            out.append(top / pkg)
            continue
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.origin and Path(spec.origin).name == "__init__.py":
            out.append(Path(spec.origin).resolve().parent)
    return out
