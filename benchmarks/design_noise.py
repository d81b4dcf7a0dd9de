"""The noise each design and clock leaves in A/A pairs: the sd of the per-pair log ratio of training
time (wall clock, ``training_s``) and of training CPU time (``training_cpu_s``), per study and
configuration, side by side, from a records folder; and, where one configuration's candidate was
run in several designs, each design's effect and the difference of the designs' effects with its
99% Welch interval (:func:`prereg.designs.welch_difference`).

    python benchmarks/design_noise.py records/cpu2-pilot

Reads the records' JSON with the standard library only (as the audit does): every ``ok`` record
of the analysed unit attempt whose pair has the same arm twice (A/A). A lockstep study is labelled
with its ``block_steps``. Also prints the mean log ratio (candidate role over baseline role) with
its standard error, which for A/A pairs shows what bias the design leaves between the two roles,
and, for lockstep studies, between the arm built first and the arm built second.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from prereg.designs import welch_difference  # noqa: E402


def _records(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("*.record.json")):
        r = json.loads(p.read_text(encoding="utf-8"))
        out.append(r)
    latest: dict[str, int] = {}
    for r in out:
        u = r["spec"]["unit"]
        latest[u] = max(latest.get(u, 0), r.get("unit_attempt", 1))
    return [r for r in out if r["status"] == "ok" and r.get("unit_attempt", 1) == latest[r["spec"]["unit"]]]


def _pairs(records: list[dict], aa: bool) -> dict[tuple[str, str], list[tuple[dict, dict]]]:
    units: dict[str, dict[str, dict]] = {}
    for r in records:
        units.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r
    out: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for u in units.values():
        if set(u) != {"baseline", "candidate"}:
            continue
        s, arm = u["baseline"]["spec"], u["candidate"]["spec"]["arm"]
        if (s["arm"] == arm) != aa:  # A/A pairs, or a candidate against its baseline
            continue
        design = f"lockstep, blocks of {s['block_steps']}" if s.get("block_steps") else "a process per arm"
        what = s["config"] if aa else f"{s['config']}, {arm} against {s['arm']}"
        out.setdefault((what, design), []).append((u["baseline"], u["candidate"]))
    return out


def _mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    records = _records(Path(argv[0]))
    pairs = _pairs(records, aa=True)
    print(
        f"{'configuration':<18} {'design':<24} {'pairs':>5} {'sd wall':>8} {'sd CPU':>8} "
        f"{'CPU/wall':>8} {'bias wall':>16} {'first-built bias CPU':>22}"
    )
    for (config, design), ps in sorted(pairs.items()):
        if len(ps) < 3:
            continue
        wall = [math.log(c["timings"]["training_s"] / b["timings"]["training_s"]) for b, c in ps]
        cpu = [math.log(c["timings"]["training_cpu_s"] / b["timings"]["training_cpu_s"]) for b, c in ps]
        sw, sc = statistics.stdev(wall), statistics.stdev(cpu)
        m, se = _mean_se(wall)
        first = ""
        if "lockstep" in design:  # built first over built second, on the CPU clock
            fb = [
                math.log(x["timings"]["training_cpu_s"] / y["timings"]["training_cpu_s"])
                for b, c in ps
                for x, y in [(b, c) if b["spec"]["position"] == 0 else (c, b)]
            ]
            fm, fse = _mean_se(fb)
            first = f"{100 * fm:+.2f}% ± {100 * fse:.2f}"
        print(
            f"{config:<18} {design:<24} {len(ps):>5} {sw:>8.4f} {sc:>8.4f} {sc / sw:>8.2f} "
            f"{100 * m:+8.2f}% ± {100 * se:.2f} {first:>22}"
        )
    _effects(_pairs(records, aa=False))
    return 0


def _log_ratios(ps: list[tuple[dict, dict]], key: str) -> list[float]:
    return [math.log(c["timings"][key] / b["timings"][key]) for b, c in ps]


def _effects(pairs: dict[tuple[str, str], list[tuple[dict, dict]]]) -> None:
    """Each comparison's effect per design (mean log ratio, as a reduction), and the difference of
    every other design's effect from the first design's, with its 99% Welch interval."""
    by: dict[str, dict[str, list[tuple[dict, dict]]]] = {}
    for (what, design), ps in pairs.items():
        by.setdefault(what, {})[design] = ps
    for what, designs in sorted(by.items()):
        if len(designs) < 2:
            continue
        print(
            f"\n{what}: the candidate's time reduction per design (mean over pairs) and the designs' difference"
        )
        names = sorted(designs, key=lambda d: (not d.startswith("lockstep"), d))
        for key, clock in (("training_s", "wall"), ("training_cpu_s", "CPU")):
            ref = _log_ratios(designs[names[0]], key)
            for d in names:
                v = _log_ratios(designs[d], key)
                m, se = _mean_se(v)
                line = f"  {clock:<4} {d:<24} {len(v):>3} pairs  {100 * (1 - math.exp(m)):+6.2f}% (sd {statistics.stdev(v):.4f})"
                if d != names[0]:
                    w = welch_difference(v, ref, 0.99)
                    line += (
                        f"  minus {names[0]}: {100 * w.difference:+.2f} pp of log ratio, "
                        f"99% [{100 * w.lo:+.2f}, {100 * w.hi:+.2f}]"
                    )
                print(line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
