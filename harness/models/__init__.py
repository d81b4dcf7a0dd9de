"""Byte-level language models, one file per family, in one registry (:data:`FAMILIES`).

A configuration names a built-in family (``transformer``, ``conv``) or a plug-in class by import
path (``mypkg.models:MyLM``). Every family is built the same way: ``cls(cfg: ModelConfig,
gen: torch.Generator)``, drawing its initial weights from ``gen`` only; a plug-in class may define
``check(cfg) -> str | None`` to refuse a configuration it cannot build.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from harness.config import ModelConfig
from harness.models.conv import CausalConvLM
from harness.models.transformer import TransformerLM
from harness.plugins import is_plugin

FAMILIES: dict[str, Callable[[ModelConfig, torch.Generator], torch.nn.Module]] = {
    "transformer": TransformerLM,
    "conv": CausalConvLM,
}


def family_class(name: str) -> Callable[[ModelConfig, torch.Generator], torch.nn.Module]:
    if name in FAMILIES:
        return FAMILIES[name]
    if is_plugin(name):
        module, _, attr = name.partition(":")
        cls = getattr(importlib.import_module(module), attr, None)
        if cls is None:
            raise ValueError(f"model family {name!r}: {module} has no {attr}")
        check = getattr(cls, "check", None)
        return cls if check is None else _checked(cls, check)
    raise ValueError(
        f"unknown model family {name!r} (known: {', '.join(FAMILIES)}, or a plug-in module:Class)"
    )


def _checked(cls, check):  # type: ignore[no-untyped-def]
    def build(cfg: ModelConfig, gen: torch.Generator) -> torch.nn.Module:
        problem = check(cfg)
        if problem:
            raise ValueError(f"model family {cfg.family}: {problem}")
        return cls(cfg, gen)

    return build


def build_model(cfg: ModelConfig, seed: int) -> torch.nn.Module:
    """Build the model for ``cfg`` with weights initialised deterministically from ``seed``."""
    return family_class(cfg.family)(cfg, torch.Generator().manual_seed(seed))


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["FAMILIES", "CausalConvLM", "TransformerLM", "build_model", "count_parameters", "family_class"]
