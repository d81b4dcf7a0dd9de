"""Where the project's packages are: the folders beside this harness, one per name in the core's
:data:`prereg.ledger.PACKAGES` (hashed for the records, shipped to Ray nodes, compiled by workers
only from verified bytes)."""

from __future__ import annotations

from pathlib import Path

from prereg.ledger import PACKAGES


def package_dirs() -> list[Path]:
    """The folders of the project's packages (the core's :data:`PACKAGES`), beside this harness at
    the root it runs from; a package not there (an installed harness without the report) is left out."""
    import harness

    assert harness.__file__ is not None  # a regular package, imported from its files
    top = Path(harness.__file__).resolve().parent.parent
    return [top / pkg for pkg in PACKAGES if (top / pkg / "__init__.py").is_file()]
