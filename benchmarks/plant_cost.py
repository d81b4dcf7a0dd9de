"""Each plant's own time, alone in this process, to size a calibration's plants near a share of a
step (``harness calibration-study --plants``; the truth studies then measure what each costs in a
training run).

    python benchmarks/plant_cost.py --threads 1 gather:2097152 copy:1048576 alloc:4194304 sleep:50 matmul:200

Prints each plant's median wall and CPU time over ``--calls`` calls (after ``--warmup``), and its
share of ``--step-us`` (default 3389 us: the calibration pilot's median tiny_transformer step).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from harness.execute.plant import Plant
from prereg.planted import KINDS


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plants", nargs="+", help="KIND:SIZE")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step-us", type=float, default=3389.0)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print("| plant | wall, us (median) | CPU, us (median) | share of a step |")
    print("|---|---|---|---|")
    for item in a.plants:
        kind, _, size = item.partition(":")
        if kind not in KINDS or not size.isdigit():
            print(f"plant_cost.py: {item!r} is not KIND:SIZE ({', '.join(KINDS)})", file=sys.stderr)
            return 2
        p = Plant({"kind": kind, KINDS[kind][0]: int(size)}, torch.device("cpu"))
        wall, cpu = [], []
        for i in range(a.warmup + a.calls):
            p()
            if i >= a.warmup:
                wall.append(p.wall_s * 1e6)
                cpu.append(p.cpu_s * 1e6)
        w, c = statistics.median(wall), statistics.median(cpu)
        print(f"| {item} | {w:.0f} | {c:.0f} | {100 * w / a.step_us:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
