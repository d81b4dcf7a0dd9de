"""The twin check alone: native's loop built twice, read against itself under each way of taking turns.

``never_slower.py``'s ``twin`` arm is native's loop built a second time; its truth is 1. Where its
interval misses 1 more often than 1 in 20, native and twin are not exchangeable in the design.
This script builds the four arms of ``never_slower.one_build`` for one loop, builds alternating in
blocks of four (one cycle of the build orders, ``ORDERS``) between the ways named, and reads twin
against native (and auto against native's two builds) under each, with the 95% Student-t interval
over that way's builds. The ways:

* ``lead``: ``never_slower``'s design (each timed step after one untimed step of the arm's own,
  warm-ups in the order built);
* ``step``: the arms taking turns one step each (``--lead-in 0``), 96 rounds a build for the same
  steps;
* ``fixed``: as ``lead``, but the warm-ups in ``ARMS``' order (native first, twin last), as before
  ``WARM_IN_BUILD_ORDER``.

Run it pinned, with nothing else on the core:

    taskset -c 0 python benchmarks/twin_check.py tiny_conv --builds 96 --ways lead fixed
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import never_slower as ns  # benchmarks/, the script's own folder
import torch

WAYS = ("lead", "step", "fixed")


def run(loop: str, threads: int, builds: int, ways: list[str]) -> list[str]:
    """Each way's rows: twin / native and auto / native's two builds, over its builds."""
    torch.set_num_threads(threads)
    args = ns.parse(["--loops", loop, "--threads", str(threads)])
    build = ns.builders(args, [loop])[loop]
    times: dict[str, list[dict[str, list[float]]]] = {w: [] for w in ways}
    for b in range(builds):
        way = ways[(b // len(ns.ORDERS)) % len(ways)]
        ns.WARM_IN_BUILD_ORDER = way != "fixed"
        lead = 0 if way == "step" else ns.LEAD_IN
        rounds = ns.ROUNDS_PER_BUILD * (ns.LEAD_IN + 1) // (lead + 1)
        r = ns.one_build(build, b, rounds, args.warmup, lead)
        if not r["bitwise"]:
            raise SystemExit(f"twin_check.py: build {b} ({way}): the four models differ")
        times[way].append(r["times"])
    ns.WARM_IN_BUILD_ORDER = True
    rows = [
        f"command: python benchmarks/twin_check.py {loop} --threads {threads} --builds {builds} --ways {' '.join(ways)}",
        "| Way | Builds | twin / native (95% CI) | auto / native's two builds (95% CI) | sd of twin's build values |",
        "|---|---|---|---|---|",
    ]
    for way, ts in times.items():
        arm = {a: [t[a] for t in ts] for a in ns.ARMS}
        twin = ns.over_builds(arm["native"], arm["twin"])
        auto = ns.over_builds(arm["native"], arm["auto"], arm["twin"])
        sd = statistics.stdev(twin["logs"])
        rows.append(f"| {way} | {len(ts)} | {ns.ratio_cell(twin)} | {ns.ratio_cell(auto)} | {sd:.4f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("loop", choices=ns.LOOPS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--builds", type=int, default=96, help="builds in all, in blocks of four a way (default 96)"
    )
    ap.add_argument("--ways", nargs="+", choices=WAYS, default=["lead", "fixed"])
    a = ap.parse_args(argv)
    if a.builds < len(ns.ORDERS) * len(a.ways) or len(set(a.ways)) != len(a.ways):
        ap.error("--builds must give each way a block of four at least; --ways must not repeat")
    warnings.filterwarnings("ignore", message=r"PackedAdamW\(mode='auto'\) measured")
    print("\n".join(run(a.loop, a.threads, a.builds, a.ways)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
