"""Byte-level decoder-only transformer: the small, medium and gated GQA configurations.

Follows GPT-2 (Radford et al., 2019) as written in nanoGPT's ``model.py``: learned token and
position embeddings, pre-norm blocks, causal self-attention through
``torch.nn.functional.scaled_dot_product_attention``, an untied output head, no linear biases.
The gated GQA configuration swaps in grouped-query attention (Ainslie et al., 2023), a SwiGLU MLP
and RMSNorm through the same config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.config import ModelConfig
from harness.models.common import MLP, ResidualBlock, init_weights, make_norm


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv = cfg.n_kv_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv = nn.Linear(cfg.d_model, 2 * self.n_kv * self.head_dim, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k, v = self.kv(x).view(B, T, 2, self.n_kv, self.head_dim).unbind(2)  # (B, T, nkv, hs) each
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, nkv, T, hs)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)  # (B, nh, T, hs)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TransformerLM(nn.Module):
    """Maps bytes (B, T) to next-byte logits (B, T, 256)."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(
            ResidualBlock(
                cfg.d_model, cfg.norm, CausalSelfAttention(cfg), MLP(cfg.d_model, cfg.mlp_hidden, cfg.mlp)
            )
            for _ in range(cfg.n_layers)
        )
        self.norm_f = make_norm(cfg.norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        init_weights(self, cfg.n_layers, gen)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x))  # (B, T, vocab)
