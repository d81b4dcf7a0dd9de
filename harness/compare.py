"""``harness compare-arms``: two arms in lockstep on one seed, step by step, bit for bit.

Both arms start from the same initial weights (one seed) and see the same batches; after each
backward the gradients are compared, after each gradient phase the weights. The report says, per
step, whether losses, gradients and weights are bitwise equal, the first step where anything
differs and the largest distance in units in the last place (ULP) between the two arms' weights:
for a change that is meant to be exact, zero everywhere; for one that is not, how fast the two
trajectories drift apart, which is what a quality margin should be chosen against.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from harness.data.corpora import Corpus

_INT = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between ``a`` and ``b`` in units in the last place (NaN-free floats)."""
    it = _INT[a.dtype]
    bits = torch.iinfo(it).bits

    def ordered(x: torch.Tensor) -> torch.Tensor:
        i = x.detach().contiguous().view(it).to(torch.int64)
        return torch.where(i < 0, -(2 ** (bits - 1)) - i, i)  # monotone in the float's value

    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0


@dataclass(frozen=True)
class StepRow:
    step: int
    loss_baseline: float
    loss_candidate: float
    loss_equal: bool
    grads_equal: bool
    weights_equal: bool
    max_ulp: int
    max_abs: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.detach().contiguous().view(_INT.get(a.dtype, torch.uint8)),
            b.detach().contiguous().view(_INT.get(b.dtype, torch.uint8)),
        )
    )


def compare_arms(
    baseline: str,
    candidate: str,
    config_path: str,
    steps: int,
    seed: int,
    device: torch.device,
    corpus: Corpus,
) -> list[StepRow]:
    from harness.arms import ArmContext, resolve
    from harness.config import load_config
    from harness.data.batches import BatchStream
    from harness.models import build_model

    cfg = load_config(config_path)
    models, arms = [], []
    for name in (baseline, candidate):
        torch.manual_seed(seed)
        m = build_model(cfg.model, seed).to(device)
        params = list(dict.fromkeys(m.parameters()))
        models.append(m)
        arms.append(resolve(name)(ArmContext(m, params, cfg.train, device)))
    batches = BatchStream(corpus.train, cfg.model.context, cfg.train.batch_size, seed)
    rows = []
    for step in range(steps):
        x, y = (t.to(device) for t in batches.next())
        losses = []
        for m, arm in zip(models, arms):
            arm.set_lr(cfg.lr_at(step, steps))
            loss = F.cross_entropy(m(x).float().flatten(0, 1), y.flatten())
            loss.backward()
            losses.append(loss.detach())
        pa, pb = (list(m.parameters()) for m in models)
        grads_equal = all(
            (p.grad is None and q.grad is None)
            or (p.grad is not None and q.grad is not None and _bits_equal(p.grad, q.grad))
            for p, q in zip(pa, pb)
        )
        for arm in arms:
            arm.phase()
        weights_equal = all(_bits_equal(p, q) for p, q in zip(pa, pb))
        rows.append(
            StepRow(
                step + 1,
                float(losses[0]),
                float(losses[1]),
                _bits_equal(losses[0], losses[1]),
                grads_equal,
                weights_equal,
                max(ulp_distance(p, q) for p, q in zip(pa, pb)),
                max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(pa, pb)),
            )
        )
    return rows


def summary(rows: list[StepRow]) -> dict[str, object]:
    first = next((r.step for r in rows if not (r.loss_equal and r.grads_equal and r.weights_equal)), None)
    return {
        "steps": len(rows),
        "bitwise_equal": first is None,
        "first_divergent_step": first,
        "max_ulp": max((r.max_ulp for r in rows), default=0),
        "max_abs": max((r.max_abs for r in rows), default=0.0),
        "final_loss_difference": rows[-1].loss_candidate - rows[-1].loss_baseline if rows else 0.0,
    }
