"""Sample sizes from pilots: the noise of paired differences, measured on A/A pairs only.

A pilot's A/A pairs (baseline against itself, same seed) measure how much two runs of one arm
differ on a device without showing any candidate outcome. For each hypothesis of a target
protocol this module prints the pairs needed for 80% and 90% power at the hypothesis' level and
margin, and the interval's half-width at the planned number of pairs. Never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats as _st

from analysis.decisions import ENDPOINT_KEYS
from analysis.stats import paired_values


@dataclass(frozen=True)
class Noise:
    """Standard deviation of per-pair values on one endpoint, from the pilot's A/A pairs.

    Attributes
    ----------
    sd : float
        Sample standard deviation (denominator ``n - 1``) of the A/A per-pair values.
    pairs : int
        A/A pairs it comes from (``df = pairs - 1``).
    identical : bool
        Every A/A pair was bitwise identical on this endpoint (same seed, same arithmetic): the
        pilot then bounds the noise by the seed-to-seed spread instead (``sd`` is that, times
        ``sqrt(2)``: two independent runs), a conservative planning value for a candidate whose
        arithmetic differs.
    """

    sd: float
    pairs: int
    identical: bool


def aa_noise(records: list[dict[str, Any]], endpoint: str, estimand: str) -> dict[str, Noise]:
    """Per configuration, the noise of ``endpoint`` from the A/A pairs (both arms the same) in ``records``."""
    key = ENDPOINT_KEYS[endpoint]
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        s = r["spec"]
        if r["status"] != "ok" or s["design"] != "paired":
            continue
        st = next(x for x in r["protocol"]["studies"] if x["name"] == s["study"])
        if st["arms"][0] != st["arms"][1]:
            continue  # only A/A pairs: no candidate outcome is ever read
        by.setdefault(s["config"], {}).setdefault(s["unit"], {})[s["role"]] = r
    out = {}
    for config, units in by.items():
        b, c = [], []
        for arms in units.values():
            if len(arms) == 2:
                x, y = (_value(arms[role], key) for role in ("baseline", "candidate"))
                if x is not None and y is not None:
                    b.append(x)
                    c.append(y)
        if len(b) < 2:
            continue
        v = paired_values(b, c, estimand)
        sd = _sd(v)
        identical = all(x == 0 for x in v)
        if identical:
            sd = _sd(b) * math.sqrt(2.0) if estimand == "difference" else _sd([math.log(x) for x in b]) * math.sqrt(2.0)
        out[config] = Noise(sd, len(b), identical)
    return out


def _value(rec: dict[str, Any], key: str) -> float | None:
    if key in ("test_bpb",):
        return rec.get("test_bpb")
    if key == "peak_memory_bytes":
        mem = rec.get("memory") or {}
        return mem.get(mem.get("primary")) if mem.get("primary") else None
    return (rec.get("timings") or {}).get(key)


def _sd(v: list[float]) -> float:
    m = math.fsum(v) / len(v)
    return math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1))


def power(n: int, sd: float, alpha: float, kind: str, margin: float, effect: float) -> float:
    """Power of the one-sided paired t test with ``n`` pairs.

    Notes
    -----
    ``effect`` is the assumed true mean in the favourable direction (``s * mean`` of
    :mod:`analysis.decisions`). The test statistic is noncentral t with ``df = n - 1`` and
    noncentrality ``(effect - d) sqrt(n) / sd`` (superiority, ``d`` the margin) or
    ``(effect + d) sqrt(n) / sd`` (non-inferiority); power ``P(T' > t_{1-alpha, n-1})``. For
    equivalence (TOST at ``effect = 0``) ``2 P(T' > t) - 1`` with ``T'`` noncentral at ``d sqrt(n) / sd``.
    """
    df = n - 1
    crit = float(_st.t.ppf(1 - alpha, df))
    if kind == "superiority":
        nc = (effect - margin) * math.sqrt(n) / sd
    else:
        nc = (effect + margin) * math.sqrt(n) / sd
    p = float(_st.nct.sf(crit, df, nc))
    return max(0.0, 2 * p - 1) if kind == "equivalence" else p


def pairs_needed(sd: float, alpha: float, kind: str, margin: float, effect: float, target: float,
                 cap: int = 100_000) -> int | None:
    """Smallest ``n >= 3`` whose :func:`power` reaches ``target`` (``None`` if none up to ``cap``)."""
    if sd == 0:
        return 3
    lo, hi = 3, 3
    while power(hi, sd, alpha, kind, margin, effect) < target:
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if power(mid, sd, alpha, kind, margin, effect) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Plan:
    id: str
    config: str
    endpoint: str
    sd: float
    pilot_pairs: int
    identical_in_pilot: bool
    alpha: float
    margin: float
    effect: float
    planned_pairs: int
    n80: int | None
    n90: int | None
    power_at_planned: float
    half_width_at_planned: float
    detectable_at_planned: float  # smallest true effect 80% power detects with the planned pairs

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(pilot_records: list[dict[str, Any]], target: dict[str, Any], effects: dict[str, float]) -> list[Plan]:
    """Per hypothesis of ``target`` (a protocol summary), the pairs needed for 80% and 90% power.

    The level is the family's alpha under a fixed sequence, ``alpha / m`` under Holm (its first,
    strictest step). The assumed true effect is 0 for non-inferiority and equivalence, and for
    superiority the value given in ``effects`` (by hypothesis id; default 0, which no number of
    pairs can establish, so the line then reports the smallest effect 80% power detects at the
    planned n). Time to target is planned with a t test on the log ratio; the signed-rank test
    the protocol runs needs about 1/0.955 as many pairs (its asymptotic relative efficiency).
    """
    spec = target["hypotheses"]
    if "descriptive" in spec:
        return []
    m = len(spec["tests"])
    alpha = spec["family_alpha"] if spec["procedure"] == "fixed_sequence" else spec["family_alpha"] / m
    out = []
    for h in spec["tests"]:
        noise = aa_noise(pilot_records, h["endpoint"], h["estimand"]).get(h["config"])
        if noise is None:
            continue
        st = next(s for s in target["studies"] if s["name"] == h["study"])
        n_plan = len(st["seeds"])
        effect = effects.get(h["id"], 0.0)
        kind, margin = h["type"], h["margin"]
        n80 = pairs_needed(noise.sd, alpha, kind, margin, effect, 0.8)
        n90 = pairs_needed(noise.sd, alpha, kind, margin, effect, 0.9)
        hw = float(_st.t.ppf(1 - alpha, n_plan - 1)) * noise.sd / math.sqrt(n_plan)
        mde = margin + (float(_st.t.ppf(1 - alpha, n_plan - 1)) + float(_st.t.ppf(0.8, n_plan - 1))) * noise.sd \
            / math.sqrt(n_plan)
        out.append(Plan(h["id"], h["config"], h["endpoint"], noise.sd, noise.pairs, noise.identical, alpha, margin,
                        effect, n_plan, n80, n90, power(n_plan, noise.sd, alpha, kind, margin, effect)
                        if noise.sd > 0 else 1.0, hw, mde))
    return out
