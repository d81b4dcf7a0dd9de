"""Where ``PackedAdamW``'s native mode spends its time against native, split by phase.

For each of the study's tiny configurations named (``configs/<name>.yaml``, the loop of
``benchmarks/clients.py``'s ``Study``), four arms are built from the same weights and fed the same
batches: ``native`` (``clip_grad_norm_``, ``AdamW(fused=True).step()``, ``zero_grad``), ``auto``
(``PackedAdamW``'s default), ``twin`` (native again: the placement A/A) and ``planted`` (native
with a busy spin beside each iteration past the warm-up: the design check), each warmed up alone for 56 iterations so that ``auto``
decides (after 52) and, where it chooses native, moves its tensors to storage of their own. Then
``--rounds`` rounds, each timed iteration timed whole and split into forward and backward
(the batch to the end of ``backward``) and the gradient phase (to the end of ``zero_grad``).
Each turn is one untimed iteration of the arm and one timed (``never_slower.LEAD_IN``), in the
order of ``never_slower.ROUND_ORDERS`` (each arm in each place, and right after each arm, equally
often). Reported per part: the medians and the geometric mean of the per-round ratios ``auto / native``
with its 95% Student-t interval (``clients.paired``: ``prereg.descriptive.mean_interval``), and ``auto``'s state (its
mode, whether it moved, whether the packed buffers are gone). Run it pinned to one core with
nothing else on it:

    taskset -c 0 python benchmarks/native_split.py tiny_medium tiny_gqa --rounds 2000
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from clients import Study, paired  # benchmarks/, the script's own folder: the loops
from never_slower import LEAD_IN, ROUND_ORDERS  # the turns: each timed step after the arm's own

WARMUP = 56


def ratio(native: list[float], auto: list[float]) -> str:
    """The geometric mean of per-round ratios ``auto / native`` with its 95% interval
    (``clients.paired``, the benchmarks' one home for it)."""
    r = paired(native, auto)
    return f"{r['ratio']:.4f} ({r['low']:.4f}-{r['high']:.4f})"


ARMS = ("native", "auto", "twin", "planted")


def spin(seconds: float) -> float:
    """Busy-wait ``seconds``; returns the time it took (the plant as run)."""
    t0 = time.perf_counter()
    while time.perf_counter() < t0 + seconds:
        pass
    return time.perf_counter() - t0


def split(name: str, rounds: int, share: float) -> list[str]:
    """One configuration's rows: whole, forward and backward, phase; then the design's checks."""
    arms = {a: Study("auto" if a == "auto" else "native", name=name) for a in ARMS}
    warm: list[float] = []
    for arm, loop in arms.items():
        for k in range(WARMUP):
            whole, _ = loop.iteration(k)
            if arm == "native":
                warm.append(whole)
    cost = share * statistics.median(warm)
    opt = arms["auto"].opt
    parts: dict[str, dict[str, list[float]]] = {a: {"whole": [], "fwd+bwd": [], "phase": []} for a in arms}
    spun: list[float] = []
    for r in range(rounds):
        for a in ROUND_ORDERS[r % len(ROUND_ORDERS)]:
            arm = ARMS[a]
            k = WARMUP + r * (LEAD_IN + 1)
            for j in range(LEAD_IN):  # untimed; the planted arm spins before each (never_slower.SPIN_AT)
                if arm == "planted":
                    spin(cost)
                arms[arm].iteration(k + j)
            whole, phase = arms[arm].iteration(k + LEAD_IN)
            if arm == "planted":  # the spin after the phase, timed with the iteration
                took = spin(cost)
                spun.append(took)
                whole, phase = whole + took, phase + took
            parts[arm]["whole"].append(whole)
            parts[arm]["fwd+bwd"].append(whole - phase)
            parts[arm]["phase"].append(phase)
    rows = [
        f"{name}: auto mode {opt.mode}, moved to storage of its own {getattr(opt, '_own', False)}, "
        f"packed buffers freed {getattr(opt, '_pack', None) is None}",
        "| Part | native median (us) | auto median (us) | auto / native (95% CI) | twin / native (95% CI) |",
        "|---|---|---|---|---|",
    ]
    for part in ("whole", "fwd+bwd", "phase"):
        n, au, t = parts["native"][part], parts["auto"][part], parts["twin"][part]
        rows.append(
            f"| {part} | {statistics.median(n) * 1e6:.0f} | {statistics.median(au) * 1e6:.0f} | {ratio(n, au)} "
            f"| {ratio(n, t)} |"
        )
    base = parts["twin"]["whole"]
    truth = math.exp(statistics.fmean(math.log((x + s) / x) for x, s in zip(base, spun)))
    read = paired(base, parts["planted"]["whole"])
    inside = "yes" if read["low"] <= truth <= read["high"] else "NO"
    rows.append(
        f"design check: a spin of {share:.0%} of native's median warm-up iteration ({cost * 1e6:.0f} us) "
        f"planted in a fourth build, read against the twin: truth {truth:.4f}, read {ratio(base, parts['planted']['whole'])}, "
        f"truth inside {inside}. twin: a second native build, the placement A/A (its truth 1)."
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="tiny configurations (configs/<name>.yaml)")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plant", type=float, default=0.02, help="the planted cost, a share of an iteration")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(
        f"command: python benchmarks/native_split.py {' '.join(a.configs)} --rounds {a.rounds} --threads {a.threads} --plant {a.plant}"
    )
    for name in a.configs:
        print("\n".join(split(name, a.rounds, a.plant)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
