"""The noise each design and clock leaves in A/A pairs: the sd of the per-pair log ratio of training
time (wall clock, ``training_s``) and of training CPU time (``training_cpu_s``), per study and
configuration, side by side, from a records folder.

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


def _pairs(records: list[dict]) -> dict[tuple[str, str], list[tuple[dict, dict]]]:
    units: dict[str, dict[str, dict]] = {}
    for r in records:
        units.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r
    out: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for u in units.values():
        if (
            set(u) != {"baseline", "candidate"}
            or u["baseline"]["spec"]["arm"] != u["candidate"]["spec"]["arm"]
        ):
            continue
        s = u["baseline"]["spec"]
        design = f"lockstep, blocks of {s['block_steps']}" if s.get("block_steps") else "a process per arm"
        out.setdefault((s["config"], design), []).append((u["baseline"], u["candidate"]))
    return out


def _mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    pairs = _pairs(_records(Path(argv[0])))
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
