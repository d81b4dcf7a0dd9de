"""Bitwise tests of the method against native PyTorch on CPU."""

from __future__ import annotations

import copy
import math

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.verify import bitwise_equal
from harness.arms import ARMS, build_arm

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
shape_st = st.lists(
    st.one_of(
        st.just(()),
        st.tuples(st.integers(0, 70)),
        st.tuples(st.integers(1, 40), st.integers(1, 40)),
        st.sampled_from([(64,), (256, 256), (3, 5), (1024,), (130, 2)]),
    ),
    min_size=1,
    max_size=12,
)


def _pairs(shapes, dtypes, seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    a, b = [], []
    for i, s in enumerate(shapes):
        dt = dtypes[i % len(dtypes)]
        g = (torch.randn(s, generator=gen) * scale).to(dt)
        x = torch.zeros(s, dtype=dt, requires_grad=True)
        y = torch.zeros(s, dtype=dt, requires_grad=True)
        x.grad, y.grad = g.clone(), g.clone()
        a.append(x)
        b.append(y)
    return a, b


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=shape_st,
    dtype_idx=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
    max_norm=st.sampled_from([0.5, 1.0, 1e9]),
)
def test_clip_bitwise_native_random_shapes(shapes, dtype_idx, seed, max_norm):
    a, b = _pairs(shapes, [DTYPES[i] for i in dtype_idx], seed)
    na = torch.nn.utils.clip_grad_norm_(a, max_norm)
    nb = clip_grad_norm_(b, max_norm)
    assert bitwise_equal(na, nb)
    assert all(bitwise_equal(x.grad, y.grad) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_large_buckets(dtype):
    shapes = [(512, 512)] * 3 + [(1024, 256)] * 2 + [(7,), (), (1,), (0,)]
    a, b = _pairs(shapes, [dtype], 3)
    assert bitwise_equal(torch.nn.utils.clip_grad_norm_(a, 1.0), clip_grad_norm_(b, 1.0))
    assert all(bitwise_equal(x.grad, y.grad) for x, y in zip(a, b))


@pytest.mark.parametrize("norm_type", [1.0, 3.0, math.inf])
def test_clip_other_norm_types_exact(norm_type):
    a, b = _pairs([(64,), (64,), (5, 5)], [torch.float32], 5)
    na = torch.nn.utils.clip_grad_norm_(a, 1.0, norm_type=norm_type)
    nb = clip_grad_norm_(b, 1.0, norm_type=norm_type)
    assert bitwise_equal(na, nb)
    assert all(bitwise_equal(x.grad, y.grad) for x, y in zip(a, b))


def test_clip_none_grads_empty_and_single_tensor():
    a, b = _pairs([(64,), (64,), (3,)], [torch.float32], 1)
    a[1].grad = None
    b[1].grad = None
    assert bitwise_equal(torch.nn.utils.clip_grad_norm_(a, 1.0), clip_grad_norm_(b, 1.0))
    assert b[1].grad is None
    assert bitwise_equal(torch.nn.utils.clip_grad_norm_([], 1.0), clip_grad_norm_([], 1.0))
    x, y = _pairs([(10,)], [torch.float32], 2)
    assert bitwise_equal(torch.nn.utils.clip_grad_norm_(x[0], 0.1), clip_grad_norm_(y[0], 0.1))
    assert bitwise_equal(x[0].grad, y[0].grad)
    with pytest.warns(UserWarning, match="empty generator"):
        clip_grad_norm_((p for p in []), 1.0)


def test_clip_nonfinite():
    a, b = _pairs([(64,), (64,)], [torch.float32], 1)
    a[0].grad[3] = float("nan")
    b[0].grad[3] = float("nan")
    na, nb = torch.nn.utils.clip_grad_norm_(a, 1.0), clip_grad_norm_(b, 1.0)
    assert torch.isnan(na) and torch.isnan(nb)
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(b, 1.0, error_if_nonfinite=True)


# ---------------------------------------------------------------------------------- optimizer

SHAPES = [(256, 256), (3,), (5,), (1024, 256), (7, 9), (64,), (), (0,), (33,), (256, 256), (1,)]


def _run_pair(
    shapes,
    steps,
    dtype=torch.float32,
    *,
    amsgrad=False,
    maximize=False,
    wd=0.1,
    tensor_lr=False,
    clip=True,
    seed=0,
):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=wd, amsgrad=amsgrad, maximize=maximize, fused=True)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=wd, amsgrad=amsgrad, maximize=maximize)
    for step in range(steps):
        grads = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
        if step % 10 == 5:
            lr = 1e-2 / (1 + step)
            for o in (oa, ob):
                o.param_groups[0]["lr"] = torch.tensor(lr) if tensor_lr else lr
        torch.autograd.backward(a, grads)
        torch.autograd.backward(b, grads)  # AccumulateGrad into the zeroed (-0.0) flat buffer
        if clip:
            assert bitwise_equal(torch.nn.utils.clip_grad_norm_(a, 1.0), clip_grad_norm_(b, 1.0))
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
        for x, y in zip(a, b):
            assert bitwise_equal(x, y), f"step {step}"
    return a, b, oa, ob


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_packed_adamw_bitwise_120_steps(dtype):
    _run_pair(SHAPES, 120, dtype)


@pytest.mark.parametrize(
    "kw", [dict(amsgrad=True), dict(maximize=True), dict(wd=0.0), dict(tensor_lr=True), dict(clip=False)]
)
def test_packed_adamw_variants(kw):
    _run_pair(SHAPES, 100, **kw)


@settings(max_examples=10, deadline=None)
@given(shapes=shape_st, seed=st.integers(0, 1000))
def test_packed_adamw_random_shapes(shapes, seed):
    _run_pair(shapes, 30, seed=seed)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(amsgrad=True, tensor_lr=True),
        dict(maximize=True, wd=0.0),
        dict(dtype=torch.bfloat16),
        dict(dtype=torch.float64),
    ],
)
def test_fused_phase_bitwise_three_calls(kw):
    """clip_step_zero_grad == clip_grad_norm_ + step + zero_grad, bit for bit, over many small blocks
    (blocks of 16 KiB cut the large parameters into dozens), odd sizes in the tail block,
    a gradient missing now and then (the three-call fallback), 100 steps."""
    dtype = kw.pop("dtype", torch.float32)
    tensor_lr = kw.pop("tensor_lr", False)
    wd = kw.pop("wd", 0.1)
    gen = torch.Generator().manual_seed(7)
    init = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=wd, fused=True, **kw)
    # the buffer kept (-0.0 written by the phase; page release: tests/test_kernel.py, test_differential.py)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=wd, block_bytes=16384, release_grads=False, **kw)
    assert len(ob._blocks[0]) > 20
    blocked = 0
    for step in range(100):
        if step % 10 == 5:
            lr = 1e-2 / (1 + step)
            for o in (oa, ob):
                o.param_groups[0]["lr"] = torch.tensor(lr) if tensor_lr else lr
        missing = 1 if step == 90 else None  # after it, per-parameter steps: the three-call path
        for x, y, t in zip(a, b, init):
            g = (torch.randn(t.shape, generator=gen) * 3).to(dtype)
            g.view(-1)[:1] = -0.0  # backward can produce -0.0; accumulated into the buffer it must stay -0.0
            if missing is not None and x is a[missing]:
                continue
            torch.autograd.backward([x, y], [g, g])  # AccumulateGrad, the optimizer's hooks included
            assert bitwise_equal(x.grad, y.grad), f"step {step}"
        na = torch.nn.utils.clip_grad_norm_(a, 0.5)
        oa.step()
        oa.zero_grad()
        blocked += ob._pack.uniform_steps and missing is None
        nb = ob.clip_step_zero_grad(0.5)
        assert bitwise_equal(na, nb), f"step {step}"
        for x, y in zip(a, b):
            assert bitwise_equal(x, y), f"step {step}"
        for x, y in zip(a, b):
            assert bitwise_equal(oa.state[x]["exp_avg"], ob.state[y]["exp_avg"]), f"step {step}"
    assert blocked == 90
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[init[0].element_size()]
    g = ob.flat_groups[0].grad
    assert torch.equal(g.view(bits), torch.full_like(g, -0.0).view(bits))  # zeroed, ready for backward
    assert all(y.grad is None for y in b)  # as native's zero_grad() leaves them


def test_flat_mode_is_inexact_on_cpu_for_odd_sizes():
    """The named fast mode: a single flat call differs from native when sizes leave a scalar tail."""
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in [(3,), (5,), (13,), (64,)]]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=0.1, update="flat")
    differed = False
    for _ in range(100):
        gs = [torch.randn(t.shape, generator=gen) for t in init]
        for x, y, g in zip(a, b, gs):
            x.grad = g.clone()
            y.grad = g.clone()
        oa.step()
        ob.step()
        differed |= not all(bitwise_equal(x, y) for x, y in zip(a, b))
    assert differed


def test_zero_grad_as_native_and_params_are_views():
    """.grad None where native's is; backward accumulates into the flat buffer all the same."""
    p = [torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8))]
    opt = PackedAdamW(p, release_grads=False)  # the buffer kept: zero_grad writes -0.0
    g = opt.flat_groups[0]
    assert all(q.grad is None for q in p)
    torch.autograd.backward(p, [torch.ones_like(q) for q in p])
    lo, hi = g.grad.data_ptr(), g.grad.data_ptr() + g.grad.numel() * g.grad.element_size()
    # each gradient is in the flat buffer's memory, in a storage of its own (torch.save writes its bytes)
    assert all(lo <= q.grad.data_ptr() < hi for q in p)
    assert all(q.grad.untyped_storage().nbytes() == q.numel() * 4 for q in p)
    views = [q.grad for q in p]
    opt.zero_grad(set_to_none=False)
    assert all(q.grad is v and not v.any() for q, v in zip(p, views))
    opt.zero_grad(set_to_none=True)
    assert all(q.grad is None for q in p)
    # each parameter lives in the flat buffer's memory, in a storage of its own (checkpoint writers)
    base, end = g.param.data_ptr(), g.param.data_ptr() + g.param.numel() * 4
    assert all(base <= q.data_ptr() < end and q.untyped_storage().nbytes() == q.numel() * 4 for q in p)
    assert torch.equal(g.grad.view(torch.int32), torch.full_like(g.grad, -0.0).view(torch.int32))


def test_replaced_and_freed_grads():
    a = [torch.nn.Parameter(torch.randn(16)), torch.nn.Parameter(torch.randn(4))]
    b = [torch.nn.Parameter(t.detach().clone()) for t in a]
    oa = torch.optim.AdamW(a, lr=0.1, fused=True)
    ob = PackedAdamW(b, lr=0.1)
    g = torch.randn(16)
    a[0].grad = g.clone()
    b[0].grad = g.clone()  # replaced: copied into the flat buffer at the next step
    b[1].grad = None  # freed: no gradient this step
    oa.step()
    ob.step()
    assert bitwise_equal(a[0], b[0]) and bitwise_equal(a[1], b[1])
    assert b[0].grad.untyped_storage().data_ptr() == ob.flat_groups[0].grad.untyped_storage().data_ptr()
    with pytest.raises(RuntimeError, match="size"):
        b[0].grad = torch.randn(3)  # torch itself refuses; the view stays in place
    assert b[0].grad.untyped_storage().data_ptr() == ob.flat_groups[0].grad.untyped_storage().data_ptr()


def test_unused_parameter_untouched_and_tied_updated_once():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied
    unused = torch.nn.Linear(4, 4)
    na = copy.deepcopy(torch.nn.ModuleList([emb, head, unused]))
    nb = copy.deepcopy(na)
    oa = torch.optim.AdamW(list(na.parameters()), lr=0.1, fused=True)
    ob = PackedAdamW(list(nb.parameters()), lr=0.1)  # the tied weight is one parameter
    assert sum(len(g.index) for g in ob.flat_groups) == 3
    before = [p.detach().clone() for p in nb[2].parameters()]
    x = torch.tensor([1, 2, 3])
    for _ in range(5):
        for m, o in ((na, oa), (nb, ob)):
            o.zero_grad()
            m[1](m[0](x)).sum().backward()
            o.step()
    for p, q in zip(na.parameters(), nb.parameters()):
        assert bitwise_equal(p, q)
    assert all(bitwise_equal(p, q) for p, q in zip(nb[2].parameters(), before))
    assert nb[2].weight not in ob.state and na[2].weight not in oa.state  # no state without a gradient


def test_a_parameter_listed_twice_is_refused_since_native_updates_it_twice():
    """Native AdamW warns on a duplicate and then updates it twice per step (checked here); a
    packed parameter is one slot, so PackedAdamW refuses it before anything is modified."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    a, b = w.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with pytest.warns(UserWarning, match="duplicate parameters"):
        twice = torch.optim.AdamW([a, a], lr=0.1, fused=True)
    once = torch.optim.AdamW([b], lr=0.1, fused=True)
    for p, o in ((a, twice), (b, once)):
        p.grad = torch.ones(4)
        o.step()
    assert not bitwise_equal(a, b)  # native's duplicate is not a no-op
    before = w.detach().clone()
    with pytest.raises(ValueError, match=r"lists one parameter twice \(entries 0 and 2\)"):
        PackedAdamW([w, torch.nn.Parameter(torch.randn(2)), w], lr=0.1)
    assert bitwise_equal(w, before) and w.grad is None


def test_requirements_refused():
    p = torch.nn.Parameter(torch.randn(3))
    q = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match="more than one parameter group"):
        PackedAdamW([{"params": [p]}, {"params": [p, q]}])
    with pytest.raises(ValueError, match="floating-point"):
        PackedAdamW([torch.zeros(3, dtype=torch.long)])
    with pytest.raises(ValueError, match="dense"):
        PackedAdamW([torch.zeros(3).to_sparse().requires_grad_()])
    with pytest.raises(ValueError, match="leaf"):
        PackedAdamW([p * 2])
    emb = torch.nn.Embedding(5, 3, sparse=True)
    opt = PackedAdamW(emb.parameters())
    with pytest.raises(RuntimeError, match="dense gradients"):
        emb(torch.tensor([1])).sum().backward()
    lin = torch.nn.Linear(3, 1)
    opt2 = PackedAdamW(lin.parameters())
    with pytest.raises(RuntimeError, match="create_graph"):
        (lin(torch.randn(2, 3)) ** 2).sum().backward(create_graph=True)
    del opt, opt2


def test_state_dict_roundtrip_and_native_interop():
    gen = torch.Generator().manual_seed(4)
    init = [torch.randn(s, generator=gen) for s in [(64, 8), (5,), (16,)]]
    grads = [[torch.randn(t.shape, generator=gen) for t in init] for _ in range(40)]

    def train(params, opt, steps):
        for gs in steps:
            for p, g in zip(params, gs):
                p.grad = g.clone()
            opt.step()

    full = [t.clone().requires_grad_() for t in init]
    train(full, PackedAdamW(full, lr=1e-2, amsgrad=True), grads)
    for target_cls in ("packed", "native"):
        first = [t.clone().requires_grad_() for t in init]
        o1 = PackedAdamW(first, lr=1e-2, amsgrad=True)
        train(first, o1, grads[:20])
        sd = o1.state_dict()
        second = [p.detach().clone().requires_grad_() for p in first]
        if target_cls == "packed":
            o2 = PackedAdamW(second, lr=1e-2, amsgrad=True)
        else:
            o2 = torch.optim.AdamW(second, lr=1e-2, amsgrad=True, fused=True)
        o2.load_state_dict(sd)
        assert o2.param_groups[0]["fused"] is True
        train(second, o2, grads[20:])
        assert all(bitwise_equal(x, y) for x, y in zip(full, second)), target_cls
    # native -> packed
    n1 = [t.clone().requires_grad_() for t in init]
    on = torch.optim.AdamW(n1, lr=1e-2, amsgrad=True, fused=True)
    train(n1, on, grads[:20])
    n2 = [p.detach().clone().requires_grad_() for p in n1]
    op = PackedAdamW(n2, lr=1e-2, amsgrad=True)
    op.load_state_dict(on.state_dict())
    train(n2, op, grads[20:])
    assert all(bitwise_equal(x, y) for x, y in zip(full, n2))


# ---------------------------------------------------------------------------------- end to end


class _TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(256, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(96, 256, bias=False)

    def forward(self, x):
        return self.out(F.gelu(self.fc(self.ln(self.emb(x)))))


@pytest.mark.parametrize("arm", [a for a in ARMS if a != "native"])
def test_end_to_end_50_steps_bitwise(arm):
    torch.manual_seed(0)
    ref = _TinyLM()
    models = {"native": copy.deepcopy(ref), arm: copy.deepcopy(ref)}
    arms = {
        k: build_arm(k, m.parameters(), lr=3e-3, weight_decay=0.1, max_norm=0.5) for k, m in models.items()
    }
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        x = torch.randint(0, 256, (8, 17), generator=gen)
        losses = {}
        for k, m in models.items():
            loss = F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            arms[k].phase()
            losses[k] = loss.detach()
        assert bitwise_equal(losses["native"], losses[arm])
    for p, q in zip(models["native"].parameters(), models[arm].parameters()):
        assert bitwise_equal(p, q)


def test_only_the_candidate_runs_the_one_pass_phase(monkeypatch):
    calls = []
    original = PackedAdamW.clip_step_zero_grad

    def spy(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PackedAdamW, "clip_step_zero_grad", spy)
    for arm, expected in (("native", 0), ("bucketed", 0), ("packed", 0), ("cotangent", 1)):
        calls.clear()
        model = _TinyLM()
        a = build_arm(arm, model.parameters(), lr=1e-3, max_norm=0.5)
        model(torch.randint(0, 256, (2, 5))).sum().backward()
        a.phase()
        assert len(calls) == expected, arm
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())


@pytest.mark.process
def test_verify_cli_cpu():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "verify", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all paths the method uses are bitwise native" in r.stdout
    assert "PackedAdamW update=aligned + packed clip  float32   used" in r.stdout
    assert "... with backward_norms=True              float32   used                      bitwise" in r.stdout
    assert "... with backward_norms=True              float16   not used" in r.stdout  # not claimed there
