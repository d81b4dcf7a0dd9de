"""One preregistered hypothesis, typed: what :mod:`analysis.decisions` tests.

Records carry the protocol's resolved ``hypotheses`` block as JSON (``tests``: one mapping per
hypothesis, :func:`harness.hypotheses.parse_hypotheses`); :meth:`Hypothesis.of` turns one into this
frozen object at that boundary, refusing keys it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Hypothesis:
    """A one-sided test of one endpoint of one (study, configuration)'s pairs.

    Attributes
    ----------
    endpoint
        ``training_time``, ``time_to_target``, ``total_time``, ``test_bpb`` or ``peak_memory``.
    estimand
        ``difference`` (``c - b``), ``log_ratio`` (``ln c - ln b``) or ``relative_reduction``
        (``100 (1 - c / b)``), candidate ``c`` against baseline ``b``.
    type
        ``superiority``, ``non_inferiority`` or ``equivalence`` (at ``margin``, in the estimand's units).
    better
        ``lower`` or ``higher``: which way the candidate is better.
    censoring, restriction_s
        Time to target only: ``worst_rank`` or ``restricted_mean`` (restricted at ``restriction_s``,
        by default each pair's shorter training time).
    period_adjusted
        Test the AB/BA period-adjusted mean instead of the plain mean.
    """

    id: str
    study: str
    config: str
    endpoint: str
    estimand: str
    type: str
    better: str
    margin: float = 0.0
    censoring: str | None = None
    period_adjusted: bool = False
    restriction_s: float | None = None

    @classmethod
    def of(cls, h: Hypothesis | Mapping[str, Any]) -> Hypothesis:
        if isinstance(h, Hypothesis):
            return h
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(h) - known)
        if unknown:
            raise ValueError(f"hypothesis {h.get('id')!r}: unknown keys {', '.join(unknown)}")
        margin, tau = h.get("margin", 0.0), h.get("restriction_s")
        return cls(
            **{
                **{k: v for k, v in h.items() if k in known},
                "margin": float(margin or 0.0),
                "restriction_s": None if tau is None else float(tau),
                "period_adjusted": bool(h.get("period_adjusted", False)),
            }
        )
