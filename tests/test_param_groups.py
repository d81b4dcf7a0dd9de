"""Parameter groups as real clients split them (decay and no-decay, as nanoGPT, timm, the Hugging
Face Trainer and accelerate do): ``phase.c`` runs for any number of groups, each with its own
hyperparameters, bit for bit native ``clip_grad_norm_(model.parameters()) + AdamW(fused=True).step()
+ zero_grad()``; the clip sums the norms in the order of the call it replaces; optimizer state
exists exactly where native's does, and ``state_dict()`` equals native's at every step."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch import nn

from cotangent import PackedAdamW
from cotangent import kernel as phase_kernel
from cotangent.verify import bitwise_equal, state_dict_difference

CI_EXAMPLES = 12


class TinyGPTBlock(nn.Module):
    """Embedding, a LayerNorm'd MLP block and a head: weights (decay) and gains/biases (no decay)
    interleaved in ``parameters()``; at width 32 and vocabulary 64 all multiples of 16 elements
    (phase.c's loops), at other sizes some not (those take PyTorch's kernels inside the C phase)."""

    def __init__(self, width: int = 32, vocab: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        h = h + self.proj(torch.nn.functional.gelu(self.fc(self.ln(h))))
        return self.head(self.ln_f(h))


def decay_groups(model: nn.Module, hypers: list[dict]) -> list[dict]:
    """nanoGPT's ``configure_optimizers`` split: 2-d tensors decay, the rest do not."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, **hypers[0]}, {"params": no_decay, **hypers[1]}]


hyper = st.fixed_dictionaries(
    {
        "lr": st.sampled_from([1e-3, 3e-3, 0.02]),
        "weight_decay": st.sampled_from([0.0, 0.01, 0.1]),
        "betas": st.sampled_from([(0.9, 0.999), (0.8, 0.95), (0.3, 0.99)]),
        "eps": st.sampled_from([1e-8, 1e-6]),
        "amsgrad": st.booleans(),
    }
)


def _loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


@settings(
    max_examples=CI_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    hypers=st.lists(hyper, min_size=2, max_size=2),
    seed=st.integers(0, 2**16),
    max_norm=st.sampled_from([0.05, 0.5, 100.0]),
    backward_norms=st.booleans(),
    threads=st.sampled_from([1, 2]),
    width=st.sampled_from([32, 24, 20]),
    vocab=st.sampled_from([64, 10]),
)
def test_phase_c_with_decay_groups_is_native(hypers, seed, max_norm, backward_norms, threads, width, vocab):
    """Two groups with their own lr, weight decay, betas, eps and amsgrad: phase.c runs (the
    kernel names itself) and every step is native's bits: total norm, parameters, state dict."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        ma = TinyGPTBlock(width, vocab)
        mb = copy.deepcopy(ma)
        oa = torch.optim.AdamW(decay_groups(ma, hypers), fused=True)
        ob = PackedAdamW(decay_groups(mb, hypers), backward_norms=backward_norms, release_grads=False)
        if phase_kernel.kernel() is not None:
            assert ob.phase_kernel().startswith("phase.c"), ob.phase_kernel()
        gen = torch.Generator().manual_seed(seed)
        assert state_dict_difference(oa.state_dict(), ob.state_dict()) is None, "before the first step"
        for step in range(6):
            idx = torch.randint(0, vocab, (4, 9), generator=gen)
            _loss(ma, idx).backward()
            _loss(mb, idx).backward()
            na = nn.utils.clip_grad_norm_(ma.parameters(), max_norm)
            oa.step()
            oa.zero_grad()
            nb = ob.clip_step_zero_grad(max_norm, parameters=mb.parameters())
            assert bitwise_equal(na, nb), f"step {step}: total norm {float(na)!r} against {float(nb)!r}"
            for (name, x), y in zip(ma.named_parameters(), mb.parameters()):
                assert bitwise_equal(x, y), f"step {step}: {name}"
                assert y.grad is None
            diff = state_dict_difference(oa.state_dict(), ob.state_dict())
            assert diff is None, f"step {step}: {diff}"
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_the_clip_sums_in_the_order_it_is_given(kernel):
    """Native clips ``model.parameters()``; the groups hold them in another order. Told the order,
    the one pass gives native's total to the bit; the groups' own order is not silently used."""
    torch.manual_seed(3)
    ma = TinyGPTBlock(width=48)
    mb = copy.deepcopy(ma)
    h = [{"weight_decay": 0.1}, {"weight_decay": 0.0}]
    oa = torch.optim.AdamW(decay_groups(ma, h), lr=1e-2, fused=True)
    ob = PackedAdamW(decay_groups(mb, h), lr=1e-2, kernel=kernel)
    gen = torch.Generator().manual_seed(3)
    group_order_differs = False
    for step in range(8):
        idx = torch.randint(0, 64, (8, 17), generator=gen)
        _loss(ma, idx).backward()
        _loss(mb, idx).backward()
        grouped = [p.grad.clone() for g in oa.param_groups for p in g["params"]]
        by_groups = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grouped]))
        na = nn.utils.clip_grad_norm_(ma.parameters(), 1.0)
        group_order_differs |= not bitwise_equal(na, by_groups)
        oa.step()
        oa.zero_grad()
        nb = ob.clip_step_zero_grad(1.0, parameters=mb.parameters())
        assert bitwise_equal(na, nb), f"step {step}"
        assert all(bitwise_equal(x, y) for x, y in zip(ma.parameters(), mb.parameters())), f"step {step}"
    # the test has teeth only if the groups' order gives another float at some step
    assert group_order_differs, "no step where the groups' order changes the total norm's bits"


def test_two_groups_without_an_order_are_refused_before_anything_moves():
    torch.manual_seed(0)
    m = TinyGPTBlock()
    opt = PackedAdamW(decay_groups(m, [{}, {"weight_decay": 0.0}]))
    _loss(m, torch.randint(0, 64, (2, 9))).backward()
    before = [p.detach().clone() for p in m.parameters()]
    grads = [p.grad.clone() for p in m.parameters()]
    with pytest.raises(ValueError, match="span 2 parameter groups.*parameters=model.parameters"):
        opt.clip_step_zero_grad(1.0)
    assert all(bitwise_equal(a, b) for a, b in zip(before, m.parameters()))
    assert all(bitwise_equal(a, p.grad) for a, p in zip(grads, m.parameters()))
    assert not opt.state


@pytest.mark.parametrize("extra", ["frozen", "outside_with_grad", "left_out", "twice"])
def test_any_other_parameter_list_gets_native_three_calls(extra):
    """A frozen parameter in the list (no gradient) still takes the one pass; a tensor outside the
    optimizer with a gradient, a parameter left out or named twice make native's three calls."""
    torch.manual_seed(1)
    ma = TinyGPTBlock()
    ma.ln.weight.requires_grad_(extra != "frozen")
    mb = copy.deepcopy(ma)
    outside_a = nn.Parameter(torch.randn(16))
    outside_b = nn.Parameter(outside_a.detach().clone())

    def trained(m: nn.Module) -> list[nn.Parameter]:
        return [p for p in m.parameters() if p.requires_grad]

    oa = torch.optim.AdamW(trained(ma), lr=1e-2, fused=True)
    ob = PackedAdamW(trained(mb), lr=1e-2)

    def clip_list(m: nn.Module, outside: nn.Parameter) -> list[torch.Tensor]:
        ps = list(m.parameters())
        return {
            "frozen": ps,
            "outside_with_grad": ps + [outside],
            "left_out": ps[1:],
            "twice": ps + ps[:1],
        }[extra]

    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        idx = torch.randint(0, 64, (4, 9), generator=gen)
        for m, outside in ((ma, outside_a), (mb, outside_b)):
            (_loss(m, idx) + (outside * outside).sum()).backward()
        na = nn.utils.clip_grad_norm_(clip_list(ma, outside_a), 0.1)
        oa.step()
        oa.zero_grad()
        nb = ob.clip_step_zero_grad(0.1, parameters=clip_list(mb, outside_b))
        assert bitwise_equal(na, nb), f"step {step}"
        assert all(bitwise_equal(x, y) for x, y in zip(ma.parameters(), mb.parameters())), f"step {step}"
        assert bitwise_equal(outside_a.grad, outside_b.grad), "the outside gradient is clipped as natively"
        outside_a.grad = outside_b.grad = None


def test_state_exists_exactly_where_natives_does():
    """No state before the first step, none for a parameter without a gradient (a frozen one, an
    unused branch), an entry from a parameter's first step with one; state_dict equal throughout,
    and a state dict saved before the first step loads into native and back."""
    torch.manual_seed(2)
    ma = TinyGPTBlock()
    ma.ln_f.requires_grad_(False)
    mb = copy.deepcopy(ma)
    oa = torch.optim.AdamW(ma.parameters(), lr=1e-2, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=1e-2)
    assert not ob.state and state_dict_difference(oa.state_dict(), ob.state_dict()) is None
    empty = ob.state_dict()
    fresh = PackedAdamW(copy.deepcopy(mb).parameters(), lr=1e-2)
    fresh.load_state_dict(empty)
    assert not fresh.state
    gen = torch.Generator().manual_seed(2)
    for step in range(4):
        idx = torch.randint(0, 64, (4, 9), generator=gen)
        for m, o in ((ma, oa), (mb, ob)):
            out = m.emb(idx)
            if step >= 2:  # the MLP joins from the third step
                out = out + m.proj(torch.nn.functional.gelu(m.fc(m.ln(out))))
            m.head(m.ln_f(out)).sum().backward()
            o.step()
            o.zero_grad()
        assert (mb.fc.weight in ob.state) == (step >= 2) == (ma.fc.weight in oa.state)
        assert mb.ln_f.weight not in ob.state
        diff = state_dict_difference(oa.state_dict(), ob.state_dict())
        assert diff is None, f"step {step}: {diff}"
    back = PackedAdamW(copy.deepcopy(mb).parameters(), lr=1e-2)
    back.load_state_dict(oa.state_dict())
    assert state_dict_difference(oa.state_dict(), back.state_dict()) is None


@pytest.mark.parametrize("kernel", ["auto", "torch"])
@pytest.mark.parametrize("call", ["one_pass", "step"])
def test_amsgrad_switched_on_after_building_is_refused_not_a_crash(kernel, call):
    """phase.c trusts that an amsgrad group has its maximum buffer: a group switched after the
    optimizer was built is refused before anything is modified (native's state lacks the entry too)."""
    torch.manual_seed(4)
    m = TinyGPTBlock()
    opt = PackedAdamW(decay_groups(m, [{}, {"weight_decay": 0.0}]), kernel=kernel)
    opt.param_groups[1]["amsgrad"] = True
    _loss(m, torch.randint(0, 64, (2, 9))).backward()
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(RuntimeError, match="parameter group 1 changed amsgrad"):
        if call == "one_pass":
            opt.clip_step_zero_grad(1.0, parameters=m.parameters())
        else:
            opt.step()
    assert all(bitwise_equal(a, b) for a, b in zip(before, m.parameters())) and not opt.state
