"""Bitwise checks of the method's paths against native PyTorch on one device (``harness verify``)."""

from __future__ import annotations

import json
from typing import Any

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (so -0.0 differs from +0.0 and NaN payloads count)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def state_dict_difference(native: dict[str, Any], ours: dict[str, Any]) -> str | None:
    """The first difference between two ``Optimizer.state_dict()`` results, or ``None``: the same
    parameters with state (none before a parameter's first step with a gradient), the same keys,
    tensors of the same dtype, device and bits, and equal parameter groups."""
    if set(native["state"]) != set(ours["state"]):
        return f"state entries: native {sorted(native['state'])}, ours {sorted(ours['state'])}"
    for k, entry in native["state"].items():
        mine = ours["state"][k]
        if set(entry) != set(mine):
            return f"state[{k}] keys: native {sorted(entry)}, ours {sorted(mine)}"
        for key, val in entry.items():
            other = mine[key]
            if isinstance(val, torch.Tensor) != isinstance(other, torch.Tensor):
                return f"state[{k}][{key!r}]: native {type(val).__name__}, ours {type(other).__name__}"
            if isinstance(val, torch.Tensor):
                if val.device != other.device or not bitwise_equal(val, other):
                    return f"state[{k}][{key!r}] differs"
            elif val != other:
                return f"state[{k}][{key!r}]: native {val!r}, ours {other!r}"
    if len(native["param_groups"]) != len(ours["param_groups"]):
        return "number of parameter groups"
    for k, (a, b) in enumerate(zip(native["param_groups"], ours["param_groups"])):
        if set(a) != set(b):
            return f"param_groups[{k}] keys: only native {sorted(set(a) - set(b))}, only ours {sorted(set(b) - set(a))}"
        for key in a:
            x, y = a[key], b[key]
            same = (
                bitwise_equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y
            )
            if not same:
                return f"param_groups[{k}][{key!r}]: native {x!r}, ours {y!r}"
    return None


#: Shapes exercising every path: buckets (even sizes), odd, short, 0-d, one-element, empty, large.
SHAPES: list[tuple[int, ...]] = [
    (256, 256),
    (256, 256),
    (1024, 256),
    (256, 1024),
    (1024, 256),
    (384,),
    (384,),
    (384,),
    (7, 9),
    (7, 9),
    (3,),
    (5,),
    (),
    (1,),
    (0,),
    (64,),
    (64,),
    (131072,),
    (131072,),
    (33, 2),
    (33, 2),
]


def _grads(device: torch.device, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    return [(torch.randn(s, generator=gen) * 3).to(device=device, dtype=dtype) for s in SHAPES]


def check_bucketed_norm(device: torch.device, dtype: torch.dtype) -> bool:
    """Row norms of B x (K/2) x 2 views against native's per-tensor norms, bitwise."""
    from cotangent.norms import bucket_norm, native_norms

    gen = torch.Generator().manual_seed(0)
    for k in (64, 384, 65536, 262144, 1000):
        ts = [(torch.randn(k, generator=gen) * 2).to(device=device, dtype=dtype) for _ in range(3)]
        native = torch.stack(native_norms(ts, device, 2.0, None))
        batched = bucket_norm(torch.stack(ts), k)
        if not bitwise_equal(native, batched):
            return False
    return True


def check_clip(device: torch.device, dtype: torch.dtype) -> bool:
    """The method's clip_grad_norm_ (unpacked) against native: total norm and every gradient."""
    from cotangent import clip_grad_norm_

    gen = torch.Generator().manual_seed(1)
    for max_norm in (1.0, 1e6):
        grads = _grads(device, dtype, gen)
        a = [torch.zeros_like(g, requires_grad=True) for g in grads]
        b = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for x, y, g in zip(a, b, grads):
            x.grad, y.grad = g.clone(), g.clone()
        na = torch.nn.utils.clip_grad_norm_(a, max_norm)
        nb = clip_grad_norm_(b, max_norm)
        if not bitwise_equal(na, nb) or not all(
            x.grad is not None and y.grad is not None and bitwise_equal(x.grad, y.grad) for x, y in zip(a, b)
        ):
            return False
    return True


def check_update(device: torch.device, dtype: torch.dtype, mode: str, steps: int = 40) -> bool:
    """PackedAdamW in ``mode`` plus packed clipping against native clipping + AdamW(fused=True)."""
    from cotangent import PackedAdamW, clip_grad_norm_

    gen = torch.Generator().manual_seed(2)
    init = [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in SHAPES]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    ob = PackedAdamW(b, lr=1e-2, weight_decay=0.1, update=mode, mode="packed")
    for step in range(steps):
        grads = _grads(device, dtype, gen)
        if step == steps // 2:
            for o in (oa, ob):
                o.param_groups[0]["lr"] = 3e-3
        for x, g in zip(a, grads):
            x.grad = g.clone()
        for y, g in zip(b, grads):
            y.grad = g.clone()  # replaced grads are copied into the flat buffer
        na = torch.nn.utils.clip_grad_norm_(a, 1.0)
        nb = clip_grad_norm_(b, 1.0)
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
        if not bitwise_equal(na, nb) or not all(bitwise_equal(x, y) for x, y in zip(a, b)):
            return False
    return True


def check_fused_phase(
    device: torch.device, dtype: torch.dtype, steps: int = 40, backward_norms: bool = False
) -> bool:
    """``PackedAdamW.clip_step_zero_grad`` (this device's paths, CPU blocks of 4 KiB so that large
    parameters span many blocks; with ``backward_norms`` the norms taken in the accumulate hooks)
    against native clip_grad_norm_ + AdamW(fused=True) + zero_grad."""
    from cotangent import PackedAdamW

    gen = torch.Generator().manual_seed(3)
    init = [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in SHAPES]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    ob = PackedAdamW(
        b, lr=1e-2, weight_decay=0.1, block_bytes=4096, backward_norms=backward_norms, mode="packed"
    )
    for _ in range(steps):
        grads = _grads(device, dtype, gen)
        torch.autograd.backward(a, grads)  # the end of a backward: AccumulateGrad (and hooks)
        torch.autograd.backward(b, grads)
        na = torch.nn.utils.clip_grad_norm_(a, 1.0)
        oa.step()
        oa.zero_grad()
        nb = ob.clip_step_zero_grad(1.0)
        if not bitwise_equal(na, nb) or not all(bitwise_equal(x, y) for x, y in zip(a, b)):
            return False
    return True


#: Shapes for the C phase: element counts that are multiples of 16 (what phase.c's loops cover),
#: equal sizes (rows reduced together), buffers longer than one task of its update loop, and sizes
#: of other lengths (a classifier's bias, a stem's channels), which take PyTorch's kernels in the phase.
PHASE_SHAPES: list[tuple[int, ...]] = [
    (256, 256),
    (256, 256),
    (256, 256),
    (256, 256),
    (256, 256),
    (1024, 96),
    (96, 1024),
    (48,),
    (48,),
    (16,),
    (70000, 16),
    (384,),
    (10,),
    (24,),
    (648,),
    (7, 3),
]


def check_native_phase(steps: int = 40, backward_norms: bool = False) -> bool:
    """``clip_step_zero_grad`` in ``phase.c`` against native clip_grad_norm_ + AdamW(fused=True) +
    zero_grad on CPU float32: total norm, parameters, both moments, ``.grad`` None and a -0.0 buffer, with the
    clip active and inactive, weight decay, a learning-rate change and amsgrad (maximize takes the torch
    kernels: a NaN gradient's sign is not reproduced in C)."""
    from cotangent import PackedAdamW

    gen = torch.Generator().manual_seed(4)
    # the first with the gradient buffer kept (phase.c writes -0.0), the second with its pages released
    for kw in (
        {"weight_decay": 0.1, "release_grads": False},
        {"weight_decay": 0.0, "amsgrad": True, "betas": (0.3, 0.99), "release_grads": True},
    ):
        release = kw.pop("release_grads")
        init = [torch.randn(s, generator=gen) for s in PHASE_SHAPES]
        a = [t.clone().requires_grad_() for t in init]
        b = [t.clone().requires_grad_() for t in init]
        oa = torch.optim.AdamW(a, lr=1e-2, fused=True, **kw)
        ob = PackedAdamW(
            b,
            lr=1e-2,
            release_grads=release,  # type: ignore[arg-type]
            backward_norms=backward_norms,
            mode="packed",
            **kw,
        )
        if not ob.phase_kernel().startswith("phase.c"):
            return False
        for step in range(steps):
            grads = [torch.randn(s, generator=gen) * 3 for s in PHASE_SHAPES]
            grads[0][0, :5] = -0.0
            if step == steps // 2:
                for o in (oa, ob):
                    o.param_groups[0]["lr"] = 3e-3
            max_norm = 1.0 if step % 3 else 1e6
            torch.autograd.backward(a, grads)
            torch.autograd.backward(b, grads)
            na = torch.nn.utils.clip_grad_norm_(a, max_norm)
            oa.step()
            oa.zero_grad()
            nb = ob.clip_step_zero_grad(max_norm)
            if not bitwise_equal(na, nb) or not all(bitwise_equal(x, y) for x, y in zip(a, b)):
                return False
            for x, y in zip(a, b):
                sa, sb = oa.state[x], ob.state[y]
                if not all(bitwise_equal(sa[key], sb[key]) for key in sa):
                    return False
            if any(y.grad is not None for y in b):  # as native's zero_grad() leaves them
                return False
            g = ob.flat_groups[0].grad
            if not release and not bool((g.view(torch.int32) == -(2**31)).all()):  # all -0.0
                return False
    return True


def _safe(check: Any, *args: Any) -> bool | None:
    """Run a check; ``None`` when native itself does not support the case on this device."""
    try:
        return bool(check(*args))
    except (RuntimeError, TypeError, NotImplementedError):
        return None


DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
MODES = ("views", "aligned", "flat")
_Row = tuple[str, str, str, bool | None]  # check, dtype, by method, result


def _dtype_checks(
    device: torch.device, dtype: torch.dtype, paths: Any, rows: list[_Row], matched_modes: dict[str, bool]
) -> tuple[int, bool]:
    """The checks of one supported ``dtype``, appended to ``rows``; returns the failures of used
    paths and whether the bucketed norm matched (``matched_modes`` is updated in place)."""
    from cotangent.backnorms import engages

    name = str(dtype).replace("torch.", "")
    failures = 0
    used = dtype in paths.bucketed_norm_dtypes
    norm_ok = _safe(check_bucketed_norm, device, dtype)
    rows.append(
        ("bucketed norm B x (K/2) x 2", name, "used" if used else "not used (native scalar)", norm_ok)
    )
    failures += int(used and not norm_ok)
    ok = _safe(check_clip, device, dtype)
    rows.append(("clip_grad_norm_ vs native", name, "used", ok))
    failures += int(ok is False)
    ok = _safe(check_fused_phase, device, dtype)
    rows.append(("fused clip + step + zero_grad (blocks)", name, "used", ok))
    failures += int(ok is False)
    ok = _safe(check_fused_phase, device, dtype, 12, True)
    rows.append(("... with backward_norms=True", name, "used" if engages(device, dtype) else "not used", ok))
    failures += int(ok is False)
    for mode in MODES:
        ok = _safe(check_update, device, dtype, mode)
        used_mode = mode == paths.update
        rows.append(
            (f"PackedAdamW update={mode} + packed clip", name, "used" if used_mode else "not used", ok)
        )
        failures += int(used_mode and not ok)
        matched_modes[mode] = matched_modes[mode] and bool(ok)
    return failures, bool(norm_ok)


def _kernel_checks(rows: list[_Row]) -> tuple[int, str]:
    """The checks of ``phase.c`` on the CPU, appended to ``rows``; returns the failures and a note."""
    from cotangent import kernel as phase_kernel

    kernel = phase_kernel.kernel()
    if kernel is None:
        rows.append(("one-pass phase in C (phase.c)", "float32", "not used", None))
        return 0, f"phase.c not used: {phase_kernel.unavailable_reason()}"
    failures = 0
    ok = check_native_phase()
    rows.append(("one-pass phase in C (phase.c)", "float32", "used", ok))
    failures += int(not ok)
    ok = check_native_phase(steps=12, backward_norms=True)
    rows.append(("... with backward_norms=True", "float32", "used", ok))
    failures += int(not ok)
    return failures, f"phase.c: {kernel.describe()}"


def _echo_table(rows: list[_Row], echo: Any) -> None:
    """Print the checks' table through ``echo``."""
    w = max(len(r[0]) for r in rows)
    echo(f"{'check'.ljust(w)}  dtype     by method                 result")
    for check, dtype_name, used_s, ok in rows:
        result = "bitwise" if ok else ("n/a" if ok is None else "DIFFERS")
        echo(f"{check.ljust(w)}  {dtype_name.ljust(8)}  {used_s.ljust(24)}  {result}")


def _save_matched(
    device: torch.device, matched_norms: list[str], matched_modes: dict[str, bool], echo: Any
) -> None:
    """Write the matched paths to the file :func:`~cotangent.exactness.saved_path` names."""
    from cotangent.exactness import saved_path

    best = next((m for m in ("flat", "aligned", "views") if matched_modes[m]), "views")
    path = saved_path(device.type)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "device_type": device.type,
        "torch": torch.__version__,
        "bucketed_norm_dtypes": matched_norms,
        "update": best,
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    echo(f"saved matched paths to {path}")


def run_checks(device: torch.device, *, save: bool, echo: Any) -> int:
    """Run every check on ``device``, print a table, return 0 only if no used path mismatched."""
    from cotangent.exactness import exact_paths

    paths = exact_paths(device.type)
    rows: list[_Row] = []
    failures = 0
    matched_norms: list[str] = []
    matched_modes: dict[str, bool] = dict.fromkeys(MODES, True)
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        try:
            torch.zeros(2, dtype=dtype, device=device).sum()
        except (RuntimeError, TypeError):
            rows.append(("(dtype not supported on this device)", name, "not used", None))
            continue
        failed, norm_matched = _dtype_checks(device, dtype, paths, rows, matched_modes)
        failures += failed
        if norm_matched:
            matched_norms.append(name)
    if device.type == "cpu":
        failed, note = _kernel_checks(rows)
        failures += failed
    echo(f"device {device} ({torch.__version__}); method paths: {paths.origin}")
    if device.type == "cpu":
        echo(note)
    _echo_table(rows, echo)
    if save:
        _save_matched(device, matched_norms, matched_modes, echo)
    echo(
        "all paths the method uses are bitwise native" if failures == 0 else f"{failures} used path(s) DIFFER"
    )
    return 0 if failures == 0 else 1
