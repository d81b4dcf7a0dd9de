"""What a worker may see: the runner refuses what would change a run's code path and builds the
workers' allow-listed environment (protocol threads, frozen folders, the verified ``phase.c``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from harness import freeze, gitutil
from harness.protocol import Protocol

#: A test knob: ``HARNESS_TEST_SLOWDOWN=K`` (K >= 1) makes each run take K times its device time,
#: as on a machine K times slower (the worker sleeps the difference before it reports); the runner
#: refuses it for a preregistered study, says so when it applies, and the record's ``env`` names it.
SLOWDOWN = "HARNESS_TEST_SLOWDOWN"


def slowdown(environ: Mapping[str, str] | None = None) -> float:
    """The test knob's factor (1.0 when unset); ValueError for a value that is not a number in [1, 100]."""
    raw = (os.environ if environ is None else environ).get(SLOWDOWN)
    if raw is None:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        factor = float("nan")
    if not 1.0 <= factor <= 100.0:
        raise ValueError(f"{SLOWDOWN}={raw!r}: a factor from 1 to 100")
    return factor


def hermetic_env(proto: Protocol, root: Path, records: Path, anchor: str | None) -> dict[str, str]:
    """Refuse what would make the workers run other code than the protocol names; return their
    environment (see :mod:`harness.execute.runner`, "Hermetic workers")."""
    _refuse_knobs(proto)
    _refuse_other_installation(proto, records)
    _refuse_unbound_imports(proto, root)
    if anchor:
        _refuse_unreachable_anchor(root, anchor)
    return _worker_environment(proto, root)


def _refuse_knobs(proto: Protocol) -> None:
    """Refuse the slowdown test knob (a bad one, or any for a preregistered study) and an
    environment that changes a run's code path."""
    from harness.codepath import refused_environment
    from prereg.errors import RefusedError

    try:
        factor = slowdown()
    except ValueError as e:
        raise RefusedError(f"{proto.path}: {e}; nothing was run") from e
    if factor != 1.0 and proto.spec.preregistered:
        raise RefusedError(
            f"{proto.path}: {SLOWDOWN} is set: a test knob that slows every run, never for a "
            "preregistered study; nothing was run: unset it"
        )
    bad = refused_environment()
    if bad:
        raise RefusedError(
            f"{proto.path}: the environment sets what changes a run's code path; nothing was "
            f"run: {', '.join(bad)}. Unset it (a protocol says threads:, torch_version: and the "
            "arms; run the variation as a protocol of its own)"
        )


def _refuse_other_installation(proto: Protocol, records: Path) -> None:
    """Refuse a torch or numpy other than the one the study's earlier runs used."""
    import importlib.metadata as md

    from prereg.errors import RefusedError
    from prereg.formats.record import load_records

    mine: dict[str, str | None] = {}
    for pkg in ("torch", "numpy"):
        try:
            mine[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            mine[pkg] = None
    for r in load_records(records):
        env = r.env or {}
        for pkg, have in mine.items():
            was = env.get(pkg)
            if was is not None and have is not None and was.split("+")[0] != have.split("+")[0]:
                raise RefusedError(
                    f"{proto.path}: earlier runs of this study used {pkg} {was} "
                    f"({r.spec.run_id}), this installation has {have}; one study runs on one "
                    "installation: install that version, or copy the protocol to a new id"
                )


def _refuse_unbound_imports(proto: Protocol, root: Path) -> None:
    """Refuse a frozen plug-in that imports code the freeze does not bind."""
    from prereg.errors import RefusedError

    plugins = [
        Path(fp["path"]) if Path(fp["path"]).is_absolute() else root / fp["path"]
        for fp in proto.plugin_fingerprints().values()
    ]
    helpers = freeze.exempt_imports(root, plugins)
    if helpers:
        raise RefusedError(
            f"{proto.path}: a frozen plug-in imports code the freeze does not bind; nothing was "
            "run:\n" + "\n".join(f"  - {h}" for h in helpers) + "\nmove the helper into a frozen "
            "folder (beside the plug-in)"
        )


def _refuse_unreachable_anchor(root: Path, anchor: str) -> None:
    """Refuse an ``--anchor`` that is not a reachable git remote."""
    from prereg.errors import RefusedError

    reach = gitutil.git(root, "ls-remote", anchor, check=False)
    if reach.returncode != 0:
        raise RefusedError(
            f"--anchor {anchor}: not a reachable git remote ({reach.stderr.strip()[-200:]}); nothing was run"
        )


def _worker_environment(proto: Protocol, root: Path) -> dict[str, str]:
    """The workers' allow-listed environment; for a preregistered study, refused unless the sources
    it names are the tagged ones."""
    from harness.execute.launchers import worker_env
    from harness.packages import package_dirs
    from prereg.errors import RefusedError

    repo = gitutil.toplevel(root)
    frozen = [str(root / e) for e in freeze.frozen_entries(repo, "HEAD")] if repo else []
    try:
        env = worker_env(
            sorted({str(p.parent) for p in package_dirs()}),
            threads=proto.spec.threads,
            frozen=frozen,
            exempt=sorted(freeze.EXEMPT),
            phase_sha256=phase_library(proto),
        )
    except ValueError as e:
        raise RefusedError(f"{proto.path}: {e}; nothing was run") from e
    if proto.spec.preregistered and repo:
        import json

        bad = freeze.sources_mismatches(repo, "HEAD", json.loads(env["HARNESS_SOURCES"]))
        if bad:
            raise RefusedError(
                f"{proto.path}: the sources read for the workers are not the tagged ones; nothing was "
                "run:\n" + "\n".join(f"  - {b}" for b in bad)
            )
    return env


def phase_library(proto: Protocol) -> str | None:
    """Build or verify the ``phase.c`` library here, once, before any worker (where an arm may load it)."""
    arms = {a for s in proto.studies for a in s.arms}
    if proto.spec.device not in ("cpu", "auto") or "cotangent" not in arms:
        return None
    import hashlib

    from cotangent import kernel

    cc = kernel.compiler()
    if cc is None:
        return None
    try:
        return hashlib.sha256(kernel.build(cc).read_bytes()).hexdigest()
    except (OSError, RuntimeError, ValueError):
        return None  # the worker says why the phase runs on torch's kernels
