"""The lockstep design: both runs of a pair at once, taking turns in blocks of ``block_steps`` steps
(built-in arms in one process, command arms as two processes over a socket pair); analysed as a
pair. Its orders cross the build order with who steps first, all four per group of four pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prereg.designs.base import BASELINE_FIRST, CANDIDATE_FIRST, STEPS_SECOND, Planned, Rng
from prereg.designs.paired import Paired

__all__ = ["LOCKSTEP", "Lockstep"]


class Lockstep(Paired):
    """A pair whose two runs take turns, analysed as a pair; its records say ``spec.design: lockstep``
    (``paired`` before records schema 6: :meth:`~prereg.designs.base.Design.recorded_as`)."""

    name = "lockstep"
    analysed_as = "paired"
    shares_process = True

    def orders(self, study: Planned, config: str, n: int, rng: Rng) -> list[tuple[str, ...]]:
        """Both build orders crossed with who steps first, each group of four shuffled by
        ``rng(study, config, "lockstep", g)``."""
        combos = [
            BASELINE_FIRST,
            BASELINE_FIRST + (STEPS_SECOND,),
            CANDIDATE_FIRST,
            CANDIDATE_FIRST + (STEPS_SECOND,),
        ]
        seq: list[tuple[str, ...]] = []
        for g in range(0, n, 4):
            group = list(combos)
            rng(study.name, config, "lockstep", g).shuffle(group)
            seq.extend(group[: min(4, n - g)])
        return seq

    def run_fields(
        self, study: Planned, unit: str, roles: Sequence[str], pos: int, second: bool
    ) -> dict[str, object]:
        """A lockstep run's block, its partner and whether it steps first."""
        return {
            "block_steps": study.block_steps,
            "partner": f"{unit}.{roles[1 - pos]}",
            "steps_first": pos == (1 if second else 0),
        }

    def summary_fields(self, study: Planned) -> dict[str, object]:
        """``lockstep: {block_steps: N}``, which tells a lockstep study's summary from a pair's."""
        return {"lockstep": {"block_steps": study.block_steps}}

    def block_steps(self, study: Mapping[str, object]) -> int | None:
        """The protocol file's ``block_steps``, or the summary's ``lockstep.block_steps``."""
        lock = study.get("lockstep")
        n = lock.get("block_steps") if isinstance(lock, Mapping) else study.get("block_steps")
        return n if isinstance(n, int) else None

    def label(self, block_steps: int | None = None, commands: bool = False, brief: bool = False) -> str:
        """``lockstep, blocks of N`` (brief); else who takes turns, and in blocks of how many steps."""
        if brief:
            return f"lockstep, blocks of {block_steps}"
        steps = f"{block_steps} step" + ("s" if block_steps != 1 else "")
        if commands:
            return f"lockstep, two processes (one per arm) taking turns in blocks of {steps}"
        return f"lockstep, both arms in one process, alternating blocks of {steps}"


#: The lockstep design.
LOCKSTEP = Lockstep()
