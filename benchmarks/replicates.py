"""Coverage of the replicate model's interval under between-replicate variance, by simulation.

Each simulated study has ``k`` replicates of ``n`` pairs. Replicate ``r``'s pairs have log-time
differences (in points, ``100 ln(T_c / T_b)``)

    d_ri = mu + u_r + e_ri,    u_r ~ N(0, tau^2),    e_ri ~ N(0, sd^2),

``u_r`` the effect's shift in replicate ``r`` (another time, another machine), so the effect a
study should cover is the mean ``mu`` over times, not the effect of one stretch. For each
``tau`` (a multiple of the within-replicate standard error ``sd / sqrt(n)``) it reports the
coverage of three intervals of ``mu`` at ``--level``, with Monte-Carlo standard errors
(``sqrt(p (1 - p) / studies)``):

* ``hksj``: the replicate model (:func:`prereg.replicates.random_effects`: DerSimonian-Laird's
  ``tau^2`` with the Hartung-Knapp-Sidik-Jonkman interval at ``t_{k-1}``), what the summary reports;
* ``dl``: DerSimonian-Laird's own interval, ``mu -/+ z sqrt(1 / sum w*)``;
* ``pooled``: the plain paired t interval of all ``k n`` pairs, replicates ignored (what a study
  without replicates reports).

    python benchmarks/replicates.py --studies 2000 --replicates 3 --pairs 8

``--split FOLDER`` instead cuts a committed study's pairs (each paired study and configuration of
its ``summary.json``), in run order, into ``--replicates`` consecutive slices, as a replicated
protocol would have run them, and prints per clock the pooled interval's half-width beside the
replicates' table's (HKSJ) and the decision's (the equal-weight t of the replicates' means), at
``--level``:

    python benchmarks/replicates.py --split records/cpu2 --replicates 3 --level 0.99

``--decision`` prints the one-sided type-I error (nominal ``--alpha``) of the two tests a
replicated protocol could decide with, at no spread and at a spread between replicates: the
HKSJ t (the replicates' table's precision-weighted mean) and the equal-weight t of the
replicates' estimates, ``k - 1`` degrees of freedom (what ``prereg.hypotheses`` decides with):

    python benchmarks/replicates.py --decision --studies 20000

Figures are proportions, not timings: a loaded machine changes only how long it takes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from statistics import NormalDist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prereg.descriptive import mean_interval, mean_se  # noqa: E402
from prereg.replicates import random_effects, replicate_estimates  # noqa: E402
from prereg.tdist import student_t_sf_signed  # noqa: E402
from prereg.ttests import t_result  # noqa: E402


def simulate(
    studies: int, k: int, n: int, sd: float, tau: float, level: float, seed: int
) -> dict[str, float]:
    """The coverage of each interval over ``studies`` simulated studies (true mean 1.0)."""
    rng = random.Random(seed)
    z = NormalDist().inv_cdf((1 + level) / 2)
    mu = 1.0
    hit = {"hksj": 0, "dl": 0, "pooled": 0}
    width = {"hksj": 0.0, "dl": 0.0, "pooled": 0.0}
    for _ in range(studies):
        values = {
            r: [mu + u + rng.gauss(0, sd) for _ in range(n)]
            for r in range(1, k + 1)
            for u in [rng.gauss(0, tau)]
        }
        _, ys, vs = replicate_estimates(values)
        re = random_effects(ys, vs, level)
        ws = [1.0 / (v + re["tau"] ** 2) for v in vs]
        dl_half = z / math.sqrt(math.fsum(ws))
        pooled = mean_interval([x for r in values for x in values[r]], level)
        for name, lo, hi in (
            ("hksj", re["lo"], re["hi"]),
            ("dl", re["mean"] - dl_half, re["mean"] + dl_half),
            ("pooled", pooled.low, pooled.high),
        ):
            hit[name] += lo <= mu <= hi
            width[name] += hi - lo
    return {
        **{f"{m}_coverage": hit[m] / studies for m in hit},
        **{f"{m}_width": width[m] / studies for m in hit},
    }


def cell(got: dict[str, float], m: str, studies: int) -> str:
    """A coverage with its Monte-Carlo SE, and the mean width."""
    p = got[f"{m}_coverage"]
    return f"{100 * p:.1f}% ({100 * math.sqrt(p * (1 - p) / studies):.1f}), width {got[m + '_width']:.2f}"


def split(folder: Path, k: int, level: float) -> int:
    """Each paired study and configuration of ``folder``'s summary.json, its pairs in run order cut
    into ``k`` consecutive slices: the pooled, the replicates' table's (HKSJ) and the decision's
    (equal-weight t) half-widths, in points."""
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    print(f"{folder}: pairs in run order cut into {k} replicates; half-widths at {level:.0%}, points")
    print(
        "| study | configuration | clock | pairs | pooled half-width | replicate means | tau "
        "| HKSJ half-width (the table) | equal-weight t half-width (the decision) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for study in summary["studies"]:
        for cfg in study["configs"]:
            pairs = sorted(cfg.get("pairs") or [], key=lambda p: p["order"])
            for clock, key in (("wall", "training_s"), ("CPU", "training_cpu_s")):
                d = [
                    100 * math.log(p[f"candidate_{key}"] / p[f"baseline_{key}"])
                    for p in pairs
                    if p.get(f"candidate_{key}") and p.get(f"baseline_{key}")
                ]
                if len(d) < 2 * k:
                    continue
                pooled = mean_interval(d, level)
                n = len(d)
                _, ys, vs = replicate_estimates({r: d[r * n // k : (r + 1) * n // k] for r in range(k)})
                re = random_effects(ys, vs, level)
                equal = mean_interval(ys, level)
                means = ", ".join(f"{y:+.2f}" for y in ys)
                print(
                    f"| {study['name']} | {cfg['config']} | {clock} | {n} | {(pooled.high - pooled.low) / 2:.2f} "
                    f"| {means} | {re['tau']:.2f} | {(re['hi'] - re['lo']) / 2:.2f} "
                    f"| {(equal.high - equal.low) / 2:.2f} |"
                )
    return 0


def type_one(studies: int, k: int, n: int, tau: float, alpha: float, seed: int) -> dict[str, float]:
    """How often each one-sided test rejects ``mu <= 0`` when ``mu = 0`` (within-pair SD 1)."""
    rng = random.Random(seed)
    hits = {"hksj": 0, "equal": 0}
    for _ in range(studies):
        values = {r: [u + rng.gauss(0, 1.0) for _ in range(n)] for r in range(k) for u in [rng.gauss(0, tau)]}
        _, ys, vs = replicate_estimates(values)
        re = random_effects(ys, vs, 0.95)
        m, se = mean_se(ys)  # the decision's own rule: prereg.hypotheses._replicates_estimate
        hits["hksj"] += re["se"] > 0 and student_t_sf_signed(re["mean"] / re["se"], k - 1) < alpha
        hits["equal"] += se > 0 and t_result("t-replicates", k * n, m, se, k - 1, (0.0, None)).p_value < alpha
    return {name: h / studies for name, h in hits.items()}


def decision(studies: int, alpha: float, seed: int) -> int:
    """The type-I error table of ``--decision``."""
    mc = math.sqrt(alpha * (1 - alpha) / studies)
    print(f"{studies} studies a row, one-sided alpha {alpha:g} (Monte-Carlo SE {mc:.4f}), within-pair SD 1")
    print("| replicates | pairs each | tau | HKSJ t (precision-weighted) | equal-weight t (the decision) |")
    print("|---|---|---|---|---|")
    for i, (k, n, tau) in enumerate(
        [(3, 4, 0.0), (3, 6, 0.0), (3, 20, 0.0), (6, 4, 0.0), (6, 20, 0.0), (3, 6, 0.5), (6, 20, 0.2)]
    ):
        got = type_one(studies, k, n, tau, alpha, seed + i)
        print(f"| {k} | {n} | {tau:g} | {got['hksj']:.4f} | {got['equal']:.4f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=2000)
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=8, help="pairs per replicate")
    ap.add_argument(
        "--sd", type=float, default=1.0, help="within-replicate SD of a pair's difference, points"
    )
    ap.add_argument("--taus", default="0,1,2,4", help="between-replicate SDs, in within-replicate SEs")
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--split", type=Path, help="a records folder: its pairs cut into replicates")
    ap.add_argument("--decision", action="store_true", help="the type-I error of the two tests")
    ap.add_argument("--alpha", type=float, default=0.025)
    a = ap.parse_args(argv)
    if a.split:
        return split(a.split, a.replicates, a.level)
    if a.decision:
        return decision(a.studies, a.alpha, a.seed)
    se = a.sd / math.sqrt(a.pairs)
    rows = []
    print(
        f"{a.studies} studies of {a.replicates} replicates x {a.pairs} pairs, within-pair SD {a.sd:g} points, "
        f"nominal {a.level:.0%}; coverage (Monte-Carlo SE) and mean width"
    )
    print("| tau / SE | HKSJ (the replicate model) | DL, normal | pooled t, replicates ignored |")
    print("|---|---|---|---|")
    for i, mult in enumerate(float(x) for x in a.taus.split(",")):
        got = simulate(a.studies, a.replicates, a.pairs, a.sd, mult * se, a.level, a.seed + i)
        rows.append({"tau_over_se": mult, **got})

        print(
            f"| {mult:g} | {cell(got, 'hksj', a.studies)} | {cell(got, 'dl', a.studies)} | {cell(got, 'pooled', a.studies)} |"
        )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
