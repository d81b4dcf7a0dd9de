"""Self-check of ``phase.c`` against the running torch: which arithmetic forms reproduce it bit for bit.

Each contraction-dependent form is tried in turn against PyTorch's own kernels on seeded data
(gradients spanning many binades, with ``-0.0``, ``+0.0``, ``inf`` and ``NaN`` entries; clip
coefficients 1 and below 1; three hyperparameter sets covering weight decay on and off, both
branches of the ``lerp`` weight, ``amsgrad`` and ``maximize``, and ``GradScaler``'s ``grad_scale`` and
``found_inf``). The first form that matches every
bit is kept; if none does, the kernel is not used.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

import cotangent.kernel.binding as kernel
from cotangent.norms import clip_coef

#: Update configurations: lr, beta1, beta2, weight_decay, eps, amsgrad, maximize.
UPDATE_CASES = [
    (1e-3, 0.9, 0.999, 0.1, 1e-8, False, False),
    (3e-2, 0.3, 0.99, 0.0, 1e-6, True, True),
    (1e-2, 0.5, 0.95, 0.01, 1e-8, True, False),
    (3e-2, 0.3, 0.99, 0.1, 1e-6, False, True),
]
UPDATE_STEPS = 12
UPDATE_N = 4096
NORM_SIZES = [16, 16, 16, 16, 16, 48, 48, 256, 4096, 4096, 4096, 65536]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    )


def _spread(n: int, gen: torch.Generator) -> torch.Tensor:
    """Values over many binades, signs mixed."""
    return torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 3)


def check_norms(k: kernel.Kernel, acc_fma: int) -> bool:
    gen = torch.Generator().manual_seed(11)
    # similar magnitudes round at every addition; a spread of binades adds range
    ts = [torch.randn(n, generator=gen) if i % 3 else _spread(n, gen) for i, n in enumerate(NORM_SIZES)]
    ts[1][3] = -0.0
    ts[2][5] = float("inf")
    flat = torch.cat(ts)
    numels = [t.numel() for t in ts]
    offsets = [0]
    for n in numels[:-1]:
        offsets.append(offsets[-1] + n)
    first, rows = kernel.tasks_for(numels)
    out = torch.empty(len(ts))
    k.row_norms(
        flat, torch.tensor(offsets), torch.tensor(numels), first, rows, out, torch.get_num_threads(), acc_fma
    )
    ref = torch.stack([torch.linalg.vector_norm(t) for t in ts])
    return _same(out, ref)


def check_total(k: kernel.Kernel, acc_fma: int, tail_form: int) -> bool:
    """Totals of every length up to three vector widths and more (every scalar-tail length, 40
    draws each: a wrong tail form shows in a few percent of draws), specials, and the coefficient."""

    gen = torch.Generator().manual_seed(12)
    cases = [torch.randn(n, generator=gen).abs() for n in range(1, 3 * k.lanes + 2) for _ in range(40)]
    cases += [_spread(n, gen).abs() for n in (5, 61, 200)]
    cases += [
        torch.tensor([1.0, float("inf"), 2.0]),
        torch.tensor([1.0, float("nan"), 2.0]),
        torch.full((5,), 1e-3),
    ]
    scratch, total, coef = torch.empty(256), torch.empty(()), torch.empty(())
    for c, norms in enumerate(cases):
        n = norms.numel()
        perm = torch.randperm(n, generator=gen)
        ref = torch.linalg.vector_norm(norms[perm])
        for max_norm in (1.0, 0.25, 1e6) if c % 10 == 0 or n > 3 * k.lanes + 1 else (1.0,):
            k.total_coef(norms, perm, scratch, max_norm, total, coef, tail_form, acc_fma)
            if not (_same(total, ref) and _same(coef, clip_coef(max_norm, ref))):
                return False
    return True


#: GradScaler's protocol in the update checks: (grad_scale, found_inf per step) for each of
#: :data:`UPDATE_CASES`; a scale that is not a power of two rounds at the division.
UPDATE_AMP = [
    (None, None),
    (None, None),
    (65536.0, (0.0,)),
    (3000.7, (1.0, 0.0)),
]  # the last step: found_inf 0


def check_update(k: kernel.Kernel, sq_form: int) -> bool:
    """Steps of ``phase.c``'s update against ``mul_`` + ``torch._fused_adamw_`` + ``fill_(-0.0)``, the
    step counters handled as ``torch.optim.adamw._fused_adamw`` does (+ 1, then - ``found_inf``),
    with and without ``grad_scale`` and ``found_inf``."""
    gen = torch.Generator().manual_seed(13)
    n = UPDATE_N
    for (lr, b1, b2, wd, eps, amsgrad, maximize), (scale, infs) in zip(UPDATE_CASES, UPDATE_AMP):
        p0 = torch.randn(n, generator=gen)
        ref = [p0.clone(), torch.zeros(n), torch.zeros(n), torch.zeros(n), torch.zeros(1)]
        mine = [p0.clone(), torch.zeros(n), torch.zeros(n), torch.zeros(n), torch.zeros(1)]
        coef = torch.empty(())
        grad_scale = None if scale is None else torch.tensor(scale)
        for t in range(UPDATE_STEPS):
            found_inf = None if infs is None else torch.tensor(infs[t % len(infs)])
            grad = _spread(n, gen) * (1.0 if scale is None else scale)
            grad[::97] = -0.0
            grad[1::101] = 0.0
            if t == UPDATE_STEPS - 1:
                grad[7], grad[8], grad[9] = float("inf"), float("-inf"), float("nan")
            coef.fill_(1.0 if t % 2 else 0.37)
            g = grad.clone()
            _reference_update(ref, g, coef, (lr, b1, b2, wd, eps, amsgrad, maximize), grad_scale, found_inf)
            g2 = grad.clone()
            hyper = kernel.Hyper(
                coef.data_ptr(),
                mine[4].data_ptr(),
                1,
                lr,
                b1,
                b2,
                wd,
                eps,
                int(amsgrad),
                int(maximize),
                sq_form,
                torch.get_num_threads(),
                1024,
                1,
                None if grad_scale is None else grad_scale.data_ptr(),
                None if found_inf is None else found_inf.data_ptr(),
            )
            k.update(mine[0], g2, mine[1], mine[2], mine[3] if amsgrad else None, hyper)
            if not all(_same(a, b) for a, b in zip(ref, mine)) or not _same(g, g2):
                return False
    return True


def _reference_update(
    ref: list[Tensor],
    g: Tensor,
    coef: Tensor,
    case: tuple,
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
) -> None:
    """One step of ``ref`` (param, exp_avg, exp_avg_sq, max_exp_avg_sq, step) as the packed phase
    runs it natively: ``g.mul_(coef)``, ``torch._fused_adamw_`` with the step counter handled as
    ``torch.optim.adamw._fused_adamw`` does, then ``g.fill_(-0.0)``."""
    lr, b1, b2, wd, eps, amsgrad, maximize = case
    g.mul_(coef)
    ref[4].add_(1)
    torch._fused_adamw_(
        [ref[0]],
        [g],
        [ref[1]],
        [ref[2]],
        [ref[3]] if amsgrad else [],
        [ref[4][0]],
        lr=lr,
        beta1=b1,
        beta2=b2,
        weight_decay=wd,
        eps=eps,
        amsgrad=amsgrad,
        maximize=maximize,
        grad_scale=grad_scale,
        found_inf=found_inf,
    )
    if found_inf is not None:
        ref[4].sub_(found_inf)
    g.fill_(-0.0)


def find_forms(lib: ctypes.CDLL, path: Path, widths: list[int], capability: str = "") -> kernel.Kernel | str:
    """The kernel with the lane width and forms that match this torch bit for bit, or why there is
    none. ``widths`` are tried in order (:func:`cotangent.kernel.lane_widths`)."""
    why = "self-check: no lane width to try"
    for lanes in widths:
        found = _forms_at(lib, path, lanes, capability)
        if isinstance(found, kernel.Kernel):
            return found
        why = found
    tried = "/".join(str(w) for w in widths)
    return f"{why} (capability {capability}, lanes tried: {tried})"


def _forms_at(lib: ctypes.CDLL, path: Path, lanes: int, capability: str) -> kernel.Kernel | str:
    probe = kernel.Kernel(lib, path, lanes, 0, 0, 0, capability)
    acc = next((a for a in (0, 1) if check_norms(probe, a)), None)
    if acc is None:
        return "self-check: no norm accumulation form reproduces torch.linalg.vector_norm"
    tail = next((t for t in (0, 1, 2) if check_total(probe, acc, t)), None)
    if tail is None:
        return "self-check: no form reproduces native clipping's total norm and coefficient"
    sq = next((s for s in range(8) if check_update(probe, s)), None)
    if sq is None:
        return "self-check: no form reproduces torch._fused_adamw_"
    return kernel.Kernel(lib, path, lanes, acc, tail, sq, capability)
