"""PackedAdamW and clip_grad_norm_ as drop-ins: the behaviours PyTorch's own optimizer and clipping
tests exercise (test_optim.py, common_optimizers.py's optim_inputs_func_adamw and its error inputs,
test_nn.py's test_clip_grad_norm), each with native's bits or an error naming the reason before
anything is modified. Gradients come from backward and, separately, are written directly."""

from __future__ import annotations

import copy

import pytest
import torch

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.verify import bitwise_equal

SHAPES = [(64, 32), (64, 32), (32,), (7, 3), (5,), (128,)]


def pair(shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen) for s in shapes]
    return [t.clone().requires_grad_() for t in init], [t.clone().requires_grad_() for t in init], gen


def same(xs, ys):
    return all(bitwise_equal(x.detach(), y.detach()) for x, y in zip(xs, ys))


# the optim_inputs_func_adamw grid (CPU rows), as keyword arguments of both optimizers
GRID = [
    {},
    {"lr": 0.01},
    {"lr": torch.tensor(0.001)},
    {"weight_decay": 0.1},
    {"weight_decay": 0.1, "maximize": True},
    {"weight_decay": 0.1, "amsgrad": True},
    {"betas": (torch.tensor(0.9), torch.tensor(0.99))},
    {"betas": (torch.tensor([0.9]), torch.tensor([0.99]))},
    {"lr": torch.tensor(0.001), "amsgrad": True},
    {"eps": 1e-6, "betas": (0.5, 0.9)},
]


@pytest.mark.parametrize("kw", GRID, ids=[str(i) for i in range(len(GRID))])
@pytest.mark.parametrize("source", ["backward", "written"])
def test_adamw_grid_bitwise(kw, source):
    a, b, gen = pair()
    oa = torch.optim.AdamW(a, fused=True, **copy.deepcopy(kw))
    ob = PackedAdamW(b, **copy.deepcopy(kw))
    for step in range(6):
        grads = [torch.randn(x.shape, generator=gen) for x in a]
        if source == "backward":
            torch.autograd.backward(a, grads)
            torch.autograd.backward(b, grads)
        else:
            for x, y, g in zip(a, b, grads):  # assigned, no backward (torch.func, a gradient from elsewhere)
                x.grad = g.clone()
                y.grad = g.clone()
        na = torch.nn.utils.clip_grad_norm_(a, 1.0)
        if step % 2:
            nb = clip_grad_norm_(b, 1.0)
            ob.step()
            ob.zero_grad()
        else:
            nb = ob.clip_step_zero_grad(1.0)
        oa.step()
        oa.zero_grad()
        assert bitwise_equal(na, nb) and same(a, b), f"step {step}"
        for x, y in zip(a, b):
            assert all(bitwise_equal(oa.state[x][k], ob.state[y][k]) for k in oa.state[x])


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"lr": -1e-2}, "Invalid learning rate"),
        ({"lr": torch.tensor([0.001, 0.001])}, "Tensor lr must be 1-element"),
        ({"betas": (0.9, torch.tensor(0.99))}, "betas must be either both floats or both Tensors"),
        ({"betas": (1.0, 0.99)}, "Invalid beta parameter at index 0"),
        ({"eps": -1.0}, "Invalid epsilon value"),
        ({"weight_decay": -1.0}, "Invalid weight_decay value"),
    ],
)
def test_error_inputs_as_native_and_nothing_modified(kw, message):
    p = torch.nn.Parameter(torch.randn(4, 4))
    ptr = p.data_ptr()
    with pytest.raises(ValueError, match=message):
        torch.optim.AdamW([p], fused=True, **kw)
    with pytest.raises(ValueError, match=message):
        PackedAdamW([p], **kw)
    assert p.data_ptr() == ptr and p.grad is None


def test_in_place_gradients_count_and_clip():
    """Gradients overwritten in place after backward (an all-reduce), a -0.0 one among them; .grad None
    after zero_grad, as natively, so nothing can be written into a gradient that does not exist."""
    a, b, gen = pair()
    oa, ob = torch.optim.AdamW(a, fused=True), PackedAdamW(b)
    for _ in range(3):
        assert all(x.grad is None for x in a) and all(y.grad is None for y in b)
        gs = [torch.randn(x.shape, generator=gen) for x in a]
        gs[4].zero_().neg_()  # a gradient of -0.0 written in place still counts
        torch.autograd.backward(a, [torch.ones_like(x) for x in a])
        torch.autograd.backward(b, [torch.ones_like(y) for y in b])
        for x, y, g in zip(a, b, gs):
            x.grad.copy_(g)
            y.grad.copy_(g)
        na, nb = torch.nn.utils.clip_grad_norm_(a, 0.5), clip_grad_norm_(b, 0.5)
        assert float(nb) > 0 and bitwise_equal(na, nb)
        oa.step(), ob.step(), oa.zero_grad(), ob.zero_grad()
        assert same(a, b)


def test_zero_grad_set_to_none_false_steps_unused_layers():
    torch.manual_seed(0)
    na = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
    nb = copy.deepcopy(na)
    oa = torch.optim.AdamW(na.parameters(), lr=0.1, weight_decay=0.1, fused=True)
    ob = PackedAdamW(nb.parameters(), lr=0.1, weight_decay=0.1)
    for step in range(6):
        x = torch.randn(4, 8)
        for m, o in ((na, oa), (nb, ob)):
            h = m[0](x)
            h = m[1](h) if step % 3 == 0 else m[2](h)  # an expert used only on some steps
            h.sum().backward()
            o.step()
            o.zero_grad(set_to_none=False)
        assert same(na.parameters(), nb.parameters()), f"step {step}"
        assert all(
            bitwise_equal(p.grad, q.grad)
            for p, q in zip(na.parameters(), nb.parameters())
            if p.grad is not None
        )


def test_frozen_parameters_are_kept_and_untouched():
    torch.manual_seed(1)
    na = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    na[0].weight.requires_grad_(False)
    nb = copy.deepcopy(na)
    oa = torch.optim.AdamW(na.parameters(), lr=0.1, fused=True)
    ob = PackedAdamW(nb.parameters(), lr=0.1)
    assert nb[0].weight.grad is None
    for _ in range(3):
        x = torch.randn(4, 8)
        for m, o in ((na, oa), (nb, ob)):
            m(x).sum().backward()
            o.step()
            o.zero_grad()
    assert same(na.parameters(), nb.parameters()) and nb[0].weight.grad is None


def test_channels_last_packed_in_its_own_order_gappy_refused_before_anything_changes():
    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    w = conv.weight
    stride = w.stride()
    PackedAdamW(conv.parameters())  # packed in its own memory order (tests/test_channels_last.py)
    assert w.stride() == stride and w.is_contiguous(memory_format=torch.channels_last)
    gappy = torch.randn(8, 6)[:, ::2].requires_grad_()
    ptr, stride = gappy.data_ptr(), gappy.stride()
    with pytest.raises(ValueError, match="without gaps or overlaps"):
        PackedAdamW([gappy])
    assert gappy.data_ptr() == ptr and gappy.stride() == stride and gappy.grad is None


def test_clip_non_contiguous_gradients_in_memory_order():
    gen = torch.Generator().manual_seed(3)
    a = [torch.randn(96, 64, generator=gen).t().contiguous().t().requires_grad_() for _ in range(3)]
    a += [
        torch.randn(2, 16, 5, 5, generator=gen).contiguous(memory_format=torch.channels_last).requires_grad_()
        for _ in range(2)
    ]
    b = [x.detach().clone(memory_format=torch.preserve_format).requires_grad_() for x in a]
    for x, y in zip(a, b):
        g = torch.randn(x.shape, generator=gen) * 5
        x.grad = g.clone(memory_format=torch.preserve_format).as_strided(x.shape, x.stride()).copy_(g)
        y.grad = x.grad.clone(memory_format=torch.preserve_format)
        assert not y.grad.is_contiguous()
    assert bitwise_equal(torch.nn.utils.clip_grad_norm_(a, 0.1), clip_grad_norm_(b, 0.1))
    assert all(bitwise_equal(x.grad, y.grad) for x, y in zip(a, b))


def _clamp_hook(opt, args, kwargs):
    with torch.no_grad():
        for g in opt.param_groups:
            for p in g["params"]:
                p.clamp_(-0.05, 0.05)


def test_step_hooks_run_in_the_one_pass_phase():
    a, b, gen = pair()
    oa, ob = torch.optim.AdamW(a, fused=True), PackedAdamW(b)
    pre_calls = []
    for o in (oa, ob):
        o.register_step_post_hook(_clamp_hook)
        o.register_step_pre_hook(lambda opt, args, kw: pre_calls.append(opt))
    for _ in range(5):
        gs = [torch.randn(x.shape, generator=gen) for x in a]
        torch.autograd.backward(a, gs)
        torch.autograd.backward(b, gs)
        torch.nn.utils.clip_grad_norm_(a, 1.0)
        oa.step()
        oa.zero_grad()
        ob.clip_step_zero_grad(1.0)
    assert same(a, b) and len(pre_calls) == 10


def test_two_parameter_groups_and_add_param_group():
    torch.manual_seed(2)
    na = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    nb = copy.deepcopy(na)

    def groups(m):  # nanoGPT's configure_optimizers: decay for matrices, none for the rest
        decay = [p for p in m.parameters() if p.dim() >= 2]
        rest = [p for p in m.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": 3e-3}]

    oa = torch.optim.AdamW(groups(na), lr=1e-2, fused=True)
    ob = PackedAdamW(groups(nb), lr=1e-2)
    extra_a, extra_b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    for step in range(8):
        if step == 3:
            oa.add_param_group({"params": [extra_a], "lr": 0.05})
            ob.add_param_group({"params": [extra_b], "lr": 0.05})
        x = torch.randn(5, 16)
        for m, o, e in ((na, oa, extra_a), (nb, ob, extra_b)):
            loss = m(x).sum() + ((e * e).sum() if step >= 3 else 0.0)
            loss.backward()
            if o is oa:
                # the loop's own order (model.parameters()), which clip_step_zero_grad is told
                torch.nn.utils.clip_grad_norm_(list(m.parameters()) + ([e] if step >= 3 else []), 1.0)
                o.step()
                o.zero_grad()
            else:
                o.clip_step_zero_grad(1.0, parameters=list(m.parameters()) + ([e] if step >= 3 else []))
        assert same(na.parameters(), nb.parameters()) and bitwise_equal(extra_a, extra_b), f"step {step}"
    sd = ob.state_dict()
    assert len(sd["param_groups"]) == 3
    oc = torch.optim.AdamW(groups(na) + [{"params": [extra_a], "lr": 0.05}], lr=1e-2, fused=True)
    oc.load_state_dict(sd)


def test_state_dict_without_maximize_loads():
    a, b, gen = pair()
    oa, ob = torch.optim.AdamW(a, fused=True), PackedAdamW(b)
    for o, ps in ((oa, a), (ob, b)):
        torch.autograd.backward(ps, [torch.ones_like(p) for p in ps])
        o.step()
    sd = oa.state_dict()
    for g in sd["param_groups"]:
        del g["maximize"]
    ob.load_state_dict(copy.deepcopy(sd))  # natively sd's tensors become ob's state, shared with oa
    gs = [torch.randn(x.shape, generator=gen) for x in a]
    torch.autograd.backward(a, gs)
    torch.autograd.backward(b, gs)
    oa.step()
    ob.step()
    assert same(a, b)


def test_deepcopy_refused_and_rebinding_detected():
    lin = torch.nn.Linear(4, 4)
    opt = PackedAdamW(lin.parameters())
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(opt)
    lin.weight.data = torch.zeros(4, 4)
    with pytest.raises(RuntimeError, match="was rebound"):  # at the backward that reaches it
        lin(torch.randn(2, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="was rebound"):
        opt.step()


def test_maximize_takes_torch_kernels_and_keeps_nan_bits():
    a, b, gen = pair([(64, 16), (32,)])
    oa = torch.optim.AdamW(a, fused=True, maximize=True, weight_decay=0.0)
    ob = PackedAdamW(b, maximize=True, weight_decay=0.0)
    assert "maximize" in ob.phase_kernel() or not ob.phase_kernel().startswith("phase.c")
    gs = [torch.randn(x.shape, generator=gen) for x in a]
    gs[0][0, 0] = float("nan")
    torch.autograd.backward(a, gs)
    torch.autograd.backward(b, gs)
    torch.nn.utils.clip_grad_norm_(a, 1e9)
    oa.step()
    oa.zero_grad()
    ob.clip_step_zero_grad(1e9)
    for x, y in zip(a, b):
        assert bitwise_equal(oa.state[x]["exp_avg_sq"], ob.state[y]["exp_avg_sq"])
