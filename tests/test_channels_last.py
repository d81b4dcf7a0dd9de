"""channels_last and other dense memory orders: each parameter packed in its own order (its slot
holds its bytes as laid out, the parameter a view of the slot with its strides), bitwise native."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.verify import bitwise_equal, state_dict_difference

FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODES = {"kept": {}, "released": {"release_grads": True}, "backnorms": {"backward_norms": True}}


def conv_net(
    seed: int, widths: tuple[int, ...] = (16, 32), kernel: int = 3, norm: bool = True
) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    c = 3
    for k, w in enumerate(widths):
        layers += [torch.nn.Conv2d(c, w, kernel, stride=1 + k % 2, bias=not norm)]
        layers += [torch.nn.BatchNorm2d(w)] if norm else []
        layers += [torch.nn.ReLU()]
        c = w
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c, 10)]
    return torch.nn.Sequential(*layers).to(memory_format=torch.channels_last)


def threads(n: int):
    class Threads:
        def __enter__(self):
            self.was = torch.get_num_threads()
            torch.set_num_threads(n)

        def __exit__(self, *exc):
            torch.set_num_threads(self.was)

    return Threads()


def compare(ma, mb, oa, ob, where: str, grads: bool = True) -> None:
    for i, (p, q) in enumerate(zip(ma.parameters(), mb.parameters())):
        assert p.stride() == q.stride(), f"{where}: parameter {i} strides {p.stride()} {q.stride()}"
        assert bitwise_equal(p.detach(), q.detach()), f"{where}: parameter {i}"
        if grads:
            assert (p.grad is None) == (q.grad is None), f"{where}: parameter {i} .grad presence"
            if p.grad is not None:
                assert p.grad.stride() == q.grad.stride(), f"{where}: parameter {i} .grad strides"
                assert bitwise_equal(p.grad, q.grad), f"{where}: parameter {i} .grad"
    assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, where
    for key in ("exp_avg", "exp_avg_sq"):
        for i, (p, q) in enumerate(zip(ma.parameters(), mb.parameters())):
            if p in oa.state:
                assert oa.state[p][key].stride() == ob.state[q][key].stride(), f"{where}: {key} {i} strides"


def train_both(ma, mb, steps: int, batch: tuple[int, ...], how: str, seed: int = 1, **packed) -> None:
    """``steps`` steps, native ``AdamW(fused=True)`` + clip against PackedAdamW, compared after
    backward and after each phase: the three calls, the one pass, or the two alternating."""
    oa = torch.optim.AdamW(ma.parameters(), lr=0.01, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.01, **packed)
    gen = torch.Generator().manual_seed(seed)
    for s in range(steps):
        x = torch.randn(batch, generator=gen).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (batch[0],), generator=gen)
        F.cross_entropy(ma(x), y).backward()
        F.cross_entropy(mb(x), y).backward()
        compare(ma, mb, oa, ob, f"step {s}, after backward")
        na = torch.nn.utils.clip_grad_norm_(ma.parameters(), 1.0)
        oa.step()
        oa.zero_grad()
        if how == "phase" or (how == "both" and s % 2):
            nb = ob.clip_step_zero_grad(1.0, parameters=mb.parameters())
        else:
            nb = clip_grad_norm_(mb.parameters(), 1.0)
            ob.step()
            ob.zero_grad()
        assert bitwise_equal(na, nb), f"step {s}: norm {float(na)!r} {float(nb)!r}"
        compare(ma, mb, oa, ob, f"step {s}, after the phase")


@pytest.mark.parametrize("n", [1, 2])
def test_plain_conv_net_channels_last_bitwise_native_20_steps(n):
    with threads(n):
        train_both(conv_net(0), conv_net(0), 20, (8, 3, 16, 16), "both")


@pytest.mark.process
@pytest.mark.parametrize("n", [1, 2])
def test_timm_resnet10t_channels_last_bitwise_native_20_steps(n):
    timm = pytest.importorskip("timm")

    def model():
        torch.manual_seed(0)
        return timm.create_model("resnet10t", num_classes=10).to(memory_format=torch.channels_last)

    with threads(n):
        train_both(model(), model(), 20, (2, 3, 32, 32), "both")


@FEW
@given(
    st.lists(st.sampled_from([4, 8, 12, 16, 24]), min_size=1, max_size=3).map(tuple),
    st.sampled_from([1, 3]),
    st.booleans(),
    st.sampled_from(sorted(MODES)),
    st.sampled_from(["three", "phase"]),
    st.integers(0, 3),
)
def test_channels_last_nets_bitwise_native(widths, kernel, norm, mode, how, seed):
    """Random channels_last conv nets (widths, 1x1 or 3x3 kernels, with or without BatchNorm), in
    every gradient mode, three calls or the one pass: native's bits and strides."""
    train_both(
        conv_net(seed, widths, kernel, norm),
        conv_net(seed, widths, kernel, norm),
        4,
        (4, 3, 9, 9),
        how,
        **MODES[mode],
    )


@FEW
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from(["three", "phase"]), st.integers(0, 3))
def test_transposed_leaf_packed_in_its_own_order(rows, cols, how, seed):
    """A leaf whose strides are a transpose's (``nn.Parameter(w.t())``) keeps them: native's bits."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(cols, rows, generator=gen).t()
    a, b = [w.clone(memory_format=torch.preserve_format).requires_grad_() for _ in range(2)]
    oa = torch.optim.AdamW([a], lr=0.01, fused=True)
    ob = PackedAdamW([b], lr=0.01)
    assert b.stride() == a.stride() == (1, rows)
    for s in range(4):
        g = torch.randn(rows, cols, generator=gen)
        a.backward(g)
        b.backward(g)
        na = torch.nn.utils.clip_grad_norm_([a], 1.0)
        oa.step()
        oa.zero_grad()
        nb = ob.clip_step_zero_grad(1.0) if how == "phase" else clip_grad_norm_([b], 1.0)
        if how == "three":
            ob.step()
            ob.zero_grad()
        assert bitwise_equal(na, nb) and bitwise_equal(a.detach(), b.detach()), f"step {s}"
        assert b.stride() == (1, rows)
        assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, f"step {s}"


def test_gappy_parameter_refused_by_name():
    p = torch.randn(4, 6)[:, ::2].requires_grad_()
    with pytest.raises(ValueError, match="own memory order.*without gaps or overlaps.*strides \\(6, 2\\)"):
        PackedAdamW([p])
