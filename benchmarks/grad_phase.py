"""Gradient-phase benchmark: clip + optimizer step + zero_grad for each arm, side by side.

For the parameter shapes of real model configurations, in one process, variants interleaved
round-robin; the median of many repetitions and each variant's ratio to ``native``:

* ``native``, ``bucketed``, ``packed``, ``cotangent``: the study's four arms (cotangent);
* ``compiled``: the strong peer, native clipping and AdamW step under ``torch.compile``
  (learning rate as a tensor, so changing it does not recompile);
* ``floor``: the physical limit, not a variant that runs: the bytes the exact phase must move
  (per coordinate: the gradient read once for the norms, then parameter, gradient and both moments
  read and written back, the gradient as -0.0: 9 accesses of the element size, 2 more with
  amsgrad) divided by this machine's best measured streaming bandwidth (a STREAM-style copy and
  triad over buffers of the phase's size, all threads, best of ``--stream-reps``). A variant at
  1.0x the floor moves its bytes at the bandwidth of a plain copy.

Before each timed phase, gradients are delivered by autograd itself: ``torch.autograd.backward``
on the parameters with fixed gradient tensors runs the same ``AccumulateGrad`` (and the packed
optimizer's hooks) that ends a real backward (native: a fresh tensor stored as ``.grad``; packed:
accumulated in place into the flat buffer). That delivery is timed too and reported separately,
so a cost moved out of the phase stays visible. ``cotangent/torch`` is the candidate with
``kernel="torch"``: the same phase on PyTorch's kernels in cache-sized blocks, where ``cotangent``
itself runs ``cotangent/kernel/phase.c`` (when its self-check passed; the header says which).
``--block-sweep`` adds ``cotangent/torch`` variants built with other CPU block sizes
(``block_bytes``; default ``cotangent.CPU_BLOCK_BYTES``), side by side.
Peak memory: each arm trains the real model in its own process; after two steady-state steps
(so every arm's optimizer state exists) the peak RSS is reset (Linux ``/proc/self/clear_refs``)
and the peak of the next steps is reported (median of ``--memory-repeats`` processes per arm,
arms interleaved), with glibc's mmap threshold fixed at 64 KiB so that RSS follows live memory.

``--whole-step-reps N`` adds whole training iterations (forward + backward + phase), native against
cotangent interleaved, for the configurations and ``nanogpt_small`` (``benchmarks/whole_step.py``): the
phase's share of native's step and the whole-step ratio. The header names the CPU model, the
instruction set torch dispatches (``ATEN_CPU_CAPABILITY`` lowers it), and the phase kernel with its forms.

    python benchmarks/grad_phase.py --configs small_transformer --reps 60 --json runs/bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

import cotangent as cot  # noqa: E402
from cotangent import kernel as phase_kernel  # noqa: E402
from harness.arms import ARMS, build_arm  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.machine import cpu_model  # noqa: E402
from harness.models import build_model  # noqa: E402

LR, WD, MAX_NORM = 1e-3, 0.1, 1.0


def _params(config: str) -> list[torch.Tensor]:
    cfg = load_config(ROOT / "configs" / f"{config}.yaml")
    return [p.detach().clone() for p in build_model(cfg.model, 0).parameters()]


def _arm_options(options: list[str]) -> dict[str, Any]:
    """``torch``: kernel="torch"; ``<k>KiB``: block_bytes; ``release``: release_grads=True; ``keep``:
    release_grads=False (the gradient buffer stays resident between steps); ``backward``:
    backward_norms=True (each gradient's norm taken in its accumulate hook, during backward)."""
    kw: dict[str, Any] = {}
    for opt in options:
        if opt == "torch":
            kw["kernel"] = "torch"
        elif opt == "release":
            kw["release_grads"] = True
        elif opt == "keep":
            kw["release_grads"] = False
        elif opt == "backward":
            kw["backward_norms"] = True
        else:
            kw["block_bytes"] = int(opt.removesuffix("KiB")) * 1024
    return kw


MEMORY_VARIANTS = [*ARMS, "cotangent/torch", "cotangent/release", "cotangent/backward"]


class Variant:
    def __init__(self, name: str, init: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        self.name = name
        self.grads = grads
        self.params = [torch.nn.Parameter(t.clone()) for t in init]
        arm, *options = name.split(
            "/"
        )  # cotangent, cotangent/torch, cotangent/torch/512KiB, cotangent/release
        if arm in ARMS:
            self.arm = build_arm(
                arm, self.params, lr=LR, weight_decay=WD, max_norm=MAX_NORM, **_arm_options(options)
            )
            self.phase = self.arm.phase
        elif name == "compiled":
            self.lr = torch.tensor(LR)
            opt = torch.optim.AdamW(self.params, lr=self.lr, weight_decay=WD, foreach=True, capturable=True)
            params = self.params

            @torch.compile
            def step() -> None:
                torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
                opt.step()

            def phase() -> None:
                step()
                opt.zero_grad(set_to_none=True)

            self.phase = phase

    def deliver(self) -> None:
        torch.autograd.backward(self.params, self.grads)  # AccumulateGrad, hooks included


def time_variants(config: str, reps: int, names: list[str]) -> dict[str, dict[str, float]]:
    init = _params(config)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(t.shape, generator=gen) for t in init]
    variants = [Variant(n, init, grads) for n in names]
    for v in variants:  # warm-up (compilation included)
        for _ in range(3):
            v.deliver()
            v.phase()
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    deliver: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(reps):
        for v in variants:
            t0 = time.perf_counter()
            v.deliver()
            t1 = time.perf_counter()
            v.phase()
            t2 = time.perf_counter()
            deliver[v.name].append(t1 - t0)
            times[v.name].append(t2 - t1)
    base = statistics.median(times["native"])
    base_total = statistics.median(times["native"]) + statistics.median(deliver["native"])
    out = {}
    for name in names:
        med = statistics.median(times[name])
        dmed = statistics.median(deliver[name])
        out[name] = {
            "phase_ms": med * 1e3,
            "ratio": med / base,
            "delivery_ms": dmed * 1e3,
            "phase_plus_delivery_ratio": (med + dmed) / base_total,
        }
    return out


#: Element accesses per coordinate of the exact phase (norm read; p, g, m, v read; p, m, v, g written).
PHASE_ACCESSES = 9
#: ... of the phase once the norms were taken in backward (p, g, m, v read; p, m, v, g written).
ONE_PASS_ACCESSES = 8


def stream_bandwidth(numel: int, reps: int) -> dict[str, float]:
    """Best streaming bandwidth (bytes/s) over float32 buffers of ``numel`` elements, all threads:
    copy ``a = b`` (2 accesses per element) and triad ``a = b + s * c`` (3), best of ``reps``."""
    a, b, c = (torch.rand(numel) for _ in range(3))
    best = {"copy": 0.0, "triad": 0.0}
    for _ in range(reps):
        t0 = time.perf_counter()
        a.copy_(b)
        t1 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        t2 = time.perf_counter()
        best["copy"] = max(best["copy"], 2 * 4 * numel / (t1 - t0))
        best["triad"] = max(best["triad"], 3 * 4 * numel / (t2 - t1))
    return best


def floor(config: str, reps: int) -> dict[str, float]:
    """The phase's bytes over the best bandwidth: a lower bound on its time on this machine."""
    numel = sum(t.numel() for t in _params(config))
    bw = stream_bandwidth(numel, reps)
    best = max(bw.values())
    moved = PHASE_ACCESSES * 4 * numel
    return {
        "bytes": moved,
        "copy_GBps": bw["copy"] / 1e9,
        "triad_GBps": bw["triad"] / 1e9,
        "best_GBps": best / 1e9,
        "floor_ms": moved / best * 1e3,
        "one_pass_floor_ms": ONE_PASS_ACCESSES * 4 * numel / best * 1e3,
    }


def add_floor_ratios(timing: dict[str, dict[str, float]], lim: dict[str, float]) -> None:
    """Each variant's phase over the floor of the bytes it still moves: ``floor_ms`` (9 accesses),
    or ``one_pass_floor_ms`` (8) for a ``/backward`` variant, whose norm read moved into backward.
    For those also the norm work (its delivery minus the same variant's without ``/backward``) and
    phase + norm work over the floor of all the bytes both move (9 accesses)."""
    for name, t in timing.items():
        if "/backward" not in name:
            t["floor_ratio"] = t["phase_ms"] / lim["floor_ms"]
            continue
        t["floor_ratio"] = t["phase_ms"] / lim["one_pass_floor_ms"]
        base = name.replace("/backward", "")
        if base in timing:
            t["norm_work_ms"] = t["delivery_ms"] - timing[base]["delivery_ms"]
            t["with_norm_work_floor_ratio"] = (t["phase_ms"] + t["norm_work_ms"]) / lim["floor_ms"]


def peak_memory(config: str, steps: int, repeats: int) -> dict[str, int]:
    """Per arm, the median over ``repeats`` fresh processes of the peak RSS (bytes) of training
    ``config`` for ``steps`` steady-state steps; the arms' processes interleaved round-robin."""
    peaks: dict[str, list[int]] = {arm: [] for arm in MEMORY_VARIANTS}
    for _ in range(repeats):
        for arm in MEMORY_VARIANTS:
            peaks[arm].append(_peak_once(config, arm, steps))
    return {arm: int(statistics.median(v)) for arm, v in peaks.items()}


def _peak_once(config: str, arm: str, steps: int) -> int:
    cfg_path = ROOT / "configs" / f"{config}.yaml"
    code = (
        "import torch, torch.nn.functional as F\n"
        "from harness.devices import peak_rss_bytes\n"
        "from harness.config import load_config; from harness.models import build_model\n"
        "from harness.arms import build_arm\n"
        "from grad_phase import _arm_options  # this script: the child runs in its folder\n"
        f"cfg = load_config({str(cfg_path)!r}); m = build_model(cfg.model, 0); t = cfg.train\n"
        f"a = build_arm({arm.split('/')[0]!r}, m.parameters(), lr=t.lr, weight_decay=t.weight_decay, max_norm=t.clip_norm, "
        f"**_arm_options({arm.split('/')[1:]!r}))\n"
        "g = torch.Generator().manual_seed(0)\n"
        "def step():\n"
        "    x = torch.randint(0, 256, (t.batch_size, cfg.model.context + 1), generator=g)\n"
        "    F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward(); a.phase()\n"
        "step(); step()  # steady state: every arm's optimizer state exists\n"
        "try:\n"
        "    open('/proc/self/clear_refs', 'w').write('5')  # Linux: reset the peak RSS to the current RSS\n"
        "except OSError:\n"
        "    pass\n"
        f"for _ in range({steps}):\n"
        "    step()\n"
        "print(peak_rss_bytes())\n"
    )
    # glibc: tensors of 64 KiB and more get their own mappings, returned to the OS when freed, so
    # the RSS peak follows live memory instead of what the allocator happened to keep cached.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT / "benchmarks",
    )
    return int(out.stdout.strip().splitlines()[-1])


# long: the script's table: each arm's phase timed in turn, then the figures printed side by side as ratios
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["small_transformer"])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--memory-steps", type=int, default=5)
    ap.add_argument(
        "--memory-repeats", type=int, default=3, help="processes per arm for peak memory (median)"
    )
    ap.add_argument("--no-compiled", action="store_true", help="skip the torch.compile peer")
    ap.add_argument(
        "--stream-reps", type=int, default=20, help="repetitions of the bandwidth measurement (best)"
    )
    ap.add_argument(
        "--block-sweep",
        nargs="*",
        type=int,
        default=[],
        metavar="KIB",
        help="also time cotangent/torch with these CPU block sizes (KiB)",
    )
    ap.add_argument(
        "--whole-step-reps",
        type=int,
        default=0,
        metavar="N",
        help="also time N whole training steps per variant (0: skip; benchmarks/whole_step.py)",
    )
    ap.add_argument(
        "--whole-step-models",
        nargs="+",
        metavar="MODEL",
        help="models for the whole steps (default: --configs and nanogpt_small)",
    )
    ap.add_argument("--json", help="write the results as JSON to this path")
    args = ap.parse_args()
    names = [*ARMS, "cotangent/torch", "cotangent/release", "cotangent/backward", "cotangent/torch/backward"]
    names += [] if args.no_compiled else ["compiled"]
    names += [f"cotangent/torch/{kib}KiB" for kib in args.block_sweep]
    kernel = phase_kernel.kernel()
    phase_c = kernel.describe() if kernel else f"not used: {phase_kernel.unavailable_reason()}"

    capability = torch.backends.cpu.get_cpu_capability()
    results: dict[str, object] = {
        "cpu_model": cpu_model(),
        "cpu_capability": capability,
        "cpu_block_bytes": cot.CPU_BLOCK_BYTES,
        "phase_c": phase_c,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "reps": args.reps,
        "configs": {},
    }
    lines = [
        f"{cpu_model()}, torch dispatches {capability}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.reps} interleaved repetitions, "
        f"CPU block {cot.CPU_BLOCK_BYTES // 1024} KiB; phase.c {phase_c}",
        "",
    ]
    for config in args.configs:
        timing = time_variants(config, args.reps, names)
        mem = peak_memory(config, args.memory_steps, args.memory_repeats)
        lim = floor(config, args.stream_reps)
        add_floor_ratios(timing, lim)
        results["configs"][config] = {"timing": timing, "peak_rss_bytes": mem, "floor": lim}  # type: ignore[index]
        lines += [
            f"### {config}",
            "",
            "| Variant | Phase (ms) | Ratio to native | Ratio to floor | Delivery in backward (ms) | Phase + delivery ratio | Peak RSS (MiB) | Memory ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name in names:
            t = timing[name]
            m = mem.get(name)
            lines.append(
                f"| {name} | {t['phase_ms']:.3f} | {t['ratio']:.3f} | {t['floor_ratio']:.2f} | "
                f"{t['delivery_ms']:.3f} | {t['phase_plus_delivery_ratio']:.3f} | "
                + (f"{m / 2**20:.1f} | " if m else "n/a | ")
            )
            lines[-1] += f"{m / mem['native']:.3f} |" if m else "n/a |"
        lines.append(
            f"| floor (bandwidth) | {lim['floor_ms']:.3f} | {lim['floor_ms'] / timing['native']['phase_ms']:.3f} "
            f"| 1.00 | n/a | n/a | n/a | n/a |"
        )
        c = timing["cotangent"]["phase_ms"]
        extra = (
            f"; cotangent / compiled {c / timing['compiled']['phase_ms']:.3f}" if "compiled" in timing else ""
        )
        lines += [
            "",
            f"cotangent / native {timing['cotangent']['ratio']:.3f}{extra}; cotangent / floor "
            f"{timing['cotangent']['floor_ratio']:.2f}",
            "",
        ]
        for name in (n for n in names if "/backward" in n and "norm_work_ms" in timing[n]):
            t = timing[name]
            lines += [
                f"{name}: phase / floor of its {ONE_PASS_ACCESSES} accesses {t['floor_ratio']:.2f} "
                f"(target <= 1.15); norm work in backward {t['norm_work_ms']:.3f} ms; phase + norm work / "
                f"floor of all {PHASE_ACCESSES} accesses {t['with_norm_work_floor_ratio']:.2f} (target <= 1.3); "
                f"phase / native {t['ratio']:.3f}",
                "",
            ]
        lines += [
            f"floor: {lim['bytes'] / 2**20:.1f} MiB moved ({PHASE_ACCESSES} float32 accesses per coordinate) at "
            f"{lim['best_GBps']:.1f} GB/s (best of copy {lim['copy_GBps']:.1f} GB/s and triad "
            f"{lim['triad_GBps']:.1f} GB/s, {args.stream_reps} repetitions, {torch.get_num_threads()} threads)",
            "",
        ]
    if args.whole_step_reps:
        from whole_step import table, whole_step

        models = args.whole_step_models or [*args.configs, "nanogpt_small"]
        steps = {c: whole_step(c, args.whole_step_reps) for c in models}
        results["whole_step"] = steps
        lines += table(steps, args.whole_step_reps)
    print("\n".join(lines))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
