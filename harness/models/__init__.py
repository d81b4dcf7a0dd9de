"""Byte-level language models, one file per family; :func:`build_model` picks by config."""
from __future__ import annotations

import torch

from harness.config import ModelConfig
from harness.models.conv import CausalConvLM
from harness.models.transformer import TransformerLM


def build_model(cfg: ModelConfig, seed: int) -> torch.nn.Module:
    """Build the model for ``cfg`` with weights initialised deterministically from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    if cfg.family == "transformer":
        return TransformerLM(cfg, gen)
    if cfg.family == "conv":
        return CausalConvLM(cfg, gen)
    raise ValueError(f"unknown model family {cfg.family!r}")


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["build_model", "count_parameters", "TransformerLM", "CausalConvLM"]
