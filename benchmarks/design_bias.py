"""Each design's bias against the effects planted in it, one row per design and plant, the two clocks
side by side: the compact form of a calibration study's planted table (docs/decisions.md, "The
design chosen by its bias").

    python benchmarks/design_bias.py records/calibration-cpu

It reads the folder's ``summary.json`` (its ``planted`` rows, which ``python analysis/public_audit.py``
recomputes from the records); the figures are points of the log ratio (100 x ln(T_candidate /
T_baseline); at these sizes a point is a percentage point of the time within 0.05), positive: the
design reads the plant as costing more than it does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r.get("bias") is None:
        return f"n/a ({r.get('why', '')})"
    if r.get("reference"):
        return "the reference"
    return f"{r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"


def _truth(r: dict) -> str:
    if r.get("truth") is None:
        return "n/a"
    t = f"{r['truth']:+.2f}"
    if "truth_lo" in r:
        t += f" ({r['truth_lo']:+.2f} to {r['truth_hi']:+.2f}), measured"
    return t


def _coverage(r: dict | None) -> str:
    c = (r or {}).get("coverage")
    if not c:
        return ""
    return f"{c['covered']} of {c['studies']} ({100 * c['lo']:.0f} to {100 * c['hi']:.0f}%)"


def table(rows: list[dict]) -> list[str]:
    """The markdown lines: per configuration and plant (spins by size, then the measured plants),
    each design (lockstep by block size, then a process per arm), the CPU clock beside the wall."""
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["config"], r["kind"], r["plant"], r.get("block_steps"), r["design"]), {})[
            r["clock"]
        ] = r
    truth: dict[tuple, list[float]] = {}
    for k, clocks in by.items():
        t = (clocks.get("CPU") or clocks["wall"]).get("truth")
        if t is not None:
            truth.setdefault(k[:3], []).append(t)

    def order(k: tuple) -> tuple:
        config, kind, plant, block, design = k
        t = truth.get(k[:3]) or [0.0]
        own = by[k].get("CPU", by[k].get("wall", {}))
        return (
            config,
            kind != "spin",
            kind,
            sum(t) / len(t),
            plant,
            own.get("reference") is not True,
            block is None,
            block or 0,
            design,
        )

    configs = {k[0] for k in by}
    out = [
        ("| configuration " if len(configs) > 1 else "")
        + "| plant | design | pairs | true effect, CPU | bias, CPU (95%) | true effect, wall | bias, wall (95%) | coverage, CPU |",
        ("|---" if len(configs) > 1 else "") + "|---|---|---|---|---|---|---|---|",
    ]
    for k in sorted(by, key=order):
        c, w = by[k].get("CPU"), by[k].get("wall")
        ref = c or w or {}
        out.append(
            (f"| {k[0]} " if len(configs) > 1 else "")
            + f"| {k[2]} | {ref['design']} | {ref['pairs']} | {_truth(c or ref)} | {_cell(c)} | {_truth(w or ref)} | {_cell(w)}"
            f" | {_coverage(c)} |"
        )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/design_bias.py RECORDS_FOLDER", file=sys.stderr)
        return 2
    path = Path(argv[0]) / "summary.json"
    try:
        rows = json.loads(path.read_text()).get("planted") or []
    except (OSError, ValueError) as e:
        print(f"{path}: cannot read it ({e})", file=sys.stderr)
        return 2
    if not rows:
        print(f"{path}: no planted studies")
        return 1
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
