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

``--spread A B`` estimates the spread of one planted effect between two machines (or sessions)
from two calibrations that planted the same spin (``--plant``, default the 2% spin of lockstep at
blocks of 1, CPU clock): the two estimates' difference less their own sampling variance,
``tau^2 = ((y_A - y_B)^2 - se_A^2 - se_B^2) / 2`` (one degree of freedom), and ``tau`` over the
estimates' mean, the spread as a share of the effect:

    python benchmarks/replicates.py --spread records/calibration-cpu records/calibration-cpu-coverage

``--reach FOLDER`` gives the chance that every configuration of a committed study reaches a
decision half-width of at most ``--target`` points at ``--level`` with ``--replicates`` replicates
of ``--pairs`` pairs each: each simulated replicate's estimate is the mean of ``--pairs`` pairs drawn
with replacement from the study's own CPU-clock log ratios plus a shift ``N(0, (s |e|)^2)``, ``e`` the
configuration's effect and ``s`` each share of ``--shares`` (``--spread``'s), and the half-width is
the decision's, ``t_{k-1} sd(y) / sqrt(k)`` (seeded; ``--studies`` a cell):

    python benchmarks/replicates.py --reach records/cpu2 --level 0.99 --shares 0.05,0.073,0.1,0.15,0.2 --designs 3x40,6x20,8x16,10x12 --studies 4000

``--skew`` gives the one-sided type-I error of the decision's t over ``k`` replicates (3 to 6, and 10) when
the replicates' shifts are skewed: standardized exponential or lognormal (sigma 1) shifts, in
both directions, with SD ``tau`` (a multiple of the within-replicate SE), against normal shifts,
each at a nominal ``--alpha`` (the decision is one-sided: the candidate faster):

    python benchmarks/replicates.py --skew --studies 40000 --alpha 0.025

``--reached FOLDER`` reads a replicated study's sealed summary: per hypothesis decided by the t over
replicates, the estimate in points with its interval and half-width at ``--level`` (``t_{k-1}`` times
the decision's standard error, whatever level Holm's procedure tested it at), and per row of the
replicates' table the spread of the replicates' estimates (SD, the between-replicate ``tau``) and
their adjusted skewness G1 (``sqrt(k (k - 1)) / (k - 2) * m3 / m2^1.5``, scipy's
``stats.skew(bias=False)``; its standard error at ``k = 10`` is about 0.69):

    python benchmarks/replicates.py --reached records/cpu3 --level 0.99

Figures are proportions, not timings: a loaded machine changes only how long it takes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from statistics import NormalDist, stdev

from prereg.descriptive import mean_interval, mean_se  # noqa: E402
from prereg.replicates import random_effects, replicate_estimates  # noqa: E402
from prereg.tdist import student_t_ppf, student_t_sf_signed  # noqa: E402
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


PLANT = ("spin2p0_lockstep1", "CPU")


def spread(folders: list[Path], plant: tuple[str, str] = PLANT) -> dict[str, float]:
    """The between-machine spread of one planted effect read by two calibrations (``--spread``).

    Each calibration's ``planted`` row of study ``plant[0]`` and clock ``plant[1]`` gives its
    estimate ``y`` (points) and its 95% interval over ``pairs`` pairs, whose half-width over
    ``t_{pairs-1}`` is its standard error. The spread is the method of moments on the two
    estimates, ``tau^2 = max(0, ((y_A - y_B)^2 - se_A^2 - se_B^2) / 2)``, one degree of freedom.
    """
    rows = []
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        row = next(r for r in summary["planted"] if (r["study"], r["clock"]) == plant)
        cov = row.get("coverage") or {}
        n = int(cov.get("pairs_each", 0)) * int(cov.get("studies", 0))
        t = student_t_ppf((1 + row["level"]) / 2, n - 1)
        rows.append((row["estimate"], (row["estimate_hi"] - row["estimate_lo"]) / (2 * t), row["truth"]))
    (ya, sa, ta), (yb, sb, tb) = rows
    tau = math.sqrt(max(0.0, ((ya - yb) ** 2 - sa**2 - sb**2) / 2))
    raw = abs(ya - yb) / math.sqrt(2)
    mean = (ya + yb) / 2
    return {
        "y_a": ya,
        "se_a": sa,
        "truth_a": ta,
        "y_b": yb,
        "se_b": sb,
        "truth_b": tb,
        "sd_raw": raw,
        "tau": tau,
        "share": tau / mean,
        "share_raw": raw / mean,
    }


def reach(
    d_of: dict[str, list[float]],
    k: int,
    m: int,
    share: float,
    level: float,
    target: float,
    studies: int,
    seed: int,
) -> float:
    """The share of ``studies`` simulated studies in which every configuration's decision
    half-width is at most ``target`` (``--reach``; ``d_of``: each configuration's per-pair values)."""
    rng = random.Random(seed)
    t = student_t_ppf((1 + level) / 2, k - 1)
    effect = {c: math.fsum(d) / len(d) for c, d in d_of.items()}
    ok = 0
    for _ in range(studies):
        every = True
        for c, d in d_of.items():
            ys = [
                math.fsum(rng.choices(d, k=m)) / m + rng.gauss(0.0, share * abs(effect[c])) for _ in range(k)
            ]
            _, se = mean_se(ys)
            every = every and t * se <= target
        ok += every
    return ok / studies


def study_values(folder: Path, study: str = "pairs", key: str = "training_cpu_s") -> dict[str, list[float]]:
    """Each configuration's per-pair log ratios (points) of ``study`` in ``folder``'s summary.json."""
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    out = {}
    for st in (s for s in summary["studies"] if s["name"] == study):
        for cfg in st["configs"]:
            out[cfg["config"]] = [
                100 * math.log(p[f"candidate_{key}"] / p[f"baseline_{key}"])
                for p in cfg["pairs"]
                if p.get(f"candidate_{key}") and p.get(f"baseline_{key}")
            ]
    return out


def skewed(kind: str, rng: random.Random) -> float:
    """A standardized (mean 0, SD 1) draw: ``normal``, ``exp`` / ``-exp`` (exponential, skewness
    +2 / -2), ``lognormal`` / ``-lognormal`` (sigma 1, skewness about +6.2 / -6.2)."""
    sign = -1.0 if kind.startswith("-") else 1.0
    base = kind.lstrip("-")
    if base == "normal":
        return rng.gauss(0.0, 1.0)
    if base == "exp":
        return sign * (rng.expovariate(1.0) - 1.0)
    mean, sd = math.exp(0.5), math.sqrt((math.e - 1) * math.e)
    return sign * (rng.lognormvariate(0.0, 1.0) - mean) / sd


def skew_error(studies: int, k: int, n: int, tau: float, kind: str, alpha: float, seed: int) -> float:
    """The decision's one-sided type-I error (candidate faster: the mean below 0) at a true mean 0,
    replicate shifts ``tau * skewed(kind)``, within-pair SD 1, ``n`` pairs a replicate."""
    rng = random.Random(seed)
    hits = 0
    for _ in range(studies):
        ys = [tau * skewed(kind, rng) + rng.gauss(0.0, 1.0 / math.sqrt(n)) for _ in range(k)]
        m, se = mean_se(ys)
        hits += se > 0 and t_result("t-replicates", k * n, m, se, k - 1, (None, 0.0)).p_value < alpha
    return hits / studies


def skew_table(studies: int, alpha: float, seed: int) -> int:
    """The table of ``--skew``: rows of replicates and spread, columns the shifts' distributions."""
    kinds = ("normal", "exp", "-exp", "lognormal", "-lognormal")
    mc = math.sqrt(alpha * (1 - alpha) / studies)
    print(
        f"{studies} studies a cell, one-sided alpha {alpha:g} (Monte-Carlo SE {mc:.4f}); 20 pairs a replicate, "
        "within-pair SD 1; tau in within-replicate SEs; '-' shifts skewed towards the candidate's side"
    )
    print("| replicates | tau / SE | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    for i, (k, mult) in enumerate((k, mult) for k in (3, 4, 5, 6, 10) for mult in (1.0, 2.0, 4.0)):
        tau = mult / math.sqrt(20)
        cells = [
            skew_error(studies, k, 20, tau, kind, alpha, seed + 10 * i + j) for j, kind in enumerate(kinds)
        ]
        print(f"| {k} | {mult:g} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return 0


def reach_table(a: argparse.Namespace) -> int:
    """The table of ``--reach``."""
    d_of = {c: d for c, d in study_values(a.reach).items() if len(d) >= 20}
    print(
        f"{a.reach}: {', '.join(f'{c} {math.fsum(d) / len(d):+.2f} ({len(d)} pairs)' for c, d in d_of.items())}; "
        f"the chance that all reach a {level_pct(a.level)} decision half-width of at most {a.target:g} points "
        f"({a.studies} studies a cell)"
    )
    designs = [tuple(int(x) for x in s.split("x")) for s in a.designs.split(",")]
    print("| spread (share of the effect) | " + " | ".join(f"{k} x {m}" for k, m in designs) + " |")
    print("|---|" + "---|" * len(designs))
    for i, share in enumerate(float(x) for x in a.shares.split(",")):
        got = [
            reach(d_of, k, m, share, a.level, a.target, a.studies, a.seed + 100 * i + j)
            for j, (k, m) in enumerate(designs)
        ]
        print(f"| {share:g} | " + " | ".join(f"{g:.3f}" for g in got) + " |")
    return 0


def skewness(xs: list[float]) -> float:
    """Adjusted sample skewness G1 (scipy's ``stats.skew(bias=False)``); nan below 3 values."""
    k = len(xs)
    if k < 3:
        return math.nan
    m = sum(xs) / k
    m2 = sum((x - m) ** 2 for x in xs) / k
    m3 = sum((x - m) ** 3 for x in xs) / k
    return math.sqrt(k * (k - 1)) / (k - 2) * m3 / m2**1.5 if m2 > 0 else math.nan


def reached(folder: Path, level: float) -> int:
    """The half-widths a replicated study reached, and its replicates' spread and skew."""
    s = json.loads((folder / "summary.json").read_text())
    pct = level_pct(level)
    print(f"{folder}: decisions by the t over replicates, in points (100 ln(T_c / T_b)), at {pct}")
    print(f"| Hypothesis | Replicates | Estimate | {pct} interval | Half-width | Decision |")
    print("|---|---|---|---|---|---|")
    for d in s["hypotheses"]["decisions"]:
        t = d.get("test") or {}
        if t.get("method") != "t-replicates":
            continue
        half = 100 * student_t_ppf(0.5 + level / 2, t["df"]) * t["standard_error"]
        est = 100 * t["estimate"]
        print(
            f"| {d['id']} | {t['df'] + 1} | {est:+.2f} | {est - half:+.2f} to {est + half:+.2f} "
            f"| {half:.2f} | {d['status']} |"
        )
    print()
    print("Replicates' table (training time): each replicate's estimate, points")
    print("| Study | Configuration | Clock | Replicates | SD of the estimates | tau | G1 | Lowest, highest |")
    print("|---|---|---|---|---|---|---|---|")
    for r in s["replicates"]:
        ys = [e["estimate"] for e in r["replicates"]]
        sd = stdev(ys)
        print(
            f"| {r['study']} | {r['config']} | {r['clock']} | {len(ys)} | {sd:.3f} | {r['tau']:.3f} "
            f"| {skewness(ys):+.2f} | {min(ys):+.2f}, {max(ys):+.2f} |"
        )
    return 0


def level_pct(level: float) -> str:
    return f"{100 * level:g}%"


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
    ap.add_argument("--spread", type=Path, nargs=2, help="two calibrations' records folders")
    ap.add_argument(
        "--reach", type=Path, help="a records folder: the chance all configurations reach --target"
    )
    ap.add_argument("--target", type=float, default=0.5, help="--reach: the half-width, points")
    ap.add_argument(
        "--shares", default="0.05,0.073,0.1,0.15,0.2", help="--reach: spreads, shares of the effect"
    )
    ap.add_argument("--designs", default="3x40,6x20,8x16,10x12", help="--reach: replicates x pairs")
    ap.add_argument("--skew", action="store_true", help="the decision's error under skewed replicate shifts")
    ap.add_argument("--reached", type=Path, help="a replicated study's folder: half-widths reached, skew")
    a = ap.parse_args(argv)
    if a.reached:
        return reached(a.reached, a.level)
    if a.spread:
        print(json.dumps(spread(list(a.spread)), indent=1))
        return 0
    if a.reach:
        return reach_table(a)
    if a.skew:
        return skew_table(a.studies, a.alpha, a.seed)
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
