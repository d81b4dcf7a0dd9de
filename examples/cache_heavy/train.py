"""A user's own script with a cache-heavy change the harness never saw: the candidate reads
``--gather`` floats at random places of a tensor of ``--gather-mib`` MiB each step, after its
optimizer step (what a lookup table, an embedding refresh or a data-structure walk does: its cost
is the misses, and it evicts what the next step's training finds in the caches).

The model and data are ``examples/nanogpt/train.py``'s. ``truth.py`` beside it measures the
change's true cost outside the harness; ``protocol.yaml`` reads it through the harness.

    python examples/cache_heavy/train.py --seed 1 --steps 40 --gather 20000
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.reporter import Reporter

_spec = importlib.util.spec_from_file_location(
    "nanogpt_train", Path(__file__).parent.parent / "nanogpt" / "train.py"
)
assert _spec is not None and _spec.loader is not None
nanogpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nanogpt)


def gatherer(mib: int, n: int) -> Callable[[], float] | None:
    """The change: ``n`` reads at fixed random places of a tensor of ``mib`` MiB (its own random
    generator: the training's random state is untouched), or None for the baseline."""
    if not n:
        return None
    g = torch.Generator().manual_seed(12345)
    table = torch.rand(mib << 18, generator=g)  # 4-byte floats: mib MiB
    where = torch.randint(len(table), (n,), generator=g)
    return lambda: float(table.index_select(0, where).sum())


def trainer(args: argparse.Namespace) -> tuple[Callable[[int, bool], float], Callable[[int], float]]:
    """``step(i, change)``: one training step (with the change when ``change``), its loss; and
    ``evaluate(i)``: validation bits per byte."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, valid = nanogpt.corpus()
    model = nanogpt.GPT(args.ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    change = gatherer(args.gather_mib, args.gather)

    def step(i: int, planted: bool) -> float:
        x, y = nanogpt.batch(train, args.batch, args.ctx, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if planted and change is not None:
            change()
        return loss.item()

    return step, lambda i: nanogpt.bits_per_byte(model, valid, args.ctx)


def arguments(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--gather", type=int, default=0, help="random reads a step (0: the baseline)")
    ap.add_argument("--gather-mib", type=int, default=64, help="the table's size, MiB")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="the reporter's file (the harness passes it)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> None:
    args = arguments(argv)
    step, evaluate = trainer(args)
    r = Reporter.from_env(args.out)
    for i in range(1, args.steps + 1):
        r.step(i, step(i, True), tokens=args.batch * args.ctx)
        if i % args.eval_every == 0 or i == args.steps:
            with r.untimed():
                r.eval(i, {"val_bpb": evaluate(i)})
    r.done()


if __name__ == "__main__":
    main(sys.argv[1:])
