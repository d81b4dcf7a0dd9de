"""The change's true cost in ``train.py``, measured outside the harness: one process trains as
``train.py`` does and switches the change on and off in ABBA blocks of ``--block`` steps (off,
on, on, off, ...) for ``--rounds`` rounds of four blocks; each round's cost is
``100 x ln(mean step on / mean step off)`` on the process's CPU clock (and the wall clock), the
first step after each switch left out (it follows the other kind of step). The truth is the mean
over rounds with its 95% t interval (rounds as independent replicates: drift within a round is
cancelled by its ABBA order).

    python examples/cache_heavy/truth.py --gather 20000 --rounds 100 --block 10
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

from scipy.stats import t as student_t

_spec = importlib.util.spec_from_file_location("cache_heavy_train", Path(__file__).parent / "train.py")
assert _spec is not None and _spec.loader is not None
train = importlib.util.module_from_spec(_spec)  # train.py beside it: the user's own script
_spec.loader.exec_module(train)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=20)
    a, rest = ap.parse_known_args(argv)
    args = train.arguments(rest)
    if not args.gather or a.rounds < 2 or a.block < 2:
        print("truth.py: --gather above 0, --rounds and --block at least 2", file=sys.stderr)
        return 2
    step, _ = train.trainer(args)
    for i in range(a.warmup):
        step(i, i % 2 == 0)
    costs: dict[str, list[float]] = {"CPU": [], "wall": []}
    for _ in range(a.rounds):
        times: dict[bool, dict[str, list[float]]] = {k: {"CPU": [], "wall": []} for k in (False, True)}
        for on in (False, True, True, False):
            for j in range(a.block):
                t0, c0 = time.perf_counter(), time.process_time()
                step(0, on)
                if j:  # the first step after a switch follows the other kind of step
                    times[on]["wall"].append(time.perf_counter() - t0)
                    times[on]["CPU"].append(time.process_time() - c0)
        for clock in costs:
            on, off = statistics.fmean(times[True][clock]), statistics.fmean(times[False][clock])
            costs[clock].append(100 * math.log(on / off))
    for clock, c in costs.items():
        m, s = statistics.fmean(c), statistics.stdev(c) / math.sqrt(len(c))
        q = float(student_t.ppf(0.975, len(c) - 1))
        print(
            f"{clock}: {m:+.2f} ({m - q * s:+.2f} to {m + q * s:+.2f}) points, {len(c)} rounds of {a.block}-step blocks"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
