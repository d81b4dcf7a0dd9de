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


def _pts(x: float | None) -> str:
    return "" if x is None else f"{x:+.2f}"


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r.get("bias") is None:
        return f"n/a ({r.get('why', '')})"
    if r.get("reference"):
        return f"reference: {_pts(r['estimate'])} ({_pts(r['estimate_lo'])} to {_pts(r['estimate_hi'])})"
    return f"{_pts(r['bias'])} ({_pts(r['bias_lo'])} to {_pts(r['bias_hi'])})"


def _coverage(r: dict | None) -> str:
    c = (r or {}).get("coverage")
    if not c:
        return ""
    return (
        f"{c['covered']}/{c['studies']} ({100 * c['lo']:.0f}-{100 * c['hi']:.0f}%) of {c['pairs_each']} pairs"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
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
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["config"], r["kind"], r["plant"], r["design"]), {})[r["clock"]] = r

    truth: dict[tuple, list[float]] = {}
    for k, clocks in by.items():
        t = (clocks.get("CPU") or clocks["wall"]).get("truth")
        if t is not None:
            truth.setdefault(k[:3], []).append(t)

    def order(k: tuple) -> tuple:
        config, kind, plant, _ = k
        t = truth.get(k[:3]) or [0.0]
        b = (by[k].get("CPU") or by[k]["wall"]).get("block_steps")
        return (config, kind != "spin", sum(t) / len(t), plant, b is None, b or 0)

    print(
        "| configuration | plant | design | pairs | true effect (CPU) | bias, wall (95%) | bias, CPU (95%)"
        " | covered, wall / CPU | coverage, CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k in sorted(by, key=order):
        config, _, plant, design = k
        w, c = by[k].get("wall"), by[k].get("CPU")
        ref = c or w or {}
        truth = _pts(ref.get("truth"))
        if "truth_lo" in ref:
            truth += f" ({_pts(ref['truth_lo'])} to {_pts(ref['truth_hi'])}), measured"
        cov = " / ".join(
            ""
            if x is None or x.get("reference") or x.get("bias") is None
            else ("yes" if x["covered"] else "no")
            for x in (w, c)
        )
        print(
            f"| {config} | {plant} | {design} | {ref.get('pairs', '')} | {truth} | {_cell(w)} | {_cell(c)}"
            f" | {cov} | {_coverage(c)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
