"""The designs by name: the one place a design's name is looked up (and compared).

A protocol file's study names its design (``paired``, ``lockstep``, ``factorial``); its records and
the protocol summary name it too from records schema 6 on (``design: lockstep``, with ``lockstep:
{block_steps}`` beside it), and before that what it is analysed as (a lockstep pair is a pair:
``design: paired``). :func:`study_design` reads every form back to the one
:class:`~prereg.designs.base.Design`; :func:`register` adds a design (its own module calls it).
"""

from __future__ import annotations

from collections.abc import Mapping

from prereg.designs.base import Design
from prereg.designs.factorial import FACTORIAL
from prereg.designs.lockstep import LOCKSTEP
from prereg.designs.paired import PAIRED

__all__ = [
    "DesignError",
    "design_label",
    "design_named",
    "design_names",
    "find_design",
    "register",
    "study_design",
    "unregister",
]


class DesignError(ValueError):
    """A design name no registered design has."""


_REGISTRY: dict[str, Design] = {}


def register(design: Design) -> Design:
    """Add ``design`` under its name; refuse a name taken by another design.

    Parameters
    ----------
    design : Design
        The design; its ``analysed_as`` must name a registered design or itself.

    Returns
    -------
    Design
        ``design``, so a module may write ``MINE = register(Mine())``.
    """
    held = _REGISTRY.get(design.name)
    if held is not None and held is not design:
        raise DesignError(f"design {design.name!r} is registered already")
    if design.analysed_as != design.name and design.analysed_as not in _REGISTRY:
        raise DesignError(
            f"design {design.name!r} is analysed as {design.analysed_as!r}, which is not a design"
        )
    _REGISTRY[design.name] = design
    return design


def unregister(name: str) -> None:
    """Remove the design registered as ``name`` (a test's own design, when the test ends)."""
    _REGISTRY.pop(name, None)


for _builtin in (PAIRED, LOCKSTEP, FACTORIAL):
    register(_builtin)


def design_names() -> tuple[str, ...]:
    """The registered designs' names, in registration order (what a protocol's ``design`` may say)."""
    return tuple(_REGISTRY)


def find_design(name: object) -> Design | None:
    """The design registered as ``name``, or None (a value not a design's name, of any type)."""
    return _REGISTRY.get(name) if isinstance(name, str) else None


def design_named(name: object) -> Design:
    """The design registered as ``name``; :class:`DesignError` naming the known designs if none is."""
    design = find_design(name)
    if design is None:
        raise DesignError(f"unknown design {name!r} (known: {', '.join(_REGISTRY)})")
    return design


def study_design(study: Mapping[str, object]) -> Design:
    """A study's design, from its entry in the protocol file (``design: lockstep``) or in the
    protocol summary (``design: lockstep``, or before records schema 6 ``design: paired``, with
    ``lockstep: {block_steps}``: a lockstep study analysed as a pair). The one place a design
    analysed as another is told from it.

    Parameters
    ----------
    study : Mapping
        The study's entry, in either form.

    Returns
    -------
    Design
        Its design; :class:`DesignError` when ``design`` names none.
    """
    design = design_named(study.get("design"))
    if study.get("lockstep"):
        return next(
            (d for d in _REGISTRY.values() if d.shares_process and d.analysed_as == design.name), design
        )
    return design


def design_label(study: Mapping[str, object] | None, brief: bool = False) -> str:
    """How a study's units ran, in words (:meth:`Design.label`): ``a process per arm``, or a lockstep
    study's turns (``brief``: ``lockstep, blocks of 10``). A study of neither form (None, or no
    ``design``: an earlier summary's study known only by its ``lockstep`` entry) reads as a pair.

    Parameters
    ----------
    study : Mapping or None
        The study's entry (the protocol file's or the summary's).
    brief : bool
        The planted rows' short form.

    Returns
    -------
    str
        The label.
    """
    st = study or {}
    design = find_design(st.get("design")) or PAIRED
    if st.get("lockstep"):
        design = study_design({**st, "design": design.analysed_as})
    return design.label(design.block_steps(st), "commands" in st, brief)
