"""What stepping natively leaves on the parameters: autograd's hook state as native's.

``PackedAdamW`` delivers gradients into its slots through a gradient hook and a post-accumulate
hook on each parameter. Stepping natively (``set_mode("native")``, ``mode="native"``, or
``mode="auto"`` once it chose native) removes them; a removed hook leaves an empty dictionary
behind, and autograd calls into Python for every parameter with one (about a microsecond each,
every backward), so a model that steps natively was slower in backward than a native one
(``benchmarks/native_split.py``). Checked here against a model that never met the optimizer.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from cotangent import PackedAdamW


def _model(seed: int, widths: list[int]) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _hook_state(model: torch.nn.Module) -> list[tuple[object, object]]:
    return [
        (
            None if p._backward_hooks is None else len(p._backward_hooks),
            None if p._post_accumulate_grad_hooks is None else len(p._post_accumulate_grad_hooks),
        )
        for p in model.parameters()
    ]


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, width: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(4, width, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    widths=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    user_hook=st.sampled_from(["none", "before", "before_removed"]),
    how=st.sampled_from(["constructor", "set_mode"]),
)
def test_native_stepping_leaves_the_hook_state_of_a_native_model(
    seed: int, widths: list[int], user_hook: str, how: str
) -> None:
    """After the switch to native, every parameter's hook dictionaries are what they are on the
    same model trained with ``torch.optim.AdamW(fused=True)``, and a user's own hooks still run as
    often as there."""
    calls = {"ours": 0, "native": 0}
    models = {"ours": _model(seed, widths), "native": _model(seed, widths)}
    for name, m in models.items():
        for p in m.parameters():
            if user_hook != "none":
                h = p.register_hook(lambda g, name=name: calls.__setitem__(name, calls[name] + 1))
                if user_hook == "before_removed":
                    h.remove()
    native = torch.optim.AdamW(models["native"].parameters(), lr=1e-2, fused=True)
    if how == "constructor":
        ours = PackedAdamW(models["ours"].parameters(), lr=1e-2, mode="native")
    else:
        ours = PackedAdamW(models["ours"].parameters(), lr=1e-2, mode="packed")
        _train(models["ours"], ours, 2, widths[0])
        _train(models["native"], native, 2, widths[0])
        ours.set_mode("native")
    _train(models["ours"], ours, 3, widths[0])
    _train(models["native"], native, 3, widths[0])
    assert _hook_state(models["ours"]) == _hook_state(models["native"])
    assert calls["ours"] == calls["native"]
    for a, b in zip(models["ours"].parameters(), models["native"].parameters()):
        assert torch.equal(a, b)


def test_packing_again_delivers_into_the_slots() -> None:
    """``set_mode("packed")`` after the hooks were dropped registers them again: the gradients
    land in the flat buffer (the slots), as before the switch."""
    model = _model(0, [5, 4, 3])
    opt = PackedAdamW(model.parameters(), lr=1e-2, mode="packed")
    opt.set_mode("native")
    assert all(p._backward_hooks is None for p in model.parameters())
    opt.set_mode("packed")
    assert all(p._backward_hooks for p in model.parameters())
    model(torch.randn(2, 5)).sum().backward()
    pack = opt._pack
    for i, p in enumerate(pack.params):
        assert p.grad is not None
        assert p.grad.untyped_storage().data_ptr() == pack.grad_views[i].untyped_storage().data_ptr()
