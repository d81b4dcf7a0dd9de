"""The paired design: a baseline and a candidate run, each in its own process, in a balanced random
order (half the pairs run the baseline first)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prereg.designs.base import BASELINE_FIRST, CANDIDATE_FIRST, Design, Planned, Rng, study_arms

__all__ = ["PAIRED", "Paired"]


class Paired(Design):
    """A pair of runs, a process per arm; analysed by the paired statistics."""

    name = "paired"
    analysed_as = "paired"
    unit = "pair"
    pairwise = True

    def roles(self, study: Mapping[str, object], arms: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """``baseline`` runs the first arm, ``candidate`` the second."""
        a = [str(x) for x in study_arms(study)] if arms is None else arms
        return [("baseline", a[0]), ("candidate", a[1])]

    def runs_per_unit(self, study: Mapping[str, object]) -> int:
        """Two runs a pair."""
        return 2

    def orders(self, study: Planned, config: str, n: int, rng: Rng) -> list[tuple[str, ...]]:
        """Half the pairs (rounded up) baseline first, the rest candidate first, shuffled by
        ``rng(study, config)``."""
        seq = [BASELINE_FIRST] * ((n + 1) // 2) + [CANDIDATE_FIRST] * (n // 2)
        rng(study.name, config).shuffle(seq)
        return seq


#: The paired design.
PAIRED = Paired()
