"""PackedAdamW in the training loops users port (issue 20's table): every case bit for bit
``torch.optim.AdamW(fused=True)`` on every step, or an error naming the reason before anything is
modified. Each loop runs twice on the same model copy, once natively and once packed."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent import kernel as phase_kernel
from cotangent.verify import bitwise_equal, state_dict_difference

KERNELS = ["auto", "torch"]


class Net(nn.Module):
    """A trunk, a branch used only on some steps, and a head; sizes multiples of 16 (phase.c's) and not."""

    def __init__(self, odd: bool = False) -> None:
        super().__init__()
        w = 20 if odd else 32
        self.trunk = nn.Linear(16, w)
        self.branch = nn.Linear(w, w)
        self.head = nn.Linear(w, 16)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.head(h)


def twins(odd: bool = False, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    a = Net(odd)
    return a, copy.deepcopy(a)


def assert_same(
    ma: nn.Module, mb: nn.Module, oa: torch.optim.Optimizer, ob: torch.optim.Optimizer, where: str
) -> None:
    for (name, x), y in zip(ma.named_parameters(), mb.parameters()):
        assert bitwise_equal(x.detach(), y.detach()), f"{where}: parameter {name}"
        assert (x.grad is None) == (y.grad is None), f"{where}: {name}.grad presence"
    # native's lazy state: an entry from a parameter's first step with a gradient, never before
    diff = state_dict_difference(oa.state_dict(), ob.state_dict())
    assert diff is None, f"{where}: state_dict {diff}"


def phase_both(ma: nn.Module, oa: torch.optim.Optimizer, ob: PackedAdamW, max_norm: float):
    """Native clip_grad_norm_ + step + zero_grad on ``ma``, and ``ob``'s one-pass phase: both total norms."""
    na = nn.utils.clip_grad_norm_(ma.parameters(), max_norm)
    oa.step()
    oa.zero_grad()
    return na, ob.clip_step_zero_grad(max_norm)


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)


@pytest.mark.parametrize("clip", ["native", "project-reversed"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_unused_and_frozen_parameters_are_not_stepped(clip, kernel):
    """A branch unused on odd steps, a layer frozen mid-run, zero_grad(set_to_none=True) and native
    clipping (or the project's, parameters in reverse order): native skips what has no gradient."""
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, weight_decay=0.1, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, weight_decay=0.1, kernel=kernel)
    gen = torch.Generator().manual_seed(1)
    for step in range(8):
        if step == 4:
            ma.trunk.requires_grad_(False)
            mb.trunk.requires_grad_(False)
        x, y = batch(gen)
        for m, o in ((ma, oa), (mb, ob)):
            o.zero_grad(set_to_none=True)
            nn.functional.mse_loss(m(x, use_branch=step % 2 == 0), y).backward()
        order = slice(None) if clip == "native" else slice(None, None, -1)
        na = nn.utils.clip_grad_norm_(list(ma.parameters())[order], 0.5)
        nb = (nn.utils.clip_grad_norm_ if clip == "native" else clip_grad_norm_)(
            list(mb.parameters())[order], 0.5
        )
        assert bitwise_equal(na, nb), f"step {step}: total norm"
        oa.step()
        ob.step()
        assert_same(ma, mb, oa, ob, f"step {step}")
    assert int(ob.state[mb.branch.weight]["step"]) == 4 and int(ob.state[mb.trunk.weight]["step"]) == 4


@pytest.mark.parametrize("phase", ["one-pass", "three-calls"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_zero_grad_set_to_none_false_with_a_layer_used_on_even_steps(phase, kernel):
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, kernel=kernel)
    gen = torch.Generator().manual_seed(2)
    for step in range(8):
        x, y = batch(gen)
        for m, o in ((ma, oa), (mb, ob)):
            o.zero_grad(set_to_none=False)
            nn.functional.mse_loss(m(x, use_branch=step % 2 == 0), y).backward()
        na = nn.utils.clip_grad_norm_(ma.parameters(), 1.0)
        oa.step()
        if phase == "one-pass":  # the loop it replaces keeps zeroed gradients: set_to_none=False
            nb = ob.clip_step_zero_grad(1.0, set_to_none=False)
            oa.zero_grad(set_to_none=False)
        else:
            nb = clip_grad_norm_(list(mb.parameters()), 1.0)
            ob.step()
        assert bitwise_equal(na, nb), f"step {step}"
        assert_same(ma, mb, oa, ob, f"step {step}")


@pytest.mark.parametrize("unscale", [False, True])
@pytest.mark.parametrize("odd", [False, True])
def test_grad_scaler_protocol(unscale, odd):
    """GradScaler at a scale that is not a power of two, with and without unscale_ (and clipping
    after it), an inf gradient on one step (native skips that update: found_inf)."""
    ma, mb = twins(odd)
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, weight_decay=0.1, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, weight_decay=0.1)
    assert ob._step_supports_amp_scaling
    sa = torch.amp.GradScaler("cpu", init_scale=3000.7, growth_interval=3)
    sb = torch.amp.GradScaler("cpu", init_scale=3000.7, growth_interval=3)
    gen = torch.Generator().manual_seed(3)
    for step in range(10):
        x, y = batch(gen)
        for m, o, s in ((ma, oa, sa), (mb, ob, sb)):
            o.zero_grad()
            s.scale(nn.functional.mse_loss(m(x), y)).backward()
            if step == 5:
                with torch.no_grad():
                    m.head.weight.grad[0, 0] = float("inf")
            if unscale:
                s.unscale_(o)
                nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            s.step(o)
            s.update()
        assert sa.get_scale() == sb.get_scale()
        assert_same(ma, mb, oa, ob, f"step {step}")
    assert int(ob.state[mb.head.weight]["step"]) == 9  # the inf step was skipped


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("found", [0.0, 1.0])
def test_one_pass_phase_follows_grad_scale_and_found_inf(kernel, found):
    """With ``grad_scale`` / ``found_inf`` set on the optimizer (as GradScaler sets them around
    step), clip_step_zero_grad is the three calls with them set natively, in both kernels."""
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, weight_decay=0.1, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, weight_decay=0.1, kernel=kernel)
    gen = torch.Generator().manual_seed(4)
    for step in range(4):
        x, y = batch(gen)
        for m in (ma, mb):
            (nn.functional.mse_loss(m(x), y) * 3000.7).backward()
        for o in (oa, ob):
            o.grad_scale = torch.tensor(3000.7)
            o.found_inf = torch.tensor(found if step == 2 else 0.0)
        na, nb = phase_both(ma, oa, ob, 1e6)
        assert bitwise_equal(na, nb)
        assert_same(ma, mb, oa, ob, f"step {step}")
    assert int(ob.state[mb.head.weight]["step"]) == 4 - int(found)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_maximize_with_a_non_finite_gradient(kernel, special):
    ma, mb = twins(odd=True)
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, weight_decay=0.1, maximize=True, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, weight_decay=0.1, maximize=True, kernel=kernel)
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        x, y = batch(gen)
        for m in (ma, mb):
            nn.functional.mse_loss(m(x), y).backward()
            if step == 2:
                with torch.no_grad():
                    m.branch.weight.grad.view(-1)[::37] = special
                    m.head.bias.grad[-1] = special
        na, nb = phase_both(ma, oa, ob, 1.0)
        assert bitwise_equal(na, nb)
        assert_same(ma, mb, oa, ob, f"step {step}")


def test_python_number_step_loads():
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    gen = torch.Generator().manual_seed(6)
    x, y = batch(gen)
    nn.functional.mse_loss(ma(x), y).backward()
    oa.step()
    sd = oa.state_dict()
    for st in sd["state"].values():
        st["step"] = float(st["step"])  # as older checkpoints and hand-written ones hold it
    mb.load_state_dict(ma.state_dict())
    ob = PackedAdamW(mb.parameters(), lr=0.05)
    ob.load_state_dict(copy.deepcopy(sd))
    oa.load_state_dict(copy.deepcopy(sd))
    for step in range(3):
        x, y = batch(gen)
        for m, o in ((ma, oa), (mb, ob)):
            o.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            o.step()
        assert_same(ma, mb, oa, ob, f"step {step}")


@pytest.mark.parametrize(
    "change", [{"fused": None}, {"fused": False}, {"foreach": True}, {"capturable": True}]
)
def test_state_dict_off_the_fused_path_refused_before_loading(change):
    """Native's load_state_dict takes group settings from the state dict: these would switch native
    fused AdamW onto another kernel. Refused, naming the key, with nothing modified."""
    _, mb = twins()
    ob = PackedAdamW(mb.parameters(), lr=0.05)
    sd = ob.state_dict()
    sd["param_groups"][0].update(change)
    sd["param_groups"][0]["lr"] = 0.5
    key = next(iter(change))
    with pytest.raises(ValueError, match=f"param_groups'\\]\\[0\\].*{key}="):
        ob.load_state_dict(sd)
    assert ob.param_groups[0]["lr"] == 0.05 and ob.param_groups[0]["fused"] is True


@pytest.mark.parametrize("kernel", KERNELS)
def test_lr_scheduler_sees_the_one_pass_step(kernel):
    """OneCycleLR wraps opt.step; the one-pass phase runs its update inside step, so the scheduler's
    'lr_scheduler.step() before optimizer.step()' warning does not fire and the rates are native's."""
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, kernel=kernel)
    ra = torch.optim.lr_scheduler.OneCycleLR(oa, max_lr=0.1, total_steps=10)
    rb = torch.optim.lr_scheduler.OneCycleLR(ob, max_lr=0.1, total_steps=10)
    gen = torch.Generator().manual_seed(7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(6):
            x, y = batch(gen)
            for m in (ma, mb):
                nn.functional.mse_loss(m(x), y).backward()
            na, nb = phase_both(ma, oa, ob, 1.0)
            ra.step()
            rb.step()
            assert bitwise_equal(na, nb) and oa.param_groups[0]["lr"] == ob.param_groups[0]["lr"]
            assert_same(ma, mb, oa, ob, f"step {step}")
    if kernel == "auto" and phase_kernel.kernel() is not None:
        assert ob.phase_kernel().startswith("phase.c")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("release", [False, True])
def test_norms_taken_in_backward_are_used_and_exact(kernel, release):
    """``backward_norms=True`` in a plain loop: after backward every norm is remembered and valid
    (the phase reads no gradient for its norms), and the phase is native's three calls bit for bit."""
    ma, mb = twins(odd=True)
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, kernel=kernel, backward_norms=True, release_grads=release)
    back = ob._pack.backward
    assert back is not None and back.why_not is None and "norms in backward" in ob.phase_kernel()
    gen = torch.Generator().manual_seed(3)
    for step in range(5):
        x, y = batch(gen)
        for m in (ma, mb):
            nn.functional.mse_loss(m(x), y).backward()
        assert all(back.fresh(i) for i in range(back.pack.n)), f"step {step}: a norm from backward is stale"
        na, nb = phase_both(ma, oa, ob, 0.1)
        assert bitwise_equal(na, nb), f"step {step}: total norm"
        assert_same(ma, mb, oa, ob, f"step {step}")
        assert not any(back.fresh(i) for i in range(back.pack.n)), "norms survive zero_grad"


@pytest.mark.parametrize("write", ["flat buffer", "native clip", "second backward"])
def test_writes_after_backward_invalidate_its_norms(write):
    """Each write between backward and the phase makes the remembered norm stale: through the
    optimizer's flat buffer (``flat_groups``), by native clipping, by accumulating another micro-batch."""
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, backward_norms=True)
    back = ob._pack.backward
    gen = torch.Generator().manual_seed(4)
    x, y = batch(gen)
    x2, y2 = batch(gen)
    for m in (ma, mb):
        nn.functional.mse_loss(m(x), y).backward()
    with torch.no_grad():
        if write == "flat buffer":
            for p in ma.parameters():
                p.grad.mul_(0.5)
            ob.flat_groups[0].grad.mul_(0.5)
            stale = back.pack.n
        elif write == "native clip":
            for m in (ma, mb):
                nn.utils.clip_grad_norm_(m.parameters(), 0.01)
            stale = back.pack.n
    if write == "second backward":  # accumulation: each hook takes the norm of the sum again
        for m in (ma, mb):
            nn.functional.mse_loss(m(x2), y2).backward()
        stale = 0
    assert sum(not back.fresh(i) for i in range(back.pack.n)) == stale
    na, nb = phase_both(ma, oa, ob, 0.1)
    assert bitwise_equal(na, nb)
    assert_same(ma, mb, oa, ob, write)


def test_default_reads_gradients_in_the_phase_so_data_writes_are_exact():
    """Writes through ``.data`` are invisible to version counters, so ``backward_norms`` is opt-in:
    by default the phase reads every gradient, and such a write gives native's bits."""
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05)
    assert ob._pack.backward is None and "norms in backward" not in ob.phase_kernel()
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        x, y = batch(gen)
        for m in (ma, mb):
            nn.functional.mse_loss(m(x), y).backward()
            for p in m.parameters():
                p.grad.data.mul_(0.25)  # e.g. an average over workers in older code
        na, nb = phase_both(ma, oa, ob, 0.1)
        assert bitwise_equal(na, nb)
        assert_same(ma, mb, oa, ob, f"step {step}")
    with pytest.raises(ValueError, match="backward_norms must be True or False"):
        PackedAdamW(nn.Linear(2, 2).parameters(), backward_norms="auto")


def _escape_and_write(p: torch.Tensor, how: str, step: int) -> None:
    """Scale ``p.grad`` through a route PyTorch's version counters do not see."""
    import numpy as np

    c = 0.25 + 0.5 * step
    if how == "data":
        p.grad.data.mul_(c)
    elif how == "data, kept from an earlier step":  # the alias taken before backward, written after
        p._kept.mul_(c)  # type: ignore[attr-defined]
    elif how == "numpy":
        p.grad.numpy()[...] *= c
    elif how == "np.asarray":
        np.asarray(p.grad)[...] *= c
    elif how == "dlpack":
        torch.from_dlpack(p.grad).mul_(c)
    elif how == "untyped_storage":
        t = torch.empty(0, dtype=p.grad.dtype)
        t.set_(p.grad.untyped_storage(), p.grad.storage_offset(), p.grad.shape, p.grad.stride())
        t.mul_(c)


ESCAPES = [
    "data",
    "data, kept from an earlier step",
    "numpy",
    "np.asarray",
    "dlpack",
    "untyped_storage",
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("how", ESCAPES)
def test_uncounted_gradient_writes_under_backward_norms_are_detected(kernel, how):
    """``backward_norms=True``: a write through ``p.grad.data``, NumPy, DLPack or the storage
    between backward and the phase is invisible to version counters; the slot notices the access
    (GradSlot), so the phase computes that norm again and gives native's bits on every step."""
    ma, mb = twins(odd=True)
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, kernel=kernel, backward_norms=True)
    back = ob._pack.backward
    assert back is not None and back.why_not is None
    gen = torch.Generator().manual_seed(6)
    for step in range(4):
        x, y = batch(gen)
        for m in (ma, mb):
            nn.functional.mse_loss(m(x), y).backward()
            for p in m.parameters():
                if how.endswith("earlier step") and not hasattr(p, "_kept"):
                    p._kept = p.grad.data  # type: ignore[attr-defined]  # the slot's alias, reused
                _escape_and_write(p, how, step)
        assert not any(back.fresh(i) for i in range(back.pack.n)), f"{how}: a norm survived the write"
        na, nb = phase_both(ma, oa, ob, 0.1)
        assert bitwise_equal(na, nb), f"step {step}: total norm ({how})"
        assert_same(ma, mb, oa, ob, f"step {step} ({how})")
        if how.endswith("earlier step"):  # native's .grad is None after zero_grad: a fresh alias next step
            for m in (ma, mb):
                for p in m.parameters():
                    del p._kept  # type: ignore[attr-defined]
            how = "data"


def test_an_unnoticed_data_write_would_use_the_stale_norm(monkeypatch):
    """The detection is what makes the case above exact: with the slot's notice switched off, the
    same ``p.grad.data`` write is clipped with backward's norm and the bits differ from native's."""
    from cotangent.backnorms import GradSlot

    monkeypatch.setattr(GradSlot, "_escape", lambda self: None)
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, backward_norms=True)
    x, y = batch(torch.Generator().manual_seed(6))
    for m in (ma, mb):
        nn.functional.mse_loss(m(x), y).backward()
        for p in m.parameters():
            p.grad.data.mul_(3.0)
    na, nb = phase_both(ma, oa, ob, 0.1)
    assert not bitwise_equal(na, nb)


def test_gradient_slots_are_plain_tensors_unless_norms_are_taken_in_backward():
    """The watching slot exists only with ``backward_norms=True``; operations on it return plain
    tensors, and native clipping over it gives native's bits (its per-tensor path on CPU)."""
    from cotangent.backnorms import GradSlot

    for flag in (False, True):
        ma, mb = twins()
        ob = PackedAdamW(mb.parameters(), lr=0.05, backward_norms=flag)
        oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
        x, y = batch(torch.Generator().manual_seed(8))
        for m in (ma, mb):
            nn.functional.mse_loss(m(x), y).backward()
        g = mb.head.weight.grad
        assert (
            (type(g) is GradSlot) is flag and type(g * 2) is torch.Tensor and type(g.detach()) is torch.Tensor
        )
        na = nn.utils.clip_grad_norm_(ma.parameters(), 0.1)
        nb = nn.utils.clip_grad_norm_(mb.parameters(), 0.1)
        assert bitwise_equal(na, nb)
        oa.step()
        ob.step()
        assert_same(ma, mb, oa, ob, f"backward_norms={flag}")


@pytest.mark.parametrize("then", ["step", "clip_step_zero_grad", "zero_grad", "model.zero_grad and backward"])
@pytest.mark.parametrize("backward_norms", [False, True])
def test_gradient_memory_replaced_through_data_is_refused(then, backward_norms):
    """``p.grad.data = t`` makes ``t`` the gradient's memory natively (clipping, ``zero_()`` and the
    next backward write into it); the flat buffer cannot keep that aliasing, so the next call that
    reads or zeroes the gradients refuses it, naming the parameter, before the parameters or the
    optimizer's state move."""
    _, mb = twins()
    ob = PackedAdamW(mb.parameters(), lr=0.05, backward_norms=backward_norms)
    x, y = batch(torch.Generator().manual_seed(9))
    nn.functional.mse_loss(mb(x), y).backward()
    ob.clip_step_zero_grad(0.1)
    nn.functional.mse_loss(mb(x), y).backward()
    before = [p.detach().clone() for p in mb.parameters()]
    state = copy.deepcopy(ob.state_dict())
    mb.head.bias.grad.data = torch.full((16,), 5.0)
    with pytest.raises(
        RuntimeError, match=r"parameter \d+ \(shape \(16,\)\): its .grad was given other memory"
    ):
        if then == "step":
            ob.step()
        elif then == "clip_step_zero_grad":
            ob.clip_step_zero_grad(0.1)
        elif then == "zero_grad":
            ob.zero_grad()
        else:
            mb.zero_grad()
            nn.functional.mse_loss(mb(x), y).backward()
    assert all(torch.equal(a, b) for a, b in zip(before, mb.parameters()))
    assert state_dict_difference(state, ob.state_dict()) is None


@pytest.mark.parametrize("route", ["clip_in_step", "clip_grad_norm_"])
def test_grad_scaler_unscaling_is_seen_by_backward_norms(route):
    """``GradScaler.unscale_`` rewrites every gradient with a kernel PyTorch does not count; the
    slot notices the scaler's question before it (``is_sparse``), so the clip sees the unscaled
    gradients, as natively, through the armed step and through the packed ``clip_grad_norm_``."""
    ma, mb = twins()
    oa = torch.optim.AdamW(ma.parameters(), lr=0.05, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=0.05, backward_norms=True)
    if route == "clip_in_step":
        ob.clip_in_step(0.5, mb.parameters())
    sa, sb = (torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2))
    gen = torch.Generator().manual_seed(10)
    for step in range(3):
        x, y = batch(gen)
        for m, o, s in ((ma, oa, sa), (mb, ob, sb)):
            s.scale(nn.functional.mse_loss(m(x), y)).backward()
            s.unscale_(o)
        na = nn.utils.clip_grad_norm_(ma.parameters(), 0.5)
        nb = ob.last_total_norm if route == "clip_in_step" else clip_grad_norm_(list(mb.parameters()), 0.5)
        for o, s in ((oa, sa), (ob, sb)):
            s.step(o)
            s.update()
            o.zero_grad()
        nb = ob.last_total_norm if route == "clip_in_step" else nb
        assert bitwise_equal(na, nb), f"step {step}: {float(na)} against {float(nb)}"
        assert_same(ma, mb, oa, ob, f"step {step}")


def test_a_watched_gradient_copies_and_saves_as_a_plain_tensor(tmp_path):
    """``copy.deepcopy(p.grad)`` and ``torch.save(p.grad)`` give a plain tensor of the gradient's
    own bytes (not the flat buffer), read back with ``weights_only=True``, in both modes."""
    for flag in (False, True):
        m = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 10))
        PackedAdamW(m.parameters(), backward_norms=flag)
        m(torch.randn(2, 256)).sum().backward()
        g = m[1].bias.grad
        c = copy.deepcopy(g)
        assert type(c) is torch.Tensor and torch.equal(c, g) and c.data_ptr() != g.data_ptr()
        torch.save({"g": g}, tmp_path / "g.pt")
        assert (tmp_path / "g.pt").stat().st_size < 4096  # 10 floats, not the 66k-float buffer
        back = torch.load(tmp_path / "g.pt", weights_only=True)["g"]
        assert type(back) is torch.Tensor and torch.equal(back, g)
