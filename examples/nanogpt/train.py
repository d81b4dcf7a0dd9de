"""A nanoGPT-style training script of its own, as a user would have it: a small GPT on the bytes of
Python's ``pydoc_data.topics`` (the embedded corpus), AdamW, validation loss in bits per byte.

It knows nothing of the harness but the reporter (four calls); run it alone and it trains and
prints as before. ``examples/nanogpt/protocol.yaml`` compares ``--optimizer foreach`` (AdamW's
foreach path) with ``--optimizer fused`` (``AdamW(fused=True)``) on the same seeds.

    python examples/nanogpt/train.py --seed 1 --steps 40 --optimizer fused
"""

from __future__ import annotations

import argparse
import math
from pydoc_data.topics import topics

import torch
import torch.nn.functional as F
from torch import nn

from harness.reporter import Reporter


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, ctx: int, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 256, bias=False)
        self.head.weight = self.tok.weight  # tied, as in nanoGPT
        self.register_buffer("mask", torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    data = "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(0.95 * len(t))
    return t[:cut], t[cut:]


def batch(data: torch.Tensor, n: int, ctx: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.randint(len(data) - ctx - 1, (n,), generator=gen)
    x = torch.stack([data[j : j + ctx] for j in i.tolist()])
    y = torch.stack([data[j + 1 : j + ctx + 1] for j in i.tolist()])
    return x, y


@torch.no_grad()
def bits_per_byte(model: nn.Module, data: torch.Tensor, ctx: int, batches: int = 4) -> float:
    gen = torch.Generator().manual_seed(0)  # the same validation bytes for every run
    model.eval()
    total = 0.0
    for _ in range(batches):
        x, y = batch(data, 8, ctx, gen)
        total += F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return total / batches / math.log(2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--optimizer", choices=["foreach", "fused"], default="fused")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="the reporter's file (the harness passes it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, valid = corpus()
    model = GPT(args.ctx)
    fused = args.optimizer == "fused"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=fused, foreach=not fused)
    gen = torch.Generator().manual_seed(args.seed)  # the pair's batches: the same for both arms
    r = Reporter.from_env(args.out)
    for step in range(1, args.steps + 1):
        x, y = batch(train, args.batch, args.ctx, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        r.step(step, loss.item(), tokens=x.numel())
        if step % args.eval_every == 0 or step == args.steps:
            with r.untimed():
                bpb = bits_per_byte(model, valid, args.ctx)
                r.eval(step, {"val_bpb": bpb})
                print(f"step {step} loss {loss.item():.4f} val_bpb {bpb:.4f}", flush=True)
    r.done()


if __name__ == "__main__":
    main()
