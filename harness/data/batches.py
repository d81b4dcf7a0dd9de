"""Seeded training batches and exact bits per byte.

Every byte of a split except the first is predicted exactly once: consecutive windows of the
context length, window ``i`` reading bytes ``[i*T, i*T + T)`` and predicting ``[i*T + 1, i*T + T + 1)``
(the last window shorter). Negative log-likelihoods are summed in float64 nats and divided by
``ln 2`` times the number of predicted bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from prereg.errors import DataError


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class BatchStream:
    """Random training windows of ``context + 1`` bytes from a generator seeded by the run seed alone.

    Both arms of a pair draw exactly the same sequence of batches.
    """

    def __init__(self, train: bytes, context: int, batch_size: int, seed: int) -> None:
        if len(train) < context + 2:
            raise DataError(
                f"training split has {len(train)} bytes; needs more than context + 1 = {context + 1}"
            )
        self.data = as_tensor(train)
        self.context = context
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(context + 1)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - self.context - 1, (self.batch_size,), generator=self.gen)
        window = self.data[starts[:, None] + self.offsets]  # (B, T + 1)
        return window[:, :-1], window[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()


def eval_windows(split: bytes, context: int, max_windows: int | None = None) -> list[tuple[int, int]]:
    """(start, length) of the consecutive evaluation windows; each predicts ``length`` bytes."""
    n_pred = len(split) - 1
    out: list[tuple[int, int]] = []
    start = 0
    while start < n_pred and (max_windows is None or len(out) < max_windows):
        out.append((start, min(context, n_pred - start)))
        start += context
    return out


@torch.no_grad()
def bits_per_byte(
    model: torch.nn.Module,
    split: bytes,
    context: int,
    batch_size: int,
    device: torch.device,
    max_windows: int | None = None,
) -> tuple[float, int]:
    """Exact bits per byte of ``split`` (or its first ``max_windows`` windows); returns (bpb, bytes).

    Windows of equal length are batched in order; the sum is accumulated in float64 on the host
    in a fixed order, so the same weights give the same bits on the same device.
    """
    was_training = model.training
    model.eval()
    data = as_tensor(split)
    windows = eval_windows(split, context, max_windows)
    total_nll = 0.0
    total_bytes = 0
    i = 0
    while i < len(windows):
        length = windows[i][1]
        j = i
        while j < len(windows) and j - i < batch_size and windows[j][1] == length:
            j += 1
        starts = torch.tensor([w[0] for w in windows[i:j]])
        idx = starts[:, None] + torch.arange(length + 1)
        block = data[idx].to(device)  # (b, length + 1)
        logits = model(block[:, :-1])
        nll = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), block[:, 1:].reshape(-1), reduction="none"
        )
        total_nll += float(nll.double().sum().cpu())
        total_bytes += nll.numel()
        i = j
    model.train(was_training)
    if total_bytes == 0:
        raise DataError("evaluation split has no bytes to predict")
    return total_nll / (math.log(2) * total_bytes), total_bytes
