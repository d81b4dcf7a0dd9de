"""The executors ``harness run`` offers, by name (``--executor NAME``; ``--ray ADDRESS`` is
``--executor ray`` at that address): each a factory of the one :class:`~harness.execute.base.Executor`
method. The in-process executor is for tests and is not offered (a study's runs each get a fresh
process). An executor added here is offered by ``harness run --executor`` with nothing else to change."""

from __future__ import annotations

from collections.abc import Callable

from harness.execute.base import Executor
from prereg.errors import InputError


def _local(address: str | None) -> Executor:
    from harness.execute.local import LocalExecutor

    return LocalExecutor()


def _ray(address: str | None) -> Executor:
    from harness.execute.ray import RayExecutor

    return RayExecutor(address or "auto")


#: The executors by name, each built from the cluster address it is given (None: its own default).
EXECUTORS: dict[str, Callable[[str | None], Executor]] = {"local": _local, "ray": _ray}
#: The executor of ``harness run`` without ``--executor`` or ``--ray``: this machine.
DEFAULT = "local"


def executor_named(name: str | None, ray: str | None = None) -> Executor:
    """The executor ``--executor NAME`` (default :data:`DEFAULT`) and ``--ray ADDRESS`` name, or
    :class:`~prereg.errors.InputError` naming an unknown executor, or ``--ray`` beside another one."""
    if ray and name not in (None, "ray"):
        raise InputError(
            f"--executor {name} and --ray {ray}: --ray is --executor ray; name one; nothing was run"
        )
    chosen = "ray" if ray else (name or DEFAULT)
    factory = EXECUTORS.get(chosen)
    if factory is None:
        raise InputError(
            f"--executor {chosen}: no executor of that name (one of: {', '.join(sorted(EXECUTORS))}); "
            "nothing was run"
        )
    return factory(ray)
