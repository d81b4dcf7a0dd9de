"""Where ``PackedAdamW``'s native mode spends its time against native, split by phase.

For each of the study's tiny configurations named (``configs/<name>.yaml``, the loop of
``benchmarks/clients.py``'s ``Study``), two arms are built from the same weights and fed the same
batches: ``native`` (``clip_grad_norm_``, ``AdamW(fused=True).step()``, ``zero_grad``) and
``auto`` (``PackedAdamW``'s default), each warmed up alone for 56 iterations so that ``auto``
decides (after 52) and, where it chooses native, moves its tensors to storage of their own. Then
``--rounds`` rounds in ABBA order, each iteration timed whole and split into forward and backward
(the batch to the end of ``backward``) and the gradient phase (to the end of ``zero_grad``).
Reported per part: the medians and the geometric mean of the per-round ratios ``auto / native``
with its 95% Student-t interval (``clients.paired``: ``prereg.descriptive.mean_interval``), and ``auto``'s state (its
mode, whether it moved, whether the packed buffers are gone). Run it pinned to one core with
nothing else on it:

    taskset -c 0 python benchmarks/native_split.py tiny_medium tiny_gqa --rounds 2000
"""

from __future__ import annotations

import argparse
import statistics

import torch
from clients import Study, paired  # benchmarks/, the script's own folder: the loops

WARMUP = 56


def ratio(native: list[float], auto: list[float]) -> str:
    """The geometric mean of per-round ratios ``auto / native`` with its 95% interval
    (``clients.paired``, the benchmarks' one home for it)."""
    r = paired(native, auto)
    return f"{r['ratio']:.4f} ({r['low']:.4f}-{r['high']:.4f})"


def split(name: str, rounds: int) -> list[str]:
    """One configuration's rows: whole, forward and backward, phase."""
    arms = {"native": Study("native", name=name), "auto": Study("auto", name=name)}
    for loop in arms.values():
        for k in range(WARMUP):
            loop.iteration(k)
    opt = arms["auto"].opt
    parts: dict[str, dict[str, list[float]]] = {a: {"whole": [], "fwd+bwd": [], "phase": []} for a in arms}
    for r in range(rounds):
        for arm in ("native", "auto") if r % 4 in (0, 3) else ("auto", "native"):
            whole, phase = arms[arm].iteration(WARMUP + r)
            parts[arm]["whole"].append(whole)
            parts[arm]["fwd+bwd"].append(whole - phase)
            parts[arm]["phase"].append(phase)
    rows = [
        f"{name}: auto mode {opt.mode}, moved to storage of its own {getattr(opt, '_own', False)}, "
        f"packed buffers freed {getattr(opt, '_pack', None) is None}",
        "| Part | native median (us) | auto median (us) | auto / native (95% CI) |",
        "|---|---|---|---|",
    ]
    for part in ("whole", "fwd+bwd", "phase"):
        n, a = parts["native"][part], parts["auto"][part]
        rows.append(
            f"| {part} | {statistics.median(n) * 1e6:.0f} | {statistics.median(a) * 1e6:.0f} | {ratio(n, a)} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="tiny configurations (configs/<name>.yaml)")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(
        f"command: python benchmarks/native_split.py {' '.join(a.configs)} --rounds {a.rounds} --threads {a.threads}"
    )
    for name in a.configs:
        print("\n".join(split(name, a.rounds)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
