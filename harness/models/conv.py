"""Byte-level causal convolution language model.

A stack of residual blocks, each a causal (left-padded) depthwise 1-D convolution followed by a
gated (SwiGLU) MLP, pre-norm with RMSNorm, as in gated convolutional LMs (Dauphin et al., 2017)
and the short-convolution blocks of H3/Hyena-style models. Token embedding, no position
embedding (the convolution is position-aware), untied output head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.config import ModelConfig
from harness.models.common import MLP, ResidualBlock, init_weights, make_norm


class CausalDepthwiseConv(nn.Module):
    def __init__(self, d: int, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv1d(d, d, kernel, groups=d, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # (B, C, T + k - 1): left pad only
        return self.conv(y).transpose(1, 2)  # (B, T, C)


class CausalConvLM(nn.Module):
    """Maps bytes (B, T) to next-byte logits (B, T, 256)."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(
            ResidualBlock(
                cfg.d_model,
                cfg.norm,
                CausalDepthwiseConv(cfg.d_model, cfg.kernel_size),
                MLP(cfg.d_model, cfg.mlp_hidden, cfg.mlp),
            )
            for _ in range(cfg.n_layers)
        )
        self.norm_f = make_norm(cfg.norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        init_weights(self, cfg.n_layers, gen)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x))  # (B, T, vocab)
