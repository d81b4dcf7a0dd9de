"""Model and training configurations: one strictly validated YAML file per configuration.

A protocol names a configuration and never repeats its settings. The configuration fixes the
model shape, the training settings (batch, context, learning-rate schedule, weight decay,
clipping threshold) and the evaluation settings.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import yamlio
from harness.plugins import is_plugin
from prereg.errors import InputError
from prereg.protocol.schema import Field, mapping, non_negative, one_of, positive


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "transformer", "conv", or a plug-in class by import path (module:Class)
    d_model: int  # residual width
    n_layers: int  # number of blocks
    context: int  # tokens (bytes) per training window
    mlp: str  # "gelu" (GPT-2 MLP) or "swiglu" (gated)
    mlp_hidden: int  # hidden width of the MLP
    norm: str  # "layernorm" or "rmsnorm"
    n_heads: int = 0  # attention query heads (transformer)
    n_kv_heads: int = 0  # key/value heads; < n_heads is grouped-query attention (transformer)
    kernel_size: int = 0  # depthwise causal convolution width (conv)
    vocab: int = 256  # bytes


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int  # windows per step
    lr: float  # peak learning rate
    warmup_steps: int  # linear warmup from lr/warmup_steps to lr
    schedule: str  # "constant" or "cosine" (to min_lr_ratio * lr at the protocol's last step)
    min_lr_ratio: float  # final learning rate as a fraction of lr (cosine)
    weight_decay: float  # decoupled (AdamW) weight decay on every parameter
    beta1: float
    beta2: float
    eps: float
    clip_norm: float  # max global 2-norm of the gradients


@dataclass(frozen=True)
class EvalConfig:
    batch_size: int  # windows per evaluation forward pass
    val_subset_windows: int  # the fixed validation subset: the first N windows of the split


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig
    sha256: str  # of the file's bytes
    path: str

    def lr_at(self, step: int, total_steps: int) -> float:
        """Learning rate for 0-based ``step`` of ``total_steps``."""
        t = self.train
        if t.warmup_steps and step < t.warmup_steps:
            return t.lr * (step + 1) / t.warmup_steps
        if t.schedule == "constant":
            return t.lr
        span = max(1, total_steps - t.warmup_steps)
        progress = min(1.0, (step - t.warmup_steps) / span)
        return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "model": asdict(self.model),
            "train": asdict(self.train),
            "eval": asdict(self.eval),
        }


def _check_transformer(m: ModelConfig) -> tuple[str, str] | None:
    if m.n_heads <= 0 or m.d_model % m.n_heads:
        return "n_heads", "n_heads must be positive and divide d_model"
    if m.n_kv_heads <= 0 or m.n_heads % m.n_kv_heads:
        return "n_kv_heads", "n_kv_heads must be positive and divide n_heads"
    if m.kernel_size:
        return "kernel_size", "kernel_size is for the conv family"
    return None


def _check_conv(m: ModelConfig) -> tuple[str, str] | None:
    if m.kernel_size <= 0:
        return "kernel_size", "the conv family needs a positive kernel_size"
    if m.n_heads or m.n_kv_heads:
        return "n_heads", "n_heads and n_kv_heads are for the transformer family"
    return None


#: The built-in families' validation (one registry; the classes are in harness.models.FAMILIES). A
#: new built-in family is one file in harness/models/ and one line here and there.
FAMILY_CHECKS: dict[str, Callable[[ModelConfig], tuple[str, str] | None]] = {
    "transformer": _check_transformer,
    "conv": _check_conv,
}

_MODEL = {
    "family": Field(
        str,
        check=lambda v: (
            None
            if v in FAMILY_CHECKS or is_plugin(v)
            else f"must be one of {', '.join(FAMILY_CHECKS)} or a plug-in module:Class"
        ),
    ),
    "d_model": Field(int, check=positive),
    "n_layers": Field(int, check=positive),
    "context": Field(int, check=positive),
    "mlp": Field(str, check=one_of("gelu", "swiglu")),
    "mlp_hidden": Field(int, check=positive),
    "norm": Field(str, check=one_of("layernorm", "rmsnorm")),
    "n_heads": Field(int, required=False, default=0, check=non_negative),
    "n_kv_heads": Field(int, required=False, default=0, check=non_negative),
    "kernel_size": Field(int, required=False, default=0, check=non_negative),
}
_TRAIN = {
    "batch_size": Field(int, check=positive),
    "lr": Field(float, check=positive),
    "warmup_steps": Field(int, check=non_negative),
    "schedule": Field(str, check=one_of("constant", "cosine")),
    "min_lr_ratio": Field(float, required=False, default=0.1, check=non_negative),
    "weight_decay": Field(float, check=non_negative),
    "beta1": Field(float, check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
    "beta2": Field(float, check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
    "eps": Field(float, check=positive),
    "clip_norm": Field(float, check=positive),
}
_EVAL = {
    "batch_size": Field(int, check=positive),
    "val_subset_windows": Field(int, check=positive),
}
_TOP = {
    "name": Field(str),
    "description": Field(str),
    "model": Field(dict),
    "train": Field(dict),
    "eval": Field(dict),
}


def load_config(path: str | Path) -> Config:
    """Load and validate one configuration file."""
    doc = yamlio.load(path)
    top = mapping(doc, doc.data, (), _TOP)
    m = mapping(doc, top["model"], ("model",), _MODEL)
    model = ModelConfig(**m)
    check = FAMILY_CHECKS.get(model.family)
    if check is not None:  # a plug-in family validates itself when it is built (harness.models)
        problem = check(model)
        if problem is not None:
            raise doc.error(("model", problem[0]), problem[1])
    train = TrainConfig(**mapping(doc, top["train"], ("train",), _TRAIN))
    ev = EvalConfig(**mapping(doc, top["eval"], ("eval",), _EVAL))
    if top["name"] != Path(path).stem:
        raise doc.error(("name",), f"name {top['name']!r} must match the file name {Path(path).stem!r}")
    return Config(
        name=top["name"],
        description=top["description"],
        model=model,
        train=train,
        eval=ev,
        sha256=hashlib.sha256(doc.raw).hexdigest(),
        path=str(path),
    )


def config_dir(start: Path | None = None) -> Path:
    """The ``configs/`` folder: nearest above ``start`` (default: cwd), else beside the package."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "configs").is_dir():
            return d / "configs"
    return Path(__file__).resolve().parent.parent / "configs"


def find_config(name: str, directory: Path) -> Config:
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
        raise InputError(f"unknown configuration {name!r} (known: {known})", file=str(path))
    return load_config(path)


def all_configs(directory: Path) -> list[Config]:
    return [load_config(p) for p in sorted(directory.glob("*.yaml"))]
