"""The family's multiplicity rules: from each hypothesis' test to its status and the alpha it used.

``fixed_sequence`` (a hierarchy) and ``holm`` (Holm, 1979, *Scand. J. Statist.* 6:65), as
:func:`analysis.decisions.decide` applies them; ``analysis/public_audit.py`` re-implements both.
A hypothesis is established when its test passes at its alpha (:func:`analysis.ttests.passes`).
"""

from __future__ import annotations

from analysis.preregistration import Hypothesis
from analysis.ttests import TestResult, passes

__all__ = ["Tested", "Verdicts", "fixed_sequence", "holm"]

#: A hypothesis, its test (None where it is not reached), why not, and the unreached counts.
Tested = tuple[Hypothesis, TestResult | None, str | None, dict[str, int] | None]
#: Per hypothesis id: (status, reason) and the alpha its test used (None: not tested).
Verdicts = tuple[dict[str, tuple[str, str | None]], dict[str, float | None]]


def fixed_sequence(tested: list[Tested], alpha: float) -> Verdicts:
    """Each hypothesis in order at ``alpha``; after the first one not established, the rest are not reached."""
    status: dict[str, tuple[str, str | None]] = {}
    used: dict[str, float | None] = {}
    failed = None
    for h, t, why, _ in tested:
        if failed is not None:
            status[h.id] = ("not reached", f"a failed prerequisite in the hierarchy: {failed}")
            used[h.id] = None
        elif t is None:
            status[h.id], used[h.id] = ("not reached", why), alpha
            failed = h.id
        else:
            used[h.id] = alpha
            ok = passes(t, alpha)
            status[h.id] = ("established" if ok else "not established", None)
            failed = None if ok else h.id
    return status, used


def holm(tested: list[Tested], alpha: float) -> Verdicts:
    """Holm's step-down procedure: ascending p (a hypothesis not reached counts as p = 1, ties in protocol
    order), the k-th (from 0) at ``alpha / (m - k)``, stopping at the first one not established."""
    status: dict[str, tuple[str, str | None]] = {}
    used: dict[str, float | None] = {}
    m = len(tested)
    p = [t.p_value if t is not None else 1.0 for _, t, _, _ in tested]
    stopped = False
    for k, i in enumerate(sorted(range(m), key=lambda i: (p[i], i))):
        h, t, why, _ = tested[i]
        a = alpha / (m - k)
        used[h.id] = a
        if t is None:
            status[h.id] = ("not reached", why)
            stopped = True
        elif stopped:
            status[h.id] = ("not established", "Holm's procedure stopped at an earlier hypothesis")
        else:
            ok = passes(t, a)
            status[h.id] = ("established" if ok else "not established", None)
            stopped = not ok
    return status, used
