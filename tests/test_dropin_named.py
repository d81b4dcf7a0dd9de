"""Failures that name their cause: a second optimizer over the same parameters, a state dict that
does not fit position by position (all or nothing), a memory-format conversion after packing."""

from __future__ import annotations

import copy
import gc

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from cotangent import PackedAdamW
from cotangent.verify import bitwise_equal, state_dict_difference

FEW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHAPES = [(10, 8), (10,), (3, 10), (3,)]


def params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_() for s in SHAPES]


def train(ps: list[torch.Tensor], opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in ps:
            p.grad = None
        torch.autograd.backward(ps, [torch.randn(p.shape, generator=gen) for p in ps])
        torch.nn.utils.clip_grad_norm_(ps, 1.0)
        opt.step()
        opt.zero_grad()


def same(a: list[torch.Tensor], b: list[torch.Tensor], oa, ob, where: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        assert bitwise_equal(x.detach(), y.detach()), f"{where}: parameter {i}"
    assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, where


# -- a second optimizer over the same parameters ------------------------------------------------
def test_second_optimizer_while_the_first_lives_refused_before_anything_moves():
    m = torch.nn.Sequential(torch.nn.Linear(8, 10), torch.nn.Linear(10, 3))
    first = PackedAdamW(m.parameters(), lr=0.01)
    m(torch.randn(4, 8)).sum().backward()
    first.step()
    held = {name: p.detach().clone() for name, p in m.named_parameters()}
    ptrs = [p.data_ptr() for p in m.parameters()]
    with pytest.raises(RuntimeError, match="another PackedAdamW already holds these parameters"):
        PackedAdamW(m.parameters(), lr=0.01)
    assert [p.data_ptr() for p in m.parameters()] == ptrs  # nothing was moved
    assert all(bitwise_equal(held[n], p.detach()) for n, p in m.named_parameters())
    second = PackedAdamW([torch.zeros(2, requires_grad=True)])
    with pytest.raises(RuntimeError, match="another PackedAdamW already holds these parameters"):
        second.add_param_group({"params": [m[0].weight]})
    assert len(second.param_groups) == 1
    first.zero_grad()  # the first keeps working
    m(torch.randn(4, 8)).sum().backward()
    first.step()


@pytest.mark.parametrize("cycle", [False, True])
def test_second_optimizer_after_the_first_is_dropped_is_native(cycle):
    """The first dropped (or left only in a reference cycle): the second packs, bitwise native."""
    a, b = params(1), params(1)
    oa = torch.optim.AdamW(a, lr=0.01, fused=True)
    first = PackedAdamW(b, lr=0.01)
    train(a, oa, 2, 5)
    train(b, first, 2, 5)
    if cycle:
        first.me = first  # type: ignore[attr-defined]
    del first
    oa = torch.optim.AdamW(a, lr=0.01, fused=True)
    ob = PackedAdamW(b, lr=0.01)
    train(a, oa, 3, 6)
    train(b, ob, 3, 6)
    same(a, b, oa, ob, "after the second optimizer")
    gc.collect()


# -- state dicts: all or nothing ----------------------------------------------------------------
def swapped(sd: dict) -> dict:
    out = copy.deepcopy(sd)
    out["state"][0], out["state"][1] = out["state"][1], out["state"][0]
    out["param_groups"][0]["lr"] = 0.5
    return out


def bad_step(sd: dict) -> dict:
    out = copy.deepcopy(sd)
    out["state"][2]["step"] = torch.tensor([3.0, 3.0])
    out["param_groups"][0]["lr"] = 0.5
    return out


def missing_key(sd: dict) -> dict:
    out = copy.deepcopy(sd)
    out["param_groups"][0]["lr"] = 0.5
    del out["state"][3]["exp_avg_sq"]
    return out


def integer_moment(sd: dict) -> dict:
    out = copy.deepcopy(sd)
    out["state"][1]["exp_avg"] = out["state"][1]["exp_avg"].to(torch.int64)
    return out


def fewer_params(sd: dict) -> dict:
    out = copy.deepcopy(sd)
    out["param_groups"][0]["params"] = out["param_groups"][0]["params"][:-1]
    return out


def amsgrad_without_maximum(sd: dict) -> dict:
    out = copy.deepcopy(sd)
    out["param_groups"][0]["amsgrad"] = True
    return out


BAD = {
    "swapped": (swapped, r"group 0, parameter 0 .*exp_avg has shape \(10,\).*parameter shape \(10, 8\)"),
    "bad_step": (bad_step, r"group 0, parameter 2 .*step is a tensor of shape \(2,\)"),
    "missing_key": (missing_key, r"group 0, parameter 3 .*lacks \['exp_avg_sq'\]"),
    "integer_moment": (integer_moment, r"group 0, parameter 1 .*exp_avg has .*torch.int64"),
    "fewer_params": (fewer_params, r"param_groups'\]\[0\] has 3 parameters, the optimizer's group 0 4"),
    "amsgrad": (amsgrad_without_maximum, r"group 0, parameter 0 .*lacks \['max_exp_avg_sq'\]"),
}


@FEW
@given(st.sampled_from(sorted(BAD)), st.integers(1, 3), st.sampled_from([{}, {"backward_norms": True}]))
def test_failed_load_leaves_the_optimizer_as_it_was(kind, steps, mode):
    """A state dict that does not fit is refused naming the first mismatch, and the optimizer is
    exactly its untouched twin's: every state tensor, the groups, and the next steps' bits."""
    a, b = params(2), params(2)
    oa, ob = PackedAdamW(a, lr=0.01, **mode), PackedAdamW(b, lr=0.01, **mode)
    train(a, oa, steps, 7)
    train(b, ob, steps, 7)
    mutate, message = BAD[kind]
    with pytest.raises(ValueError, match=message):
        ob.load_state_dict(mutate(ob.state_dict()))
    same(a, b, oa, ob, "after the refused load")
    assert ob.param_groups[0]["lr"] == 0.01
    train(a, oa, 2, 8)
    train(b, ob, 2, 8)
    same(a, b, oa, ob, "the steps after the refused load")


def test_load_into_native_and_packed_alike_when_it_fits():
    """The checks refuse nothing native loads and steps: a native state dict, then two steps."""
    a, b = params(3), params(3)
    oa = torch.optim.AdamW(a, lr=0.01, fused=True)
    train(a, oa, 2, 9)
    ob = PackedAdamW(b, lr=0.01)
    with torch.no_grad():
        for x, y in zip(a, b):
            y.copy_(x)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # natively the tensors become ob's: shared with oa
    train(a, oa, 2, 10)
    train(b, ob, 2, 10)
    same(a, b, oa, ob, "after loading native's state dict")


# -- memory format -------------------------------------------------------------------------------
def test_memory_format_conversion_after_construction_named():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 2, 1))
    opt = PackedAdamW(m.parameters())
    m.to(memory_format=torch.channels_last)
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(RuntimeError, match="converted to another memory format .*channels_last"):
        m(torch.randn(1, 3, 6, 6)).sum().backward()
    with pytest.raises(RuntimeError, match="converted to another memory format"):
        opt.step()
    assert all(bitwise_equal(x, y.detach()) for x, y in zip(before, m.parameters()))


# -- torch.compile: the whole train step -------------------------------------------------------
def compiled_step(m: torch.nn.Module, opt, how: str):
    """One ``torch.compile``-d train step: forward, backward, clip, step, zero_grad."""
    from cotangent import clip_grad_norm_

    if how == "armed":
        opt.clip_in_step(1.0, parameters=list(m.parameters()))

    @torch.compile
    def step(x, y):
        def closure():
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            return loss

        if how == "closure":  # the step runs the closure (forward and backward), then the update
            loss = opt.step(closure)
            opt.zero_grad()
            return loss.detach(), loss.detach()
        loss = closure()
        if how == "phase":
            total = opt.clip_step_zero_grad(1.0, parameters=m.parameters())
        elif how == "armed":
            opt.step()
            opt.zero_grad()
            total = opt.last_total_norm
        else:
            clip = torch.nn.utils.clip_grad_norm_ if how == "native_clip" or opt is None else clip_grad_norm_
            total = clip(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        return loss.detach(), total

    return step


def net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 33), torch.nn.GELU(), torch.nn.Linear(33, 5))


@pytest.mark.process
@pytest.mark.parametrize("how", ["three", "native_clip", "phase", "armed", "closure"])
def test_compiled_train_step_gives_compiled_natives_bits(how):
    """The whole train step under ``torch.compile``: compiled native's bits (the total norm from
    Inductor's kernels, not eager ones), parameters, gradients and state, step by step."""
    torch._dynamo.reset()
    ma, mb = net(0), net(0)
    oa = torch.optim.AdamW(ma.parameters(), lr=0.01, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.01)
    native = compiled_step(ma, oa, "closure" if how == "closure" else "native_clip")
    packed = compiled_step(mb, ob, how)
    gen = torch.Generator().manual_seed(1)
    for s in range(6):
        x, y = torch.randn(16, 12, generator=gen), torch.randn(16, 5, generator=gen)
        (la, na), (lb, nb) = native(x, y), packed(x, y)
        assert bitwise_equal(la, lb) and bitwise_equal(na, nb), f"step {s}: norm {float(na)!r} {float(nb)!r}"
        for i, (p, q) in enumerate(zip(ma.parameters(), mb.parameters())):
            assert bitwise_equal(p.detach(), q.detach()), f"step {s}: parameter {i}"
            assert p.grad is None and q.grad is None, f"step {s}: parameter {i} .grad"
        assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, f"step {s}"


# -- generated: the same patterns over drawn shapes, modes and moments -------------------------
shapes_st = st.lists(st.sampled_from([(4, 3), (3,), (4,), (2, 3, 2), (6,)]), min_size=2, max_size=5)


def drawn(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen) for s in shapes]
    return [t.clone().requires_grad_() for t in init], [t.clone().requires_grad_() for t in init]


def packed_in(ps, mode):
    """A PackedAdamW over ``ps`` in ``mode``; ``"auto"`` decides native for good at its first
    iteration's end (a chooser that times nothing)."""
    opt = PackedAdamW(ps, lr=0.01, mode="auto" if mode == "auto" else mode)
    if mode == "auto":
        opt._chooser = Decides("native")
    return opt


class Decides:
    def __init__(self, final):
        self.final, self.decided, self.report, self.sync = final, None, None, None

    def tick(self, current):
        self.decided, self.report = self.final, f"decided: {self.final}"
        return self.final


@FEW
@given(
    shapes_st,
    st.sampled_from(["packed", "auto", "native"]),
    st.integers(0, 2),
    st.booleans(),
    st.integers(0, 99),
)
@pytest.mark.filterwarnings("ignore:decided")
def test_a_second_optimizer_is_refused_or_native(shapes, mode, steps, subset, seed):
    """A second PackedAdamW over (some of) the parameters of a live one: where the first holds them
    packed, refused naming "another PackedAdamW already holds these parameters" before anything
    moves (the first's parameters, gradients and state its native twin's, and its next steps too);
    where the first is native for good (as native, nothing holds them), both step them, bit for
    bit two native ``AdamW(fused=True)`` over the same parameters."""
    a, b = drawn(shapes, seed)
    oa = torch.optim.AdamW(a, lr=0.01, fused=True)
    ob = packed_in(b, mode)
    train(a, oa, steps + 1, seed)
    train(b, ob, steps + 1, seed)
    pick = slice(0, 1) if subset else slice(None)
    if not ob._own:
        before = [p.data_ptr() for p in b]
        with pytest.raises(RuntimeError, match="another PackedAdamW already holds these parameters"):
            PackedAdamW(b[pick], lr=0.02)
        assert [p.data_ptr() for p in b] == before
        same(a, b, oa, ob, "after the refused second optimizer")
        train(a, oa, 2, seed + 1)
        train(b, ob, 2, seed + 1)
        same(a, b, oa, ob, "the first's steps after it")
        return
    oa2 = torch.optim.AdamW(a[pick], lr=0.02, fused=True)
    ob2 = PackedAdamW(b[pick], lr=0.02, mode="packed")
    gen = torch.Generator().manual_seed(seed + 2)
    for s in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in a]
        for ps, opts in ((a, (oa, oa2)), (b, (ob, ob2))):
            torch.autograd.backward(ps, grads)
            torch.nn.utils.clip_grad_norm_(ps, 1.0)
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad()
        same(a, b, oa, ob, f"step {s}: the first")
        same(a[pick], b[pick], oa2, ob2, f"step {s}: the second")


@FEW
@given(
    shapes_st,
    st.randoms(use_true_random=False),
    st.sampled_from(["packed", "auto", "native"]),
    st.integers(1, 3),
    st.integers(0, 99),
)
@pytest.mark.filterwarnings("ignore:decided")
def test_a_state_dict_in_another_order_loads_all_or_nothing(shapes, rnd, mode, steps, seed):
    """Native's state dict with its parameters in another order (a model whose parameters were
    reordered): where every moment still has its parameter's shape, it loads as natively and the
    steps after are native's bits (native loads it too); otherwise refused naming the first
    parameter whose shapes differ, and the optimizer is exactly its untouched twin (state, groups,
    the next steps' bits)."""
    a, b = drawn(shapes, seed)
    _, c = drawn(shapes, seed)
    oa = torch.optim.AdamW(a, lr=0.01, fused=True)
    ob, oc = packed_in(b, mode), packed_in(c, mode)
    for ps, o in ((a, oa), (b, ob), (c, oc)):
        train(ps, o, steps, seed)
    order = list(range(len(shapes)))
    rnd.shuffle(order)
    sd = oa.state_dict()
    moved = copy.deepcopy(sd)
    moved["state"] = {i: copy.deepcopy(sd["state"][order[i]]) for i in range(len(shapes))}
    moved["param_groups"][0]["lr"] = 0.5
    misfit = [i for i in range(len(shapes)) if shapes[order[i]] != shapes[i]]
    if not misfit:
        oa.load_state_dict(copy.deepcopy(moved))
        ob.load_state_dict(copy.deepcopy(moved))
        train(a, oa, 2, seed + 1)
        train(b, ob, 2, seed + 1)
        same(a, b, oa, ob, "after loading the reordered state dict")
        return
    with pytest.raises(
        ValueError, match=rf"group 0, parameter {misfit[0]} .*exp_avg has shape .*nothing was loaded"
    ):
        ob.load_state_dict(moved)
    same(c, b, oc, ob, "after the refused load")
    assert ob.param_groups[0]["lr"] == 0.01
    train(c, oc, 2, seed + 1)
    train(b, ob, 2, seed + 1)
    same(c, b, oc, ob, "the steps after the refused load")


@FEW
@given(
    st.lists(st.tuples(st.integers(1, 6), st.sampled_from([1, 3])), min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from(["packed", "auto", "native"]),
    st.integers(0, 99),
)
@pytest.mark.filterwarnings("ignore:decided")
def test_a_memory_format_conversion_is_named_or_native(convs, start_last, mode, seed):
    """``model.to(memory_format=...)`` after the optimizer was built, from contiguous to
    channels_last or back: where the layout is packed, refused at the next backward and step,
    naming the memory-format conversion, nothing modified; native for good, native's bits and
    strides over the steps after (native converts the same model)."""

    def model():
        torch.manual_seed(seed)
        layers, c = [], 3
        for width, k in convs:
            layers.append(torch.nn.Conv2d(c, width, k, padding=k // 2))
            c = width
        m = torch.nn.Sequential(*layers)
        return m.to(memory_format=torch.channels_last) if start_last else m

    ma, mb = model(), model()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.01, fused=True)
    ob = packed_in(list(mb.parameters()), mode)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, 5, generator=gen)
    for m, o in ((ma, oa), (mb, ob)):
        m(x).square().mean().backward()
        o.step()
        o.zero_grad()
    target = torch.contiguous_format if start_last else torch.channels_last
    strides = [p.stride() for p in ma.parameters()]
    ma.to(memory_format=target)
    mb.to(memory_format=target)
    converted = [p.stride() for p in ma.parameters()] != strides
    if converted and not ob._own:
        before = [p.detach().clone() for p in mb.parameters()]
        with pytest.raises(RuntimeError, match="converted to another memory format"):
            mb(x).square().mean().backward()
        with pytest.raises(RuntimeError, match="converted to another memory format"):
            ob.step()
        assert all(bitwise_equal(u, v.detach()) for u, v in zip(before, mb.parameters()))
        return
    for s in range(3):
        for m, o in ((ma, oa), (mb, ob)):
            m(x * (s + 2)).square().mean().backward()
            o.step()
            o.zero_grad()
        for i, (p, q) in enumerate(zip(ma.parameters(), mb.parameters())):
            assert p.stride() == q.stride() and bitwise_equal(p.detach(), q.detach()), (
                f"step {s}: parameter {i}"
            )
        assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, f"step {s}"
