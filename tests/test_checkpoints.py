"""Checkpoints of a model trained by PackedAdamW keep every tensor: each parameter lives in the
flat buffer's memory but in a storage of its own, so writers that group tensors by storage
(safetensors' shared-tensor removal, ``torch.save``, ``torch.distributed.checkpoint``) write and
read back every parameter bitwise, and a model restored from them trains on bitwise as native."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from cotangent import PackedAdamW
from cotangent.verify import bitwise_equal, state_dict_difference

safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")


def model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Embedding(64, 32), nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64)
    )


def train(m: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, 64, (4, 9), generator=gen)
        logits = m(idx[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad()


def save_load(kind: str, m: nn.Module, into: nn.Module, tmp: Path) -> None:
    if kind == "safetensors.save_model":
        safetensors_torch.save_model(m, str(tmp / "m.safetensors"))
        missing, unexpected = safetensors_torch.load_model(into, str(tmp / "m.safetensors"))
        assert not missing and not unexpected
    elif kind == "safetensors.save_file":
        safetensors_torch.save_file(m.state_dict(), str(tmp / "m.safetensors"))
        into.load_state_dict(safetensors_torch.load_file(str(tmp / "m.safetensors")))
    elif kind == "torch.save":
        torch.save(m.state_dict(), tmp / "m.pt")
        into.load_state_dict(torch.load(tmp / "m.pt", weights_only=True))
    else:
        import torch.distributed.checkpoint as dcp

        dcp.save(m.state_dict(), checkpoint_id=str(tmp / "dcp"))
        target = into.state_dict()
        dcp.load(target, checkpoint_id=str(tmp / "dcp"))
        into.load_state_dict(target)


@pytest.mark.parametrize("kind", ["safetensors.save_model", "safetensors.save_file", "torch.save", "dcp"])
def test_a_checkpoint_keeps_every_tensor_and_training_resumes_bitwise(kind, tmp_path):
    ma, mb = model(), model()
    oa = torch.optim.AdamW(ma.parameters(), lr=1e-2, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=1e-2)
    train(ma, oa, 3, seed=1)
    train(mb, ob, 3, seed=1)
    # every parameter written and read back, none dropped as "shared"
    restored = model()
    save_load(kind, mb, restored, tmp_path)
    names = [n for n, _ in mb.named_parameters()]
    for n, p, q in zip(names, mb.parameters(), restored.parameters()):
        assert bitwise_equal(p, q), f"{kind}: {n} not restored"
    # the optimizer's state through torch.save (weights_only) too, then both runs go on
    torch.save(ob.state_dict(), tmp_path / "opt.pt")
    resumed_model = model()
    save_load(kind, mb, resumed_model, tmp_path)
    resumed = PackedAdamW(resumed_model.parameters(), lr=1e-2)
    resumed.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    train(ma, oa, 3, seed=2)
    train(resumed_model, resumed, 3, seed=2)
    for n, p, q in zip(names, ma.parameters(), resumed_model.parameters()):
        assert bitwise_equal(p, q), f"{kind}: {n} after resuming"
    assert state_dict_difference(oa.state_dict(), resumed.state_dict()) is None


def test_parameters_keep_living_in_the_flat_buffer():
    """The storage of one's own is an alias, not a copy: the optimizer's flat writes are the
    parameter's values, and a deep copy of the model is independent of the buffer."""
    m = model()
    opt = PackedAdamW(m.parameters(), lr=1e-2)
    flat = opt.flat_groups[0].param
    p = next(m.parameters())
    assert p.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr() or p.numel() == flat.numel()
    lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    assert all(lo <= q.data_ptr() < hi for q in m.parameters())
    twin = copy.deepcopy(m)
    with torch.no_grad():
        flat.add_(1.0)
    assert not bitwise_equal(next(twin.parameters()), p)
