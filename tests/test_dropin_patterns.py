"""The training-code patterns where a drop-in must still give native's bits (issue 51): each one run
natively (``torch.optim.AdamW(fused=True)``, ``torch.nn.utils.clip_grad_norm_``) and packed from the
same weights and gradients, compared bit for bit (parameters, optimizer state, ``.grad`` presence),
or refused by name before anything is modified. Hypothesis draws shapes, groups, the gradient
modes (slots kept, released, norms in backward) and ``set_to_none`` both ways."""

from __future__ import annotations

import io
import pickle
from collections import defaultdict

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import cotangent.kernel as kernel
from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.verify import bitwise_equal, state_dict_difference

SHAPES = [(16, 8), (7, 3), (32,), (5,), (16,), (3, 16)]
MODES = {"kept": {}, "released": {"release_grads": True}, "backnorms": {"backward_norms": True}}
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def setups(draw: st.DrawFn) -> dict:
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=2, max_size=5))
    return {
        "shapes": shapes,
        "two_groups": draw(st.booleans()),
        "mode": draw(st.sampled_from(sorted(MODES))),
        "set_to_none": draw(st.booleans()),
        "phase": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
    }


def twins(s: dict):
    """Native and packed parameters from the same weights, and a generator for gradients."""
    gen = torch.Generator().manual_seed(s["seed"])
    init = [torch.randn(shape, generator=gen) for shape in s["shapes"]]
    return [t.clone().requires_grad_() for t in init], [t.clone().requires_grad_() for t in init], gen


def build(s: dict):
    """:func:`twins` and their optimizers (one or two groups)."""
    a, b, gen = twins(s)

    def groups(ps):
        if not s["two_groups"]:
            return [{"params": ps}]
        return [
            {"params": ps[::2], "weight_decay": 0.1},
            {"params": ps[1::2], "weight_decay": 0.0, "lr": 0.01},
        ]

    oa = torch.optim.AdamW(groups(a), lr=0.02, fused=True)
    ob = PackedAdamW(groups(b), lr=0.02, **MODES[s["mode"]])
    return a, b, oa, ob, gen


def grads_for(a, gen):
    return [torch.randn(x.shape, generator=gen) for x in a]


def finish(a, b, oa, ob, s):
    """clip, step and zero_grad natively; the same packed, as three calls or the one pass."""
    na = torch.nn.utils.clip_grad_norm_(a, 1.0)
    oa.step()
    oa.zero_grad(s["set_to_none"])
    if s["phase"]:
        nb = ob.clip_step_zero_grad(1.0, parameters=b, set_to_none=s["set_to_none"])
    else:
        nb = clip_grad_norm_(b, 1.0)
        ob.step()
        ob.zero_grad(s["set_to_none"])
    assert bitwise_equal(na, nb)


def check(a, b, oa, ob, where="", by_param=False):
    for i, (x, y) in enumerate(zip(a, b)):
        assert bitwise_equal(x.detach(), y.detach()), f"{where}: parameter {i} differs"
        assert (x.grad is None) == (y.grad is None), f"{where}: parameter {i} .grad presence"
        if x.grad is not None:
            assert bitwise_equal(x.grad, y.grad), f"{where}: parameter {i} .grad"
    if by_param:  # native's state_dict() raises KeyError for a parameter taken out of its groups
        for x, y in zip(a, b):
            assert sorted(oa.state[x]) == sorted(ob.state[y]), where
            assert all(bitwise_equal(oa.state[x][k], ob.state[y][k]) for k in oa.state[x]), where
        return
    assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, where


# -- 1. torch.autograd.grad over the parameters -------------------------------------------------
@FEW
@given(setups())
def test_autograd_grad_leaves_grad_none_and_assign_or_add_steps(s):
    """PCGrad / multi-task: gradients from ``torch.autograd.grad``, written with "assign if None,
    else add". Natively ``p.grad`` stays None after autograd.grad; on main it was a -0.0 slot, the
    add branch ran and the step dropped it (the weights never moved)."""
    a, b, oa, ob, gen = build(s)
    for step in range(3):
        tasks = [grads_for(a, gen) for _ in range(2)]
        for ps in (a, b):
            for c in tasks:
                loss = sum((p * ci).sum() for p, ci in zip(ps, c))
                gs = torch.autograd.grad(loss, ps)
                for p, g in zip(ps, gs):
                    if p.grad is None:
                        p.grad = g
                    else:
                        p.grad += g
        check(a, b, oa, ob, f"step {step} before the update")
        finish(a, b, oa, ob, s)
        check(a, b, oa, ob, f"step {step}")
    assert not bitwise_equal(b[0].detach(), build(s)[1][0].detach())  # the weights moved


def test_autograd_grad_alone_leaves_grad_none():
    for opt_kw in MODES.values():
        p = torch.randn(16, 4, requires_grad=True)
        opt = PackedAdamW([p], **opt_kw)
        torch.autograd.grad((p * 2).sum(), [p])
        assert p.grad is None
        (p * 3).sum().backward()  # a backward after it accumulates as natively
        assert bitwise_equal(p.grad, torch.full_like(p, 3.0)) and opt.state == {}


# -- 2. optimizer in backward, the hooks registered first -----------------------------------------
@FEW
@given(setups())
def test_optimizer_in_backward_hooks_registered_first(s):
    a, b, gen = twins(s)
    opts: dict = {}
    for ps, make in ((a, lambda p: torch.optim.AdamW([p], lr=0.02, fused=True)), (b, None)):
        for p in ps:

            def hook(p):
                opts[p].step()
                opts[p].zero_grad(s["set_to_none"])

            p.register_post_accumulate_grad_hook(hook)  # before the optimizers exist
        for p in ps:
            opts[p] = make(p) if make else PackedAdamW([p], lr=0.02, **MODES[s["mode"]])
    for step in range(3):
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        for i, (x, y) in enumerate(zip(a, b)):
            assert bitwise_equal(x.detach(), y.detach()), f"step {step} parameter {i}"
            assert (x.grad is None) == (y.grad is None)
            assert state_dict_difference(opts[x].state_dict(), opts[y].state_dict()) is None


# -- 3. resetting optimizer state -----------------------------------------------------------------
RESETS = ["clear", "new_dict", "del_one", "exp_avg_zeros", "step_zero", "exp_avg_sq_ones", "step_number"]


def reset(opt, ps, how):
    p = ps[0]
    if how == "clear":
        opt.state.clear()
    elif how == "new_dict":
        opt.state = defaultdict(dict)
    elif how == "del_one":
        del opt.state[p]
    elif how == "exp_avg_zeros":
        opt.state[p]["exp_avg"] = torch.zeros_like(p)
    elif how == "step_zero":
        opt.state[p]["step"] = torch.tensor(0.0)
    elif how == "exp_avg_sq_ones":
        opt.state[p]["exp_avg_sq"] = torch.ones_like(p)
    elif how == "step_number":
        opt.state[p]["step"] = torch.tensor(1.0)


@FEW
@given(setups(), st.sampled_from(RESETS), st.integers(1, 2))
def test_state_reset_restarts_as_native(s, how, at):
    a, b, oa, ob, gen = build(s)
    for step in range(4):
        if step == at:
            reset(oa, a, how)
            reset(ob, b, how)
            assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        finish(a, b, oa, ob, s)
        check(a, b, oa, ob, f"{how} at {at}, step {step}")
        assert all(float(oa.state[x]["step"]) == float(ob.state[y]["step"]) for x, y in zip(a, b))


def test_state_entry_emptied_key_refused_before_anything_moves():
    p = torch.randn(8, 4, requires_grad=True)
    opt = PackedAdamW([p])
    p.grad = torch.ones_like(p)
    opt.step()
    del opt.state[p]["exp_avg"]
    before = p.detach().clone()
    with pytest.raises(RuntimeError, match="lacks \\['exp_avg'\\]"):
        opt.step()
    assert bitwise_equal(before, p.detach())
    opt.state[p]["exp_avg"] = torch.zeros(3)
    with pytest.raises(RuntimeError, match="was replaced by \\(3,\\)"):
        opt.step()
    assert bitwise_equal(before, p.detach())


# -- 4. a view of a parameter taken before the optimizer is built ---------------------------------
@pytest.mark.parametrize("kind", ["detach", "transpose", "parameter_of"])
def test_view_taken_before_packing_refused_before_anything_moves(kind):
    t = torch.randn(6, 4)
    p = torch.nn.Parameter(t) if kind == "parameter_of" else torch.nn.Parameter(t.clone())
    handle = {"detach": lambda: p.detach(), "transpose": lambda: p.t(), "parameter_of": lambda: t}[kind]()
    q = torch.nn.Parameter(torch.randn(5))
    ptrs = (p.data_ptr(), q.data_ptr())
    with pytest.raises(ValueError, match="shares its memory.*view taken before the optimizer"):
        PackedAdamW([q, p])
    assert (p.data_ptr(), q.data_ptr()) == ptrs  # nothing packed
    assert handle.data_ptr() == p.data_ptr()


@FEW
@given(setups())
def test_view_taken_after_packing_follows_the_steps(s):
    a, b, oa, ob, gen = build(s)
    va, vb = [x.detach() for x in a], [y.detach() for y in b]  # an EMA's or a logger's handles
    for step in range(2):
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        finish(a, b, oa, ob, s)
        assert all(bitwise_equal(x, y) for x, y in zip(va, vb)), f"step {step}"
        assert all(bitwise_equal(x, y.detach()) for x, y in zip(vb, b))


# -- 5. a .grad kept across zero_grad() -----------------------------------------------------------
@FEW
@given(setups(), st.booleans())
def test_grad_kept_across_zero_grad_stays_the_users(s, model_zero):
    a, b, oa, ob, gen = build(s)
    for step in range(3):
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        kept_a, kept_b = [x.grad for x in a], [y.grad for y in b]  # logging without a clone
        if model_zero:  # the model's zero_grad (set_to_none) after the optimizer's step
            torch.nn.utils.clip_grad_norm_(a, 1.0)
            clip_grad_norm_(b, 1.0)
            oa.step()
            ob.step()
            for x, y in zip(a, b):
                x.grad = None
                y.grad = None
        else:
            finish(a, b, oa, ob, s)
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        for i, (ka, kb) in enumerate(zip(kept_a, kept_b)):
            assert bitwise_equal(ka, kb), f"step {step}: kept gradient {i}"
            assert (ka is a[i].grad) == (kb is b[i].grad)
        check(a, b, oa, ob, f"step {step}")
        finish(a, b, oa, ob, s)
        check(a, b, oa, ob, f"step {step} after")
        del kept_a, kept_b


# -- 6. param_groups changed in place -------------------------------------------------------------
@FEW
@given(setups(), st.sampled_from(["append", "pop", "reverse", "replace_list"]))
def test_param_groups_changed_in_place(s, how):
    s = {**s, "two_groups": True}
    a, b, oa, ob, gen = build(s)
    extra = torch.randn(4, 4, generator=gen)
    xa, xb = extra.clone().requires_grad_(), extra.clone().requires_grad_()
    for step in range(4):
        if step == 1:
            for opt, x in ((oa, xa), (ob, xb)):
                if how == "append":
                    opt.param_groups[1]["params"].append(x)
                elif how == "pop":
                    opt.param_groups[0]["params"].pop()
                elif how == "reverse":
                    opt.param_groups.reverse()
                else:
                    opt.param_groups[0]["params"] = list(opt.param_groups[0]["params"]) + [x]
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        g = torch.randn(4, 4, generator=gen)
        xa.grad, xb.grad = g.clone(), g.clone()
        na = torch.nn.utils.clip_grad_norm_(a, 1.0)
        nb = clip_grad_norm_(b, 1.0)
        oa.step()
        ob.step()
        oa.zero_grad(s["set_to_none"])
        ob.zero_grad(s["set_to_none"])
        assert bitwise_equal(na, nb)
        check(a + [xa], b + [xb], oa, ob, f"{how}, step {step}", by_param=how == "pop")


def test_param_groups_put_twice_or_incomplete_refused():
    ps = [torch.randn(4, requires_grad=True) for _ in range(2)]
    opt = PackedAdamW([{"params": [ps[0]]}, {"params": [ps[1]]}])
    opt.param_groups[1]["params"].append(ps[0])
    with pytest.raises(ValueError, match="in parameter groups 0 and 1"):
        opt.step()
    opt.param_groups[1]["params"].pop()
    opt.param_groups.append({"params": [torch.randn(3, requires_grad=True)]})
    with pytest.raises(KeyError, match="lacks"):
        opt.step()


# -- loud gaps: keyword arguments, named parameters, pickling, dtype changes, torch.compile --------
def test_native_keyword_arguments_taken_or_refused_by_name():
    a = [torch.randn(8, 4, requires_grad=True)]
    b = [a[0].detach().clone().requires_grad_()]
    oa = torch.optim.AdamW(a, fused=True)
    ob = PackedAdamW(b, fused=True, foreach=None, capturable=False, differentiable=False)
    for _ in range(2):
        g = torch.randn(8, 4)
        a[0].grad, b[0].grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    assert bitwise_equal(a[0].detach(), b[0].detach())
    PackedAdamW([torch.randn(3, requires_grad=True)], foreach=False, fused=None)
    for key, value in (("fused", False), ("foreach", True), ("capturable", True), ("differentiable", True)):
        p = torch.randn(3, requires_grad=True)
        ptr = p.data_ptr()
        with pytest.raises(ValueError, match=f"{key}={value}"):
            PackedAdamW([p], **{key: value})
        assert p.data_ptr() == ptr


def test_named_parameters_as_native():
    torch.manual_seed(0)
    ma = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    mb = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    mb.load_state_dict(ma.state_dict())
    named = lambda m: [  # noqa: E731
        {"params": [(n, p) for n, p in m.named_parameters() if n.endswith("weight")]},
        {"params": [(n, p) for n, p in m.named_parameters() if n.endswith("bias")], "weight_decay": 0.0},
    ]
    oa = torch.optim.AdamW(named(ma), fused=True)
    ob = PackedAdamW(named(mb))
    assert [g["param_names"] for g in oa.param_groups] == [g["param_names"] for g in ob.param_groups]
    x = torch.randn(4, 6)
    for _ in range(2):
        ma(x).square().sum().backward()
        mb(x).square().sum().backward()
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
    check(list(ma.parameters()), list(mb.parameters()), oa, ob)
    assert oa.state_dict()["param_groups"] == ob.state_dict()["param_groups"]
    flat = PackedAdamW(torch.nn.Linear(3, 2).named_parameters())
    assert flat.param_groups[0]["param_names"] == ["weight", "bias"]


def test_pickling_refused_by_name():
    opt = PackedAdamW([torch.randn(4, requires_grad=True)])
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(opt)
    with pytest.raises(TypeError, match="cannot be pickled"):
        torch.save(opt, io.BytesIO())
    p = opt.param_groups[0]["params"][0]
    p.grad = torch.ones(4)
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)  # the state dict is plain: loads with weights_only
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["state"][0]["step"] == 1


@pytest.mark.parametrize("convert", ["double", "half", "to_bfloat16"])
def test_dtype_change_after_construction_named(convert):
    m = torch.nn.Linear(4, 3)
    opt = PackedAdamW(m.parameters())
    {"double": m.double, "half": m.half, "to_bfloat16": lambda: m.to(torch.bfloat16)}[convert]()
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(RuntimeError, match="was converted to torch.*model.double\\(\\), .half\\(\\)"):
        m(torch.randn(2, 4, dtype=m.weight.dtype)).sum().backward()
    with pytest.raises(RuntimeError, match="was converted to"):
        opt.step()
    assert all(bitwise_equal(x, y.detach()) for x, y in zip(before, m.parameters()))


def test_compiled_phase_runs_as_the_three_calls():
    s = {"shapes": [(16, 8), (7, 3), (32,)], "two_groups": False, "mode": "kept", "seed": 0}
    a, b, oa, ob, gen = build(s)
    kernel.reset()  # the phase's first use (its self-check) happens inside the compiled call
    phase = torch.compile(ob.clip_step_zero_grad)
    for step in range(2):
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        na = torch.nn.utils.clip_grad_norm_(a, 1.0)
        oa.step()
        oa.zero_grad()
        assert bitwise_equal(na, phase(1.0))
        check(a, b, oa, ob, f"step {step}")


@pytest.mark.parametrize("relayout", ["add_param_group", "load_state_dict"])
def test_view_taken_after_packing_survives_a_new_layout(relayout):
    """``add_param_group`` and ``load_state_dict`` lay the groups out again; a group laid out the same
    keeps its memory, so a handle taken after construction still follows every step."""
    s = {
        "shapes": [(16, 8), (7, 3), (32,)],
        "two_groups": True,
        "mode": "kept",
        "seed": 1,
        "set_to_none": True,
    }
    a, b, oa, ob, gen = build(s)
    va, vb = [x.detach() for x in a], [y.detach().t() if y.dim() == 2 else y.detach() for y in b]
    extra = torch.randn(5, generator=gen)
    xa, xb = extra.clone().requires_grad_(), extra.clone().requires_grad_()
    for step in range(3):
        if step == 1 and relayout == "add_param_group":
            oa.add_param_group({"params": [xa], "lr": 0.05})
            ob.add_param_group({"params": [xb], "lr": 0.05})
        if step == 1 and relayout == "load_state_dict":
            oa.load_state_dict(oa.state_dict())
            ob.load_state_dict(ob.state_dict())
        gs = grads_for(a, gen)
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        xa.grad, xb.grad = extra.clone(), extra.clone()
        for opt in (oa, ob):
            opt.step()
            opt.zero_grad()
        check(a + [xa], b + [xb], oa, ob, f"step {step}")
        for x, y in zip(va, vb):
            assert bitwise_equal(x, y.t() if y.dim() == 2 else y), f"step {step}: the handle kept old weights"
