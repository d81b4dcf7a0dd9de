"""Pieces shared by the model families: norms, gated MLP, deterministic initialisation."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich, 2019) with a learned scale, no bias."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(kind: str, d: int) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(d)
    if kind == "rmsnorm":
        return RMSNorm(d)
    raise ValueError(f"unknown norm {kind!r}")


class MLP(nn.Module):
    """GELU MLP (GPT-2) or SwiGLU (Shazeer, 2020), no biases."""

    def __init__(self, d: int, hidden: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.up = nn.Linear(d, hidden, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False) if kind == "swiglu" else None
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


def init_weights(model: nn.Module, n_layers: int, gen: torch.Generator) -> None:
    """GPT-2 initialisation from one generator, in module order, so a seed fixes every weight.

    Linear and embedding weights ~ N(0, 0.02); output projections of residual branches scaled by
    1/sqrt(2 n_layers); norm scales 1, biases 0; convolution weights ~ N(0, 1/sqrt(kernel)).
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            elif "conv" in name:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                std = 0.02
                if name.endswith(("proj.weight", "down.weight")):
                    std = 0.02 / math.sqrt(2 * n_layers)
                p.copy_(torch.randn(p.shape, generator=gen) * std)


class ResidualBlock(nn.Module):
    """Pre-norm residual block: ``x + mix(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, d: int, norm: str, mix: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm1 = make_norm(norm, d)
        self.mix = mix
        self.norm2 = make_norm(norm, d)
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.norm1(x))
        return x + self.mlp(self.norm2(x))
