"""Differential tests the project did not hand-pick: hypothesis generates module trees and training
loops, and PackedAdamW is compared with ``torch.optim.AdamW(fused=True)`` bit for bit after every
step (parameters, gradients and their presence, optimizer state, total norms, learning rates).

Generated: widths that are and are not multiples of 16; tied weights; a block never used and blocks
used only on some steps; parameters frozen at construction, frozen and unfrozen mid-run; one or two
parameter groups with their own hyperparameters (amsgrad, maximize, betas, weight decay); gradients
from backward (one or two micro-batches accumulated), assigned, overwritten in place, set to None;
zero_grad on the optimizer or on the model, either mode, or none (accumulating across steps); no
clipping, native clipping or the project's, over the parameters in order or reversed; the
three calls or the one-pass phase; gradient pages kept or released; an LR scheduler; GradScaler at scales that are and are not
powers of two, with and without unscale_, an inf gradient on some step; both kernels.

CI runs :data:`CI_EXAMPLES` derandomized examples (fixed, reproducible); ``pytest -m thorough``
runs :data:`THOROUGH_EXAMPLES` random ones.
"""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch import nn

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.verify import bitwise_equal, state_dict_difference

CI_EXAMPLES = 30
THOROUGH_EXAMPLES = 3000
WIDTHS = [16, 32, 48, 7, 20, 33]


class Tree(nn.Module):
    """Input layer, residual blocks (each optionally used only on even or odd steps, one possibly
    never used), an output layer whose weight may be tied to the input layer's."""

    def __init__(self, width: int, blocks: int, tied: bool, bias: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width, bias=bias)
        self.blocks = nn.ModuleList(nn.Linear(width, width, bias=bias) for _ in range(blocks))
        self.out = nn.Linear(width, width, bias=True)
        if tied:
            self.out.weight = self.inp.weight

    def forward(self, x: torch.Tensor, used: list[bool]) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for block, on in zip(self.blocks, used):
            if on:
                h = h + torch.tanh(block(h))
        return self.out(h)


@st.composite
def scenarios(draw: st.DrawFn, backward: bool | None = None) -> dict:
    blocks = draw(st.integers(1, 3))
    steps = draw(st.integers(2, 5))
    scaler = draw(st.sampled_from([None, None, 1024.0, 3000.7]))
    two_groups = draw(st.booleans())
    hyper = st.fixed_dictionaries(
        {
            "lr": st.sampled_from([1e-3, 0.05]),
            "weight_decay": st.sampled_from([0.0, 0.1]),
            "amsgrad": st.booleans(),
            "maximize": st.sampled_from([False, False, True]),
            "betas": st.sampled_from([(0.9, 0.999), (0.3, 0.95)]),
        }
    )
    step_st = st.fixed_dictionaries(
        {
            "zero": st.sampled_from(["opt_none", "opt_none", "opt_zero", "model_none", "model_zero", "skip"]),
            "micro": st.integers(1, 2),
            "usage": st.lists(
                st.sampled_from(["on", "on", "even", "odd", "never"]), min_size=blocks, max_size=blocks
            ),
            "grad_op": st.sampled_from(
                ["none", "none", "assign", "inplace", "to_none", "view_write", "foreach_mul"]
            ),
            "target": st.integers(0, 100),
            "clip": st.sampled_from(["none", "native", "project"]),
            "reverse": st.booleans(),
            "one_pass_none": st.sampled_from([True, True, False]),
            "max_norm": st.sampled_from([0.05, 1.0, 1e6]),
            "one_pass": st.sampled_from([False, True, True]) if backward else st.booleans(),
            "freeze": st.sampled_from([None, None, None, "freeze", "unfreeze"]),
            "inf": st.integers(0, 3),
            "unscale": st.booleans(),
        }
    )
    return {
        "width": draw(st.sampled_from(WIDTHS)),
        "blocks": blocks,
        "tied": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "frozen_at_start": draw(st.booleans()),
        "groups": [draw(hyper)] + ([draw(hyper)] if two_groups else []),
        "kernel": draw(st.sampled_from(["auto", "torch"])),
        "release": draw(st.booleans()),
        "scaler": scaler,
        "backward_norms": draw(st.booleans()) if backward is None else backward,
        "scheduler": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
        "steps": [draw(step_st) for _ in range(steps)],
    }


def _groups(model: nn.Module, hypers: list[dict]) -> list[dict]:
    params = list(model.parameters())
    if len(hypers) == 1:
        return [{"params": params, **hypers[0]}]
    return [{"params": params[0::2], **hypers[0]}, {"params": params[1::2], **hypers[1]}]


def _compare(ma: nn.Module, mb: nn.Module, oa: torch.optim.Optimizer, ob: PackedAdamW, where: str) -> None:
    for (name, x), y in zip(ma.named_parameters(), mb.parameters()):
        assert bitwise_equal(x.detach(), y.detach()), f"{where}: parameter {name}"
        assert (x.grad is None) == (y.grad is None), (
            f"{where}: {name}.grad is None natively: {x.grad is None}"
        )
        if x.grad is not None:
            assert bitwise_equal(x.grad, y.grad), f"{where}: {name}.grad"
    # native's lazy state: an entry from a parameter's first step with a gradient, never before
    diff = state_dict_difference(oa.state_dict(), ob.state_dict())
    assert diff is None, f"{where}: state_dict {diff}"
    for ga, gb in zip(oa.param_groups, ob.param_groups):
        assert ga["lr"] == gb["lr"], f"{where}: learning rate"


def run_scenario(sc: dict) -> None:
    torch.manual_seed(sc["seed"])
    ma = Tree(sc["width"], sc["blocks"], sc["tied"], sc["bias"])
    if sc["frozen_at_start"]:
        ma.blocks[0].requires_grad_(False)
    mb = copy.deepcopy(ma)
    oa = torch.optim.AdamW(_groups(ma, sc["groups"]), fused=True)
    ob = PackedAdamW(
        _groups(mb, sc["groups"]),
        kernel=sc["kernel"],
        release_grads=sc["release"],
        backward_norms=sc["backward_norms"],
    )
    sched = (
        [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (oa, ob)]
        if sc["scheduler"]
        else []
    )
    scalers = (
        [torch.amp.GradScaler("cpu", init_scale=sc["scaler"], growth_interval=2) for _ in range(2)]
        if sc["scaler"]
        else [None, None]
    )
    gen = torch.Generator().manual_seed(sc["seed"])
    n_params = len(list(ma.parameters()))
    for t, s in enumerate(sc["steps"]):
        where = f"step {t} ({s})"
        used = [u == "on" or (u == "even" and t % 2 == 0) or (u == "odd" and t % 2 == 1) for u in s["usage"]]
        batches = [
            (torch.randn(4, sc["width"], generator=gen), torch.randn(4, sc["width"], generator=gen))
            for _ in range(s["micro"])
        ]
        target = s["target"] % n_params
        extra = torch.randn(list(ma.parameters())[target].shape, generator=gen)
        one_pass = s["one_pass"] and sc["scaler"] is None and s["clip"] != "none"
        totals = []
        for m, o, scaler in ((ma, oa, scalers[0]), (mb, ob, scalers[1])):
            if s["freeze"]:
                m.blocks[-1].requires_grad_(s["freeze"] == "unfreeze")
            if s["zero"] != "skip":
                zero = o.zero_grad if s["zero"].startswith("opt") else m.zero_grad
                zero(set_to_none=s["zero"].endswith("none"))
            for x, y in batches:
                loss = nn.functional.mse_loss(m(x, used), y)
                (scaler.scale(loss) if scaler else loss).backward()
            p = list(m.parameters())[target]
            with torch.no_grad():
                if s["grad_op"] == "assign":
                    p.grad = extra.clone()
                elif s["grad_op"] == "inplace" and p.grad is not None:
                    p.grad.mul_(0.5).add_(extra)  # an all-reduce's in-place write
                elif s["grad_op"] == "to_none":
                    p.grad = None
                elif s["grad_op"] == "view_write" and p.grad is not None:
                    p.grad.view(-1)[:3].mul_(3.0)  # through a view of the gradient
                elif s["grad_op"] == "foreach_mul":  # an average over workers, as DDP-style loops write it
                    grads = [q.grad for q in m.parameters() if q.grad is not None]
                    if grads:
                        torch._foreach_mul_(grads, 0.25)
                if scaler and s["inf"] == 0 and p.grad is not None:
                    p.grad.view(-1)[0] = float("inf")  # the scaler finds it: native skips the update
            params = list(m.parameters())[::-1] if s["reverse"] else list(m.parameters())
            if scaler and s["unscale"]:
                scaler.unscale_(o)
            if one_pass:  # the phase clips in the order of the call it replaces; natively the three calls
                if o is ob:
                    totals.append(
                        ob.clip_step_zero_grad(
                            s["max_norm"], parameters=params, set_to_none=s["one_pass_none"]
                        )
                    )
                else:
                    totals.append(nn.utils.clip_grad_norm_(params, s["max_norm"]))
                    oa.step()
                    oa.zero_grad(set_to_none=s["one_pass_none"])
                continue
            if s["clip"] == "native":
                totals.append(nn.utils.clip_grad_norm_(params, s["max_norm"]))
            elif s["clip"] == "project":
                totals.append(
                    (clip_grad_norm_ if o is ob else nn.utils.clip_grad_norm_)(params, s["max_norm"])
                )
            if scaler:
                scaler.step(o)
                scaler.update()
            else:
                o.step()
        for sch in sched:
            sch.step()
        if len(totals) == 2:
            assert bitwise_equal(totals[0], totals[1]), f"{where}: total norm"
        if scalers[0] is not None:
            assert scalers[0].get_scale() == scalers[1].get_scale(), f"{where}: scale"
        _compare(ma, mb, oa, ob, where)


@settings(
    max_examples=CI_EXAMPLES,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sc=scenarios())
def test_packed_adamw_is_native_in_generated_loops(sc):
    run_scenario(sc)


@settings(
    max_examples=CI_EXAMPLES,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sc=scenarios(backward=True))
def test_norms_taken_in_backward_are_native_in_generated_loops(sc):
    """``backward_norms=True``: the norms remembered from backward are used only while valid; every
    in-place write the loop makes after backward (a view, ``_foreach_mul_``, native clipping, a
    second micro-batch, an assigned ``.grad``) leaves the bits of the two-pass phase."""
    run_scenario(sc)


@pytest.mark.thorough
@settings(
    max_examples=THOROUGH_EXAMPLES,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sc=scenarios())
def test_packed_adamw_is_native_in_generated_loops_thorough(sc):
    run_scenario(sc)
