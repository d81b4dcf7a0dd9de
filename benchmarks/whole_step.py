"""Whole training iterations, native against the method, interleaved: what a user gains on a step.

A step is forward + loss + backward (timed together) and then the gradient phase (clip + AdamW step +
zero_grad, timed apart), on real models built by the project's own families, each variant with its own
copy of the same initial weights, all fed the same batches; the variants alternate step by step and
each reports the median over ``reps`` steps after ``warmup`` steps. The phase's share of native's step
says how much of a step the method can touch at all: with share ``s`` and a phase ratio ``r`` the
whole step cannot go below ``1 - s * (1 - r)`` of native's time.

Models: the study's four configurations at their configured batch, and ``nanogpt_small``, the shapes of
nanoGPT's ``model.py`` in its small character-level recipe (``config/train_shakespeare_char.py``:
6 layers, 6 heads, 384 wide, context 256, GELU MLP 4x, LayerNorm, no biases) over bytes, at a small
batch (8), built with the project's transformer family.

Used by ``benchmarks/grad_phase.py --whole-step-reps N``; alone:

    python benchmarks/whole_step.py --configs small_transformer nanogpt_small --reps 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent

from harness.arms import build_arm  # noqa: E402
from harness.config import ModelConfig, load_config  # noqa: E402
from harness.models import build_model  # noqa: E402

NANOGPT_SMALL = ModelConfig(
    family="transformer",
    d_model=384,
    n_layers=6,
    context=256,
    mlp="gelu",
    mlp_hidden=1536,
    norm="layernorm",
    n_heads=6,
    n_kv_heads=6,
)
NANOGPT_BATCH = 8
#: ``cotangent/backward``: the candidate with ``backward_norms=True`` (norms taken during backward).
VARIANTS = ("native", "cotangent", "cotangent/backward")


def _model_and_batch(config: str) -> tuple[ModelConfig, int, dict[str, float]]:
    if config == "nanogpt_small":
        return NANOGPT_SMALL, NANOGPT_BATCH, {"lr": 1e-3, "weight_decay": 0.1, "max_norm": 1.0}
    cfg = load_config(ROOT / "configs" / f"{config}.yaml")
    t = cfg.train
    return cfg.model, t.batch_size, {"lr": t.lr, "weight_decay": t.weight_decay, "max_norm": t.clip_norm}


def whole_step(
    config: str, reps: int, warmup: int = 3, variants: tuple[str, ...] = VARIANTS
) -> dict[str, object]:
    """Median forward+backward and phase times per variant, interleaved step by step."""
    mcfg, batch, hyper = _model_and_batch(config)
    models = {v: build_model(mcfg, 0) for v in variants}
    arms = {
        v: build_arm(v.split("/")[0], models[v].parameters(), backward_norms=v.endswith("/backward"), **hyper)
        for v in variants
    }
    gen = torch.Generator().manual_seed(0)
    fb: dict[str, list[float]] = {v: [] for v in variants}
    bw: dict[str, list[float]] = {v: [] for v in variants}
    ph: dict[str, list[float]] = {v: [] for v in variants}
    for step in range(warmup + reps):
        x = torch.randint(0, mcfg.vocab, (batch, mcfg.context + 1), generator=gen)
        for v in variants:
            t0 = time.perf_counter()
            logits = models[v](x[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            tb = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            arms[v].phase()
            t2 = time.perf_counter()
            if step >= warmup:
                fb[v].append(t1 - t0)
                bw[v].append(t1 - tb)
                ph[v].append(t2 - t1)
    out: dict[str, object] = {
        "batch": batch,
        "context": mcfg.context,
        "parameters": sum(p.numel() for p in models[variants[0]].parameters()),
    }
    for v in variants:
        out[v] = {
            "forward_backward_ms": statistics.median(fb[v]) * 1e3,
            "phase_ms": statistics.median(ph[v]) * 1e3,
            "backward_ms": statistics.median(bw[v]) * 1e3,
            "step_ms": statistics.median(a + b for a, b in zip(fb[v], ph[v])) * 1e3,
        }
    native = out["native"]
    assert isinstance(native, dict)
    out["phase_share_of_native_step"] = native["phase_ms"] / native["step_ms"]
    for v in variants[1:]:
        mine = out[v]
        assert isinstance(mine, dict)
        mine["step_ratio"] = mine["step_ms"] / native["step_ms"]
        mine["phase_ratio"] = mine["phase_ms"] / native["phase_ms"]
        mine["forward_backward_ratio"] = mine["forward_backward_ms"] / native["forward_backward_ms"]
        mine["backward_ratio"] = mine["backward_ms"] / native["backward_ms"]
    return out


def table(results: dict[str, dict[str, object]], reps: int) -> list[str]:
    lines = [
        f"Whole steps (forward + backward + phase), median of {reps} interleaved steps per variant:",
        "",
        "| Model | Parameters | Batch | Variant | Native step (ms) | Phase share of native step | Step (ms) "
        "| Phase ratio | Backward ratio | Forward+backward ratio | Whole-step ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config, r in results.items():
        n = r["native"]
        assert isinstance(n, dict)
        for v in (k for k in r if k.startswith("cotangent")):
            c = r[v]
            assert isinstance(c, dict)
            lines.append(
                f"| {config} | {int(r['parameters']) / 1e6:.2f}M | {r['batch']} | {v} | {n['step_ms']:.1f} | "  # type: ignore[call-overload]
                f"{r['phase_share_of_native_step']:.3f} | {c['step_ms']:.1f} | {c['phase_ratio']:.3f} | "
                f"{c['backward_ratio']:.3f} | {c['forward_backward_ratio']:.3f} | {c['step_ratio']:.3f} |"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["small_transformer", "nanogpt_small"])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    results = {c: whole_step(c, args.reps) for c in args.configs}
    print("\n".join(table(results, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
