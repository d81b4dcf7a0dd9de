"""The method in real clients' loops, each against native ``AdamW(fused=True)`` bit for bit.

Each check trains a tiny model twice from the same weights and batches, once natively (the
client's own clipping, ``step`` and ``zero_grad``) and once with :class:`PackedAdamW` taking the
one-pass phase (:meth:`~PackedAdamW.clip_step_zero_grad` where the loop is the user's,
:meth:`~PackedAdamW.clip_in_step` where the client owns it, its clipping turned off), and
compares every parameter, buffer and the optimizer state dict bitwise; then it saves a
checkpoint the client's way, restores it into fresh objects, trains on, and compares again
against the uninterrupted native run. A check returns a :class:`ClientResult`: the client's
version, what ``phase_kernel()`` said, and the first difference (``None`` when bitwise).

``harness verify`` runs every check whose client is installed (``pip install -e '.[clients]'``)
and lists the clients checked; ``tests/test_clients.py`` runs them in the test suite.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import io
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from cotangent.adamw import PackedAdamW
from cotangent.verify import bitwise_equal, state_dict_difference

#: Every client this module checks, with the distribution whose version it reports.
CLIENTS = {
    "transformers": "transformers",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "timm": "timm",
    "torchtune": "torchtune",
}


@dataclass(frozen=True)
class ClientResult:
    client: str
    version: str
    what: str  # the loop checked
    phase_kernel: str
    difference: str | None  # None: bitwise at every comparison


def _models_differ(a: nn.Module, b: nn.Module, where: str) -> str | None:
    sa, sb = a.state_dict(), b.state_dict()
    if list(sa) != list(sb):
        return f"{where}: state dict keys differ"
    for k in sa:
        if not bitwise_equal(sa[k], sb[k]):
            return f"{where}: {k} differs"
    return None


def _differ(ma: nn.Module, mb: nn.Module, oa: Any, ob: Any, where: str) -> str | None:
    diff = _models_differ(ma, mb, where)
    if diff is None:
        d = state_dict_difference(oa.state_dict(), ob.state_dict())
        diff = None if d is None else f"{where}: optimizer state: {d}"
    return diff


def _passes(opt: Any, steps: int, where: str) -> str | None:
    """``None`` when every one of ``steps`` optimizer steps took the one-pass phase."""
    n = opt.one_pass_steps
    return None if n == steps else f"{where}: {n} of {steps} steps took the one-pass phase"


def _phase(model: nn.Module, opt: Any, packed: bool, max_norm: float = 1.0) -> None:
    """The gradient phase of a loop the user owns: native's three calls, or the one pass."""
    if packed:
        opt.clip_step_zero_grad(max_norm, parameters=model.parameters())
    else:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()


def decay_groups(model: nn.Module, wd: float = 0.1) -> list[dict[str, Any]]:
    """The decay / no-decay split these clients make (2-d and more decay; biases and norms do not)."""
    return [
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": wd},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]


@contextmanager
def _quiet() -> Iterator[None]:
    """The clients' progress bars, printed metrics, deprecation notes and info logs, silenced for a check."""
    loggers = [logging.getLogger(n) for n in ("transformers", "accelerate", "lightning", "lightning.pytorch")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old


# -- Hugging Face Trainer ---------------------------------------------------------------------


class _TokenData(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, vocab: int = 64, length: int = 17) -> None:
        self.x = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _gpt2() -> nn.Module:
    """A tiny GPT-2 (tied embeddings, dropout off), the same weights at each call."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    return GPT2LMHeadModel(cfg)


def _hf_groups(m: nn.Module) -> list[dict[str, Any]]:
    """The decay and no-decay groups as ``transformers.Trainer`` makes them."""
    from transformers.trainer_pt_utils import get_parameter_names

    decay = {n for n in get_parameter_names(m, [nn.LayerNorm]) if "bias" not in n}
    named = list(m.named_parameters())
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": 0.1},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


def _hf_run(packed: bool, out: Path, resume: Path | None = None) -> tuple[nn.Module, Any]:
    """4 steps of ``transformers.Trainer`` on :func:`_gpt2`, native or packed, checkpoints in
    ``out`` every 2 steps (resumed from ``resume`` where given)."""
    from transformers import Trainer, TrainingArguments

    m = _gpt2()
    opt: Any
    if packed:
        opt = PackedAdamW(_hf_groups(m), lr=1e-3, mode="packed")
        opt.clip_in_step(1.0, m.parameters())
    else:
        opt = torch.optim.AdamW(_hf_groups(m), lr=1e-3, fused=True)
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=4,
        max_grad_norm=0.0 if packed else 1.0,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=2,
        report_to=[],
        use_cpu=True,
        logging_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    Trainer(model=m, args=args, train_dataset=_TokenData(), optimizers=(opt, None)).train(
        resume_from_checkpoint=str(resume) if resume else None
    )
    return m, opt


def check_transformers(workdir: Path) -> ClientResult:
    """``transformers.Trainer`` on a tiny GPT-2 (tied embeddings, dropout off): decay groups as the
    Trainer makes them, accumulation over 2 micro-batches, a linear schedule, clipping at 1.0
    (native: ``max_grad_norm=1.0``; packed: ``max_grad_norm=0`` and ``clip_in_step``), checkpoints
    in safetensors every 2 steps, and a run resumed from the first checkpoint."""
    # imported here, before _quiet(), so that transformers sets its loggers up outside it
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: F401
    from transformers.trainer_pt_utils import get_parameter_names  # noqa: F401

    with _quiet():
        ma, oa = _hf_run(False, workdir / "native")
        mb, ob = _hf_run(True, workdir / "packed")
        diff = _differ(ma, mb, oa, ob, "after 4 steps") or _passes(ob, 4, "after 4 steps")
        ckpt = workdir / "packed" / "checkpoint-2"
        if diff is None and not (ckpt / "model.safetensors").is_file():
            diff = "no safetensors checkpoint was written"
        if diff is None:
            mc, oc = _hf_run(True, workdir / "packed", resume=ckpt)
            diff = _differ(ma, mc, oa, oc, "resumed from checkpoint-2") or _passes(oc, 2, "resumed")
    return ClientResult(
        "transformers",
        "",
        "Trainer: decay groups, accumulation, clip, safetensors resume",
        ob.phase_kernel(),
        diff,
    )


# -- accelerate ---------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.fc = nn.Linear(32, 64)
        self.ln = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.ln(torch.tanh(self.fc(self.emb(x).mean(1)))))


def _batches(n: int, seed: int = 2) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, 50, (4, 6), generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)
    ]


def check_accelerate(workdir: Path) -> ClientResult:
    """accelerate's loop: ``prepare``, ``accumulate`` over 2 micro-batches, clipping on the sync
    steps (native: ``accelerator.clip_grad_norm_``; packed: ``clip_in_step``), and
    ``save_state``/``load_state`` (safetensors model, optimizer state) half-way, resumed into a
    fresh model and optimizer."""
    from accelerate import Accelerator

    batches = _batches(8)

    def build(packed: bool) -> tuple[Any, nn.Module, Any]:
        torch.manual_seed(0)
        m = _Net()
        if packed:
            opt: Any = PackedAdamW(decay_groups(m), lr=1e-2, mode="packed")
            opt.clip_in_step(0.5, m.parameters())
        else:
            opt = torch.optim.AdamW(decay_groups(m), lr=1e-2, fused=True)
        acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
        pm, po = acc.prepare(m, opt)
        return acc, pm, po

    def train(acc: Any, m: nn.Module, opt: Any, packed: bool, part: list[tuple[Tensor, Tensor]]) -> None:
        for x, y in part:
            with acc.accumulate(m):
                acc.backward(nn.functional.cross_entropy(m(x), y))
                if acc.sync_gradients and not packed:
                    acc.clip_grad_norm_(m.parameters(), 0.5)
                opt.step()
                opt.zero_grad()

    with _quiet():
        acc, ma, oa = build(False)
        train(acc, ma, oa, False, batches)
        acc, mb, ob = build(True)
        train(acc, mb, ob, True, batches[:4])
        acc.save_state(str(workdir / "state"))
        train(acc, mb, ob, True, batches[4:])
        diff = _differ(ma, mb, oa.optimizer, ob.optimizer, "after 4 steps")
        inner = ob.optimizer
        diff = diff or _passes(inner, 4, "after 4 steps")
        if diff is None:
            acc, mc, oc = build(True)
            acc.load_state(str(workdir / "state"))
            train(acc, mc, oc, True, batches[4:])
            diff = _differ(ma, mc, oa.optimizer, oc.optimizer, "resumed from save_state")
            diff = diff or _passes(oc.optimizer, 2, "resumed")
    return ClientResult(
        "accelerate", "", "prepare, accumulate, clip, save_state/load_state", inner.phase_kernel(), diff
    )


# -- Lightning ----------------------------------------------------------------------------


def _lightning_fit(
    module: Any, workdir: Path, batches: list, steps: int, ckpt: Path | None, save: Path | None
) -> tuple[Any, Any]:
    """Fit ``module`` for ``steps`` optimizer steps (from ``ckpt`` where given; a checkpoint to
    ``save`` after, where given); returns the module and its optimizer."""
    import lightning as L

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=2,
        gradient_clip_val=None if module.packed else 0.5,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        default_root_dir=str(workdir),
    )
    loader: Any = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)  # type: ignore[arg-type]
    trainer.fit(module, loader, ckpt_path=str(ckpt) if ckpt else None)
    if save is not None:
        trainer.save_checkpoint(str(save))
    return module, trainer.optimizers[0]


def check_lightning(workdir: Path) -> ClientResult:
    """A LightningModule trained by ``lightning.Trainer`` on CPU: decay groups, accumulation over
    2 batches, clipping by norm (native: ``gradient_clip_val``; packed: ``clip_in_step``, which
    ``optimizer.step(closure)`` runs after the closure), a checkpoint after 2 steps, and the fit
    resumed from it (``ckpt_path``; a resumed fit restarts the epoch's batches, natively too, so
    the resumed runs are compared with each other)."""
    import lightning as L

    batches = _batches(8)

    class Module(L.LightningModule):
        def __init__(self, packed: bool) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = _Net()
            self.packed = packed

        def training_step(self, batch: tuple[Tensor, Tensor], i: int) -> Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            if self.packed:
                opt = PackedAdamW(decay_groups(self.net), lr=1e-2, mode="packed")
                # Lightning clips the optimizer's parameters in its groups' order (main_params)
                opt.clip_in_step(0.5, [p for g in opt.param_groups for p in g["params"]])
                return opt
            return torch.optim.AdamW(decay_groups(self.net), lr=1e-2, fused=True)

    def fit(packed: bool, steps: int, ckpt: Path | None = None, save: Path | None = None) -> Any:
        return _lightning_fit(Module(packed), workdir, batches, steps, ckpt, save)

    with _quiet():  # a resumed fit restarts the epoch's batches (natively too): resumed against resumed
        ma, oa = fit(False, 4)
        mb, ob = fit(True, 4)
        diff = _differ(ma, mb, oa, ob, "after 4 steps") or _passes(ob, 4, "after 4 steps")
        if diff is None:
            fit(False, 2, save=workdir / "native.ckpt")
            ma, oa = fit(False, 4, ckpt=workdir / "native.ckpt")
            fit(True, 2, save=workdir / "packed.ckpt")
            mb, ob = fit(True, 4, ckpt=workdir / "packed.ckpt")
            diff = _differ(ma, mb, oa, ob, "after 4 steps, resumed from a checkpoint at 2")
            diff = diff or _passes(ob, 2, "resumed")
    return ClientResult(
        "lightning", "", "Trainer: accumulation, clip by norm, checkpoint and resume", ob.phase_kernel(), diff
    )


# -- timm ---------------------------------------------------------------------------------


def check_timm(workdir: Path) -> ClientResult:
    """timm's training loop on ``resnet10t`` (stem of 24 channels, a 10-class head: sizes that are
    not multiples of 16): ``param_groups_weight_decay``, clipping, ``ModelEmaV3`` after each step,
    and ``torch.save``/``timm.models.load_checkpoint`` of model and optimizer half-way."""
    import timm
    from timm.optim import param_groups_weight_decay
    from timm.utils import ModelEmaV3

    g = torch.Generator().manual_seed(3)
    batches = [
        (torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(4)
    ]
    torch.manual_seed(0)
    ma = timm.create_model("resnet10t", num_classes=10)
    mb, mc = copy.deepcopy(ma), copy.deepcopy(ma)
    oa = torch.optim.AdamW(param_groups_weight_decay(ma, 0.05), lr=1e-3, fused=True)
    ob = PackedAdamW(param_groups_weight_decay(mb, 0.05), lr=1e-3, mode="packed")
    ea, eb = ModelEmaV3(ma, decay=0.9), ModelEmaV3(mb, decay=0.9)

    def step(m: nn.Module, opt: Any, ema: Any, x: Tensor, y: Tensor, packed: bool) -> None:
        nn.functional.cross_entropy(m(x), y).backward()
        _phase(m, opt, packed)
        ema.update(m)

    diff = None
    with _quiet():
        for k, (x, y) in enumerate(batches):
            step(ma, oa, ea, x, y, False)
            step(mb, ob, eb, x, y, True)
            diff = _differ(ma, mb, oa, ob, f"step {k}") or _models_differ(ea, eb, f"step {k}: EMA")
            if diff:
                break
            if k == 1:
                torch.save(
                    {"state_dict": mb.state_dict(), "optimizer": ob.state_dict()}, workdir / "half.pth"
                )
        if diff is None:  # restore the half-way checkpoint into a fresh copy and train on
            timm.models.load_checkpoint(mc, str(workdir / "half.pth"))
            oc = PackedAdamW(param_groups_weight_decay(mc, 0.05), lr=1e-3, mode="packed")
            oc.load_state_dict(torch.load(workdir / "half.pth", weights_only=True)["optimizer"])
            ec = ModelEmaV3(mc, decay=0.9)
            for x, y in batches[2:]:
                step(mc, oc, ec, x, y, True)
            diff = _differ(ma, mc, oa, oc, "resumed from the checkpoint at step 2")
            diff = diff or _passes(ob, 4, "after 4 steps") or _passes(oc, 2, "resumed")
    return ClientResult(
        "timm", "", "resnet10t: weight-decay groups, clip, EMA, checkpoint", ob.phase_kernel(), diff
    )


# -- torchtune ----------------------------------------------------------------------------


def check_torchtune(workdir: Path) -> ClientResult:
    """torchtune's ``llama3_2`` builder (tied embeddings, grouped-query attention, one parameter
    group) in a plain loop, with activation checkpointing on its layers, and a state dict saved
    with safetensors half-way and loaded into a fresh copy."""
    from safetensors.torch import load_file, save_file
    from torchtune.models.llama3_2 import llama3_2
    from torchtune.modules import TransformerSelfAttentionLayer
    from torchtune.training import set_activation_checkpointing

    torch.manual_seed(0)
    ma = llama3_2(
        vocab_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=32,
        max_seq_len=32,
        intermediate_dim=64,
    )
    set_activation_checkpointing(ma, auto_wrap_policy={TransformerSelfAttentionLayer})
    mb, mc = copy.deepcopy(ma), copy.deepcopy(ma)
    oa = torch.optim.AdamW(ma.parameters(), lr=1e-3, fused=True)
    ob = PackedAdamW(mb.parameters(), lr=1e-3, mode="packed")
    g = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, 64, (2, 12), generator=g) for _ in range(4)]

    def step(m: nn.Module, opt: Any, idx: Tensor, packed: bool) -> None:
        logits = m(idx[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1)).backward()
        _phase(m, opt, packed)

    diff = None
    with _quiet():
        for k, idx in enumerate(batches):
            step(ma, oa, idx, False)
            step(mb, ob, idx, True)
            diff = _differ(ma, mb, oa, ob, f"step {k}")
            if diff:
                break
            if k == 1:
                save_file(mb.state_dict(), str(workdir / "half.safetensors"))
                torch.save(ob.state_dict(), workdir / "half-opt.pt")
        if diff is None:
            mc.load_state_dict(load_file(str(workdir / "half.safetensors")))
            oc = PackedAdamW(mc.parameters(), lr=1e-3, mode="packed")
            oc.load_state_dict(torch.load(workdir / "half-opt.pt", weights_only=True))
            for idx in batches[2:]:
                step(mc, oc, idx, True)
            diff = _differ(ma, mc, oa, oc, "resumed from the checkpoint at step 2")
            diff = diff or _passes(ob, 4, "after 4 steps") or _passes(oc, 2, "resumed")
    return ClientResult(
        "torchtune", "", "llama3_2 tied, activation checkpointing, safetensors", ob.phase_kernel(), diff
    )


CHECKS: dict[str, Callable[[Path], ClientResult]] = {
    "transformers": check_transformers,
    "accelerate": check_accelerate,
    "lightning": check_lightning,
    "timm": check_timm,
    "torchtune": check_torchtune,
}


def installed(client: str) -> str | None:
    """The installed version of ``client``'s distribution, or ``None``."""
    try:
        return importlib.metadata.version(CLIENTS[client])
    except importlib.metadata.PackageNotFoundError:
        return None


def run_client(client: str) -> ClientResult:
    """One client's check in a temporary folder, with its version."""
    version = installed(client) or "not installed"
    with tempfile.TemporaryDirectory(prefix=f"cotangent-{client}-") as d:
        r = CHECKS[client](Path(d))
    return ClientResult(r.client, version, r.what, r.phase_kernel, r.difference)


def check_clients(echo: Any) -> int:
    """The real clients' loops (:mod:`cotangent.clients`) that are installed, one line
    each; returns how many differ from native."""
    failures = 0
    echo("real clients' loops against native (pip install -e '.[clients]' installs them):")
    for client in CHECKS:
        version = installed(client)
        if version is None:
            echo(f"  {client}: not installed, not checked")
            continue
        r = run_client(client)
        path = "phase.c" if r.phase_kernel.startswith("phase.c") else "torch kernels"
        result = "bitwise" if r.difference is None else f"DIFFERS ({r.difference})"
        echo(f"  {client} {version}: {r.what}; one pass on {path}: {result}")
        failures += int(r.difference is not None)
    echo(
        "every installed client's loop is bitwise native"
        if failures == 0
        else f"{failures} client loop(s) DIFFER"
    )
    return failures
