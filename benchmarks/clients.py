"""The method's speed in real clients' loops: nanoGPT's ``train.py`` loop and timm's.

Each loop runs natively (the client's clipping, ``AdamW(fused=True).step()``, ``zero_grad``) and
with ``PackedAdamW`` taking the one-pass phase (``clip_step_zero_grad``), both in one process from the same weights and
batches, alternating which goes first each round (ABBA). Timed per iteration: the whole iteration
and the gradient phase alone (from the end of backward to the end of ``zero_grad``). Reported: the
medians, their ratio, and the 95% Student-t interval of the mean per-round log ratio (the
project's own ``prereg.descriptive.mean_interval``), as a ratio. The bits are checked too:
after the timed rounds the two models must be equal bit for bit.

* ``nanogpt``: the loop of nanoGPT's ``train.py`` (gradient accumulation over micro-batches with
  the loss divided by their count, ``GradScaler(enabled=False)`` as on CPU float32, ``unscale_``
  then ``clip_grad_norm_(model.parameters(), grad_clip)``, ``scaler.step``, ``scaler.update``,
  ``zero_grad(set_to_none=True)``) over the project's transformer family at nanoGPT's shapes
  (GELU MLP 4x, LayerNorm, no biases; ``--nanogpt-layers``/``--nanogpt-width``), with the decay
  and no-decay groups of nanoGPT's ``configure_optimizers`` (2-d tensors decay).
* ``timm``: timm's ``resnet10t`` (``param_groups_weight_decay``), one step per batch of small images.

The Hugging Face Trainer is not timed: it owns its loop, so its steps cannot be interleaved with
another Trainer's one by one; its bits are checked by ``harness verify``.

    python benchmarks/clients.py --rounds 30 --json runs/bench-clients.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent

from cotangent import PackedAdamW  # noqa: E402
from cotangent.verify import bitwise_equal  # noqa: E402
from harness.config import ModelConfig, load_config  # noqa: E402
from harness.machine import cpu_model  # noqa: E402
from harness.models import build_model  # noqa: E402
from prereg.descriptive import two_stage_interval  # noqa: E402

ARMS = ("native", "cotangent")


def optimizer(arm: str, groups: list[dict[str, Any]], **kw: Any) -> Any:
    """The arm's optimizer: ``native`` fused AdamW; ``cotangent`` (or ``packed``) the packed method
    (``mode="packed"``); ``auto`` PackedAdamW's default, which measures and may step natively."""
    if arm == "native":
        return torch.optim.AdamW(groups, fused=True, **kw)
    if arm in ("cotangent", "packed"):
        return PackedAdamW(groups, mode="packed", **kw)
    if arm == "auto":
        return PackedAdamW(groups, mode="auto", **kw)
    raise ValueError(f"unknown arm {arm!r}")


def nanogpt_groups(model: nn.Module, wd: float) -> list[dict[str, Any]]:
    """nanoGPT's ``configure_optimizers``: every 2-d tensor decays, the rest do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def phase(model: nn.Module, opt: Any, arm: str, max_norm: float) -> None:
    """A client loop's gradient phase: native's three calls (``clip_grad_norm_``, ``step``, ``zero_grad``),
    or ``PackedAdamW``'s one pass (which takes the three calls where it steps natively)."""
    if arm == "native":
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()
    else:
        opt.clip_step_zero_grad(max_norm, parameters=model.parameters())


class Loop:
    """One arm of one client loop: ``iteration()`` returns (whole seconds, phase seconds)."""

    model: nn.Module

    def iteration(self, k: int) -> tuple[float, float]:
        raise NotImplementedError


class NanoGPT(Loop):
    def __init__(self, arm: str, layers: int, width: int, batch: int, context: int, accum: int) -> None:
        cfg = ModelConfig(
            family="transformer",
            d_model=width,
            n_layers=layers,
            context=context,
            mlp="gelu",
            mlp_hidden=4 * width,
            norm="layernorm",
            n_heads=max(1, width // 64),
            n_kv_heads=max(1, width // 64),
        )
        self.model = build_model(cfg, 0)
        self.cfg, self.batch, self.accum, self.arm = cfg, batch, accum, arm
        groups = nanogpt_groups(self.model, 0.1)
        self.opt: Any = optimizer(arm, groups, lr=6e-4, betas=(0.9, 0.95))
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)

    def iteration(self, k: int) -> tuple[float, float]:
        g = torch.Generator().manual_seed(k)
        t0 = time.perf_counter()
        for _ in range(self.accum):
            x = torch.randint(0, self.cfg.vocab, (self.batch, self.cfg.context + 1), generator=g)
            logits = self.model(x[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()) / self.accum
            self.scaler.scale(loss).backward()
        t1 = time.perf_counter()
        if self.arm == "native":
            self.scaler.unscale_(self.opt)
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad(set_to_none=True)
        else:
            self.opt.clip_step_zero_grad(1.0, parameters=self.model.parameters())
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1


class Images(Loop):
    """A classifier's loop on random images (``batch`` of ``size`` x ``size``, 10 classes)."""

    arm: str
    batch: int
    size: int
    opt: Any

    def iteration(self, k: int) -> tuple[float, float]:
        g = torch.Generator().manual_seed(k)
        x = torch.randn(self.batch, 3, self.size, self.size, generator=g)
        y = torch.randint(0, 10, (self.batch,), generator=g)
        t0 = time.perf_counter()
        F.cross_entropy(self.model(x), y).backward()
        t1 = time.perf_counter()
        phase(self.model, self.opt, self.arm, 1.0)
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1


class Timm(Images):
    def __init__(self, arm: str, batch: int, size: int, init: nn.Module) -> None:
        from timm.optim import param_groups_weight_decay

        self.model = copy.deepcopy(init)
        self.batch, self.size, self.arm = batch, size, arm
        groups = param_groups_weight_decay(self.model, 0.05)
        self.opt: Any = optimizer(arm, groups, lr=1e-3)


class SmallCNN(Images):
    """A conv+BN net on small images: the review's "small conv+BN net"."""

    def __init__(self, arm: str, init: nn.Module, batch: int, size: int) -> None:
        self.model = copy.deepcopy(init)
        self.arm, self.batch, self.size = arm, batch, size
        self.opt = optimizer(arm, [{"params": list(self.model.parameters())}], lr=1e-3, weight_decay=0.05)

    @staticmethod
    def net(width: int) -> nn.Module:
        def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        return nn.Sequential(
            *block(3, width, 1),
            *block(width, 2 * width, 2),
            *block(2 * width, 2 * width, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, 10),
        )


class Study(Loop):
    """One of the study's configurations (``configs/<name>.yaml``): its model, batch and training settings."""

    def __init__(self, arm: str, name: str) -> None:
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        self.cfg, self.arm = cfg, arm
        self.model = build_model(cfg.model, 0)
        t = cfg.train
        self.opt = optimizer(
            arm,
            [{"params": list(self.model.parameters())}],
            lr=t.lr,
            betas=(t.beta1, t.beta2),
            eps=t.eps,
            weight_decay=t.weight_decay,
        )

    def iteration(self, k: int) -> tuple[float, float]:
        g = torch.Generator().manual_seed(k)
        m, batch = self.cfg.model, self.cfg.train.batch_size
        x = torch.randint(0, m.vocab, (batch, m.context + 1), generator=g)
        t0 = time.perf_counter()
        logits = self.model(x[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        t1 = time.perf_counter()
        phase(self.model, self.opt, self.arm, self.cfg.train.clip_norm)
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1


def add_loop_sizes(ap: argparse.ArgumentParser, cnn: bool = True) -> None:
    """The loops' sizes as flags, their one home (this script and ``never_slower.py``): nanoGPT's and
    timm's, and with ``cnn`` the small CNN's."""
    ap.add_argument("--nanogpt-layers", type=int, default=4)
    ap.add_argument("--nanogpt-width", type=int, default=128)
    ap.add_argument("--nanogpt-batch", type=int, default=2)
    ap.add_argument("--nanogpt-context", type=int, default=64)
    ap.add_argument("--nanogpt-accum", type=int, default=2)
    ap.add_argument("--timm-batch", type=int, default=2)
    ap.add_argument("--timm-size", type=int, default=32)
    if cnn:
        ap.add_argument("--cnn-width", type=int, default=32)
        ap.add_argument("--cnn-batch", type=int, default=16)
        ap.add_argument("--cnn-size", type=int, default=32)


def ratio_of(
    logs: list[float], native: list[float], cand: list[float], pilot: int | None = None
) -> dict[str, float]:
    """The geometric mean of ``exp(logs)`` with its 95% Student-t interval over ``logs``
    (``prereg.descriptive.mean_interval``; Stein's two-stage interval,
    ``prereg.descriptive.two_stage_interval``, where the first ``pilot`` of them set their number),
    and the medians of the times behind them."""
    # no pilot: n == n0, where the two-stage interval is mean_interval's, bit for bit
    ci = two_stage_interval(logs, pilot or len(logs), level=0.95, estimand="log_ratio")
    return {
        "native_ms": statistics.median(native) * 1e3,
        "cotangent_ms": statistics.median(cand) * 1e3,
        "ratio_of_medians": statistics.median(cand) / statistics.median(native),
        "ratio": math.exp(ci.estimate),
        "low": math.exp(ci.low),
        "high": math.exp(ci.high),
        "n": len(logs),
    }


def paired(native: list[float], cand: list[float]) -> dict[str, float]:
    """``cand / native`` over rounds: :func:`ratio_of` the per-round log ratios."""
    return ratio_of([math.log(c / n) for n, c in zip(native, cand)], native, cand)


def interleave(loops: dict[str, Loop], rounds: int, warmup: int) -> dict[str, Any]:
    whole: dict[str, list[float]] = {a: [] for a in ARMS}
    phase: dict[str, list[float]] = {a: [] for a in ARMS}
    for k in range(warmup + rounds):
        order = ARMS if k % 4 in (0, 3) else ARMS[::-1]  # ABBA
        for arm in order:
            w, p = loops[arm].iteration(k)
            if k >= warmup:
                whole[arm].append(w)
                phase[arm].append(p)
    a, b = (loops[x].model.state_dict() for x in ARMS)
    same = all(bitwise_equal(a[key], b[key]) for key in a)
    out = {
        "iteration": paired(whole["native"], whole["cotangent"]),
        "phase": paired(phase["native"], phase["cotangent"]),
        "bitwise": same,
        "phase_kernel": loops["cotangent"].opt.phase_kernel(),  # type: ignore[attr-defined]
        "parameters": sum(p.numel() for p in loops["native"].model.parameters()),
    }
    out["phase_share"] = out["phase"]["native_ms"] / out["iteration"]["native_ms"]
    return out


# long: the script's table: each client loop's arms measured in turn, then their figures printed side by side
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loops", nargs="+", default=["nanogpt", "timm"], choices=["nanogpt", "timm"])
    add_loop_sizes(ap, cnn=False)
    ap.add_argument("--json", help="write the results as JSON to this path")
    args = ap.parse_args()
    header = (
        f"{cpu_model()} ({platform.machine()}), torch {torch.__version__}, torch dispatches "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
        f"{args.rounds} rounds after {args.warmup} warm-up, arms alternating ABBA"
    )
    print(header)
    results: dict[str, Any] = {"header": header, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    builders: dict[str, Callable[[], dict[str, Any]]] = {}
    if "nanogpt" in args.loops:
        builders["nanogpt"] = lambda: interleave(
            {
                a: NanoGPT(
                    a,
                    args.nanogpt_layers,
                    args.nanogpt_width,
                    args.nanogpt_batch,
                    args.nanogpt_context,
                    args.nanogpt_accum,
                )
                for a in ARMS
            },
            args.rounds,
            args.warmup,
        )
    if "timm" in args.loops:

        def timm_run() -> dict[str, Any]:
            import timm

            torch.manual_seed(0)
            init = timm.create_model("resnet10t", num_classes=10)
            return interleave(
                {a: Timm(a, args.timm_batch, args.timm_size, init) for a in ARMS}, args.rounds, args.warmup
            )

        builders["timm"] = timm_run
    print()
    print(
        "| Loop | Parameters | Threads | torch dispatches | Phase share of native iteration | Phase: native ms | cotangent / native (95% CI) | Iteration: native ms | cotangent / native (95% CI) | Bitwise | One pass on |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, build in builders.items():
        r = build()
        # the thread count each figure ran with, beside it (ratios differ between 1 and 2 threads)
        r["threads"] = torch.get_num_threads()
        r["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        results[name] = r
        it = r["iteration"]
        ph = r["phase"]
        share = f"{r['phase_share']:.3f}"
        phs = f"{ph['native_ms']:.2f} | {ph['ratio']:.3f} ({ph['low']:.3f}-{ph['high']:.3f})"
        kern = "phase.c" if r["phase_kernel"].startswith("phase.c") else "torch kernels"
        print(
            f"| {name} | {r['parameters'] / 1e6:.2f}M | {r['threads']} | {r['cpu_capability']} | {share} | {phs} | {it['native_ms']:.1f} | "
            f"{it['ratio']:.3f} ({it['low']:.3f}-{it['high']:.3f}) | {r['bitwise']} | {kern} |",
            flush=True,
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
