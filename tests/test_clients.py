"""The method in real clients' own loops (Hugging Face Trainer, accelerate, Lightning, timm,
torchtune), bit for bit native ``AdamW(fused=True)`` with the clients' clipping, checkpoint and
resume included (:mod:`cotangent.clients`, which ``harness verify`` also runs). The
clients are the ``clients`` extra, which CI installs (``pip install -e '.[test,ray,clients]'``)."""

from __future__ import annotations

import pytest

from cotangent import PackedAdamW
from cotangent import kernel as phase_kernel
from cotangent.clients import CHECKS, installed, run_client


@pytest.mark.parametrize("client", list(CHECKS))
def test_a_client_loop_is_native_bit_for_bit_and_takes_the_c_phase(client):
    assert installed(client) is not None, f"{client} is missing: pip install -e '.[clients]'"
    r = run_client(client)
    assert r.difference is None, f"{client} {r.version}: {r.difference}"
    if phase_kernel.kernel() is not None:  # decay groups, odd sizes: phase.c runs all the same
        assert r.phase_kernel.startswith("phase.c"), r.phase_kernel


@pytest.mark.parametrize("client", ["transformers", "lightning"])
def test_a_client_check_sees_a_wrong_clip(client, monkeypatch):
    """The comparison can fail: the same loop with the armed clip at another max_norm is named."""
    arm = PackedAdamW.clip_in_step

    def off(self, max_norm, parameters=None, *a, **k):
        return arm(self, None if max_norm is None else max_norm * 0.1, parameters, *a, **k)

    monkeypatch.setattr(PackedAdamW, "clip_in_step", off)
    assert run_client(client).difference is not None


def test_clip_in_step_is_refused_where_its_order_is_unknown_or_the_gradients_are_scaled():
    import torch

    m = torch.nn.Linear(16, 16)
    groups = [{"params": [m.weight]}, {"params": [m.bias], "weight_decay": 0.0}]
    with pytest.raises(ValueError, match="span more than one parameter group"):
        PackedAdamW(groups).clip_in_step(1.0)
    opt = PackedAdamW(m.parameters())
    opt.clip_in_step(1.0)
    m(torch.randn(2, 16)).sum().backward()
    opt.grad_scale = torch.tensor(1024.0)  # as GradScaler.step sets it before unscaling
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(RuntimeError, match="unscale_"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    opt.grad_scale = None
    opt.clip_in_step(None)  # disarmed: step is the plain update again, gradients kept
    opt.step()
    assert m.weight.grad is not None and opt.last_total_norm is None


def test_clip_in_step_refuses_step_hooks():
    """Hooks run around ``step()``; the clip the armed step replaces ran before them and
    ``zero_grad`` after them, so with hooks registered the armed step refuses before anything moves."""
    import torch

    m = torch.nn.Linear(16, 16)
    opt = PackedAdamW(m.parameters())
    opt.clip_in_step(1.0)
    handle = opt.register_step_post_hook(lambda o, a, k: None)
    m(torch.randn(2, 16)).sum().backward()
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(RuntimeError, match="step pre/post hooks are registered"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters())) and m.weight.grad is not None
    handle.remove()
    opt.step()
    assert opt.one_pass_steps == 1 and m.weight.grad is None
