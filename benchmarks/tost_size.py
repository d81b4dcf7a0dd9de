"""How many pairs and truth runs an equivalence test of a design's bias needs, from a calibration's
own spread.

A design's bias on a plant is ``D = mean(pairs) - mean(truth runs)`` (points of the log ratio of
the after-own CPU time, ``prereg/planted.py``'s ``_against_truth``). Equivalence within ``+-delta``
is shown by two one-sided tests at ``alpha`` (TOST), that is when the ``1 - 2 alpha`` interval
``D +- z_(1-alpha) se`` lies inside ``+-delta``, with ``se = sqrt(sd_p^2 / n_p + sd_t^2 / n_t)``.
With the normal approximation its power at a true bias ``b`` is::

    Phi((delta - b) / se - z) - Phi((-delta - b) / se + z),   z = z_(1 - alpha)

so at ``b = 0`` and power ``1 - beta`` it needs ``se = delta / (z_(1-alpha) + z_(1-beta/2))``
(both tails: the interval must clear both bounds), and with as many truth runs as pairs
``n = (sd_p^2 + sd_t^2) / se^2``. The spreads ``sd_p`` (a pair's after-own log ratio) and ``sd_t``
(a truth run's) are read from the calibration's ``summary.json``.

    python benchmarks/tost_size.py records/calibration-classes records/calibration-classes-loaded
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

NORMAL = statistics.NormalDist()


def power(delta: float, se: float, bias: float = 0.0, alpha: float = 0.05) -> float:
    """TOST's chance of showing ``|bias| < delta`` (normal approximation; see the module)."""
    z = NORMAL.inv_cdf(1 - alpha)
    return max(0.0, NORMAL.cdf((delta - bias) / se - z) - NORMAL.cdf((-delta - bias) / se + z))


def needed(delta: float, sd_p: float, sd_t: float, target: float = 0.8, alpha: float = 0.05) -> int:
    """Pairs (and as many truth runs) for TOST power ``target`` at a true bias of 0."""
    se = delta / (NORMAL.inv_cdf(1 - alpha) + NORMAL.inv_cdf(1 - (1 - target) / 2))
    return math.ceil((sd_p**2 + sd_t**2) / se**2)


def spreads(summary: dict, plant: str) -> tuple[float, float, int, int] | None:
    """``sd_p``, ``sd_t`` (points) and their counts for ``plant``'s lockstep-1 and truth studies."""
    by = {st["name"]: st["configs"][0]["pairs"] for st in summary["studies"] if st.get("configs")}
    pairs, truth = by.get(f"{plant}_lockstep1"), by.get(f"{plant}_truth")
    if not pairs or not truth or len(pairs) < 2 or len(truth) < 2:
        return None
    p = [100 * math.log(x["candidate_own_step_cpu_us"] / x["baseline_own_step_cpu_us"]) for x in pairs]
    t = [100 * math.log(x["candidate_on_cpu_us"] / x["candidate_off_cpu_us"]) for x in truth]
    return statistics.stdev(p), statistics.stdev(t), len(p), len(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="calibration records folders (their summary.json)")
    ap.add_argument("--margins", default="0.2,0.5", help="equivalence margins, points")
    ap.add_argument("--at", type=int, default=100, help="the pairs (= truth runs) whose power is shown")
    a = ap.parse_args(argv)
    margins = [float(x) for x in a.margins.split(",")]
    head = " | ".join(f"n for +-{m} (80%) | power at {a.at}, +-{m}" for m in margins)
    print(f"| calibration | plant | sd pair | sd truth | {head} |")
    print("|---" * (4 + 2 * len(margins)) + "|")
    for folder in a.folders:
        summary = json.loads((Path(folder) / "summary.json").read_text())
        names = sorted({st["name"].rsplit("_", 1)[0] for st in summary["studies"]})
        for plant in names:
            s = spreads(summary, plant)
            if s is None:
                continue
            sd_p, sd_t, n_p, n_t = s
            se_at = math.sqrt((sd_p**2 + sd_t**2) / a.at)
            cells = " | ".join(f"{needed(m, sd_p, sd_t)} | {power(m, se_at):.2f}" for m in margins)
            print(f"| {Path(folder).name} | {plant} | {sd_p:.2f} ({n_p}) | {sd_t:.2f} ({n_t}) | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
