"""What a design is: the :class:`Design` interface every design implements (standard library only).

A design says how a study's units are made and analysed: the runs of one unit and their roles, the
order of each unit's runs (its schedule), the word in a unit's id, what it is analysed as (the name
its records' ``spec.design`` and the summary's study carry), the fields it adds to a run's spec and
to the protocol summary, and its label on the page. Code asks the design
(:func:`prereg.designs.registry.study_design`) instead of comparing its name.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

__all__ = [
    "BASELINE_FIRST",
    "CANDIDATE_FIRST",
    "OWN_NAME_FROM_SCHEMA",
    "STEPS_SECOND",
    "Design",
    "Planned",
    "Rng",
    "study_arms",
]

#: A seeded random source for one unit's order: ``rng(*parts)`` is a ``random.Random`` seeded by
#: the protocol's ``order_seed`` and ``parts`` (``prereg.plan``).
Rng = Callable[..., random.Random]


def study_arms(study: Mapping[str, object]) -> list[object]:
    """A study's ``arms`` (a list in the protocol file and in the summary)."""
    arms = study["arms"]
    if not isinstance(arms, (list, tuple)):
        raise ValueError(f"study {study.get('name')}: arms is not a list: {arms!r}")
    return list(arms)


class Planned(Protocol):
    """What a design reads of a study it plans: the typed study of the protocol file
    (:class:`prereg.protocol.model.Study`)."""

    @property
    def name(self) -> str: ...  # noqa: D102

    @property
    def arms(self) -> object: ...  # noqa: D102

    @property
    def factors(self) -> dict[str, object] | None: ...  # noqa: D102

    @property
    def cells(self) -> dict[str, object] | None: ...  # noqa: D102

    @property
    def block_steps(self) -> int | None: ...  # noqa: D102


#: A pair's two orders of roles.
BASELINE_FIRST: tuple[str, ...] = ("baseline", "candidate")
CANDIDATE_FIRST: tuple[str, ...] = ("candidate", "baseline")
#: A schedule's marker of an order whose second run steps first (a design whose runs take turns).
STEPS_SECOND = "steps-second"
#: The records schema (``prereg/formats/record.py``'s format log) from which a plan and its protocol summary
#: name a design by its own name (``design: lockstep``); a study written under an earlier schema
#: names what it is analysed as (``design: paired``), and its plan is recomputed so, byte for byte.
OWN_NAME_FROM_SCHEMA = 6


class Design(ABC):
    """A design: how a study's units are planned, run and analysed (a subclass gives ``roles`` and
    ``orders``, sets the attributes, and overrides what differs from a pair in its own process).

    Attributes
    ----------
    name : str
        The name a protocol's ``design`` key gives it (the registry's key).
    analysed_as : str
        The design its units are analysed as (a lockstep pair is analysed as a pair: ``paired``):
        the name a study's records' ``spec.design`` and the summary's study ``design`` carried
        before records schema :data:`OWN_NAME_FROM_SCHEMA` (:meth:`recorded_as`).
    unit : str
        The word in a unit's id (``<study>.<config>.<unit><i>``): ``pair`` or ``block``.
    pairwise : bool
        Whether a unit is a pair of a baseline and a candidate run, analysed by the paired
        statistics (per-pair log ratios); otherwise a block of cells (the factorial effects).
    shares_process : bool
        Whether a unit's runs train together, taking turns in blocks of ``block_steps``.
    """

    name: str = ""
    analysed_as: str = ""
    unit: str = "pair"
    pairwise: bool = True
    shares_process: bool = False

    def recorded_as(self, schema: int) -> str:
        """The name a plan and its protocol summary give this design under records schema ``schema``.

        Parameters
        ----------
        schema : int
            The records schema the study is written under (its records' ``schema_version``).

        Returns
        -------
        str
            :attr:`name` from schema :data:`OWN_NAME_FROM_SCHEMA` on; :attr:`analysed_as` before.
        """
        return self.name if schema >= OWN_NAME_FROM_SCHEMA else self.analysed_as

    def unit_id(self, study: str, config: str, index: int) -> str:
        """A unit's id, ``<study>.<config>.<unit><i>`` (:attr:`unit`; ``i`` the seed index, three digits)."""
        return f"{study}.{config}.{self.unit}{index:03d}"

    def unit_index(self, unit: str) -> int:
        """The seed index a unit's id (:meth:`unit_id`) ends with; ValueError naming the id when it
        does not end with this design's unit word and an index."""
        last = unit.rsplit(".", 1)[-1]
        digits = last[len(self.unit) :] if last.startswith(self.unit) else ""
        if not digits.isascii() or not digits.isdigit():
            raise ValueError(f"unit {unit!r} is not a {self.name} study's {self.unit}<i>")
        return int(digits)

    def runs_per_unit(self, study: Mapping[str, object]) -> int:
        """The runs of one unit of ``study`` (a protocol's study or the summary's).

        Parameters
        ----------
        study : Mapping
            The study's entry, as the protocol file or the protocol summary holds it.

        Returns
        -------
        int
            Two for a pair; one per cell for a block.
        """
        return len(self.roles(study))

    @abstractmethod
    def roles(self, study: Mapping[str, object], arms: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """``(role, arm)`` of each run of a unit, in the design's standard order.

        Parameters
        ----------
        study : Mapping
            The study's entry (the summary's form for a factorial's declared cells).
        arms : Sequence of str, optional
            The arms in role order, in place of the study's ``arms`` (a command study's roles).

        Returns
        -------
        list of (str, str)
            Each role and the arm that runs it.
        """
        raise NotImplementedError

    @abstractmethod
    def orders(self, study: Planned, config: str, n: int, rng: Rng) -> list[tuple[str, ...]]:
        """The schedule: one order of a unit's roles per seed, for one configuration.

        Parameters
        ----------
        study : Planned
            The typed study of the protocol file.
        config : str
            The configuration.
        n : int
            The number of seeds (units).
        rng : callable
            The plan's seeded random source (:data:`Rng`).

        Returns
        -------
        list of tuple of str
            ``n`` orders of roles; a design may add a marker the plan reads
            (``steps-second``: the second run of a lockstep pair steps first).
        """
        raise NotImplementedError

    def arm_of(self, study: Planned, role: str, arms: Sequence[str]) -> str:
        """The arm that runs ``role`` (of ``arms``, in role order) in a unit of the typed ``study``."""
        return dict(self.roles({}, arms))[role]

    def run_fields(
        self, study: Planned, unit: str, roles: Sequence[str], pos: int, second: bool
    ) -> dict[str, object]:
        """The fields this design adds to a planned run's spec (none by default)."""
        return {}

    def summary_fields(self, study: Planned) -> dict[str, object]:
        """The fields this design adds to the protocol summary's study (none by default)."""
        return {}

    def summary_arms(self, study: Planned, arms: Sequence[object] | None) -> Sequence[object] | None:
        """The protocol summary's ``arms`` of ``study`` (the protocol file's, or a command study's
        roles, as ``arms``)."""
        return arms

    def block_steps(self, study: Mapping[str, object]) -> int | None:
        """The steps of each turn when a unit's runs share a process, in either form a study is
        held (the protocol file's ``block_steps``, the summary's ``lockstep.block_steps``); else None."""
        return None

    def label(self, block_steps: int | None = None, commands: bool = False, brief: bool = False) -> str:
        """The design in words, for the page.

        Parameters
        ----------
        block_steps : int, optional
            The steps of each turn (a design whose runs share a process).
        commands : bool
            Whether the study's arms are commands (two processes taking turns).
        brief : bool
            The short form of the planted studies' rows (``lockstep, blocks of 10``).

        Returns
        -------
        str
            E.g. ``a process per arm``.
        """
        return "a process per arm"
