"""One run's work, in the process that calls it: seed, build model, data and arm; compile and warm
up if asked (timed, outside the training clock); train the fixed number of steps with a device
synchronisation each step; validate on the fixed subset every ``val_every`` steps with the training
clock paused; evaluate full validation and test BPB; write a safetensors checkpoint, reload it and
re-score the test split. What it measures goes into a :class:`Partial` as it goes, so a failure
(:func:`failure`) keeps everything up to it.

:mod:`harness.execute.worker` runs it in a fresh process and hands the result to its parent;
:mod:`harness.execute.inprocess` (tests) in the runner's own.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from harness.codepath import recorded_environment
from harness.execute.job import Job
from harness.freeze import code_sha256
from prereg.formats.record import WorkerResult, sha256_bytes

if TYPE_CHECKING:
    from harness.arms import GradientPhase
    from harness.config import Config
    from harness.data import Corpus
    from harness.data.batches import BatchStream
    from harness.devices import MemoryMeter
    from harness.execute.plant import Plant
    from prereg.formats.record import RunSpec

__all__ = [
    "CPU_CLOCK",
    "Partial",
    "Prepared",
    "RunFailure",
    "Trainer",
    "execute",
    "failure",
    "finish",
    "prepare",
]


class RunFailure(RuntimeError):
    """The run itself failed (non-finite loss, out of memory, ...): recorded, not dropped."""


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def _phase_so_sha256() -> str | None:
    from cotangent.kernel import loaded_sha256

    return loaded_sha256()


class Partial:
    """The worker's result so far: each step adds what it measured (:meth:`note`), and training
    appends to the loss and validation curves (:attr:`curve`, :attr:`val_curve`, ``None`` until
    it starts), so a failure reports everything up to it."""

    def __init__(self) -> None:
        self._noted = WorkerResult(status="running")
        self.curve: list[list[float]] | None = None
        self.val_curve: list[list[float]] | None = None

    def note(self, **measured: Any) -> None:
        """Add fields of :class:`~prereg.formats.record.WorkerResult` (a new frozen result each time)."""
        self._noted = replace(self._noted, **measured)

    @property
    def result(self) -> WorkerResult:
        """What was measured so far, frozen: the curves (once training started) as copies of their points."""
        if self.curve is None or self.val_curve is None:
            return self._noted
        return replace(
            self._noted, curve=tuple(map(tuple, self.curve)), val_curve=tuple(map(tuple, self.val_curve))
        )


@dataclass(frozen=True)
class _Run:
    """What each part of a run reads: the job's spec, its configuration, its corpus and the device."""

    spec: RunSpec
    cfg: Config
    corpus: Corpus
    device: torch.device


@dataclass
class Prepared:
    """A run built and ready to train: what :func:`execute` (or a lockstep pair) steps and evaluates."""

    run: _Run
    model: torch.nn.Module
    forward: Callable[..., torch.Tensor]
    arm: GradientPhase
    trainer: Trainer
    meter: MemoryMeter
    checkpoint: Path
    t_start: float
    t_setup: float
    compile_s: float


def prepare(job: Job, partial: Partial, t_start: float | None = None) -> Prepared:
    """Seed, build the model, its arm and batch stream, compile and warm up if asked (outside the
    training clock), noting what it measured in ``partial``."""
    from harness import devices
    from harness.config import load_config
    from harness.data import load_corpus
    from harness.data.batches import BatchStream

    t_start = time.perf_counter() if t_start is None else t_start
    spec = job.spec
    if spec.threads:
        torch.set_num_threads(spec.threads)
    device = devices.resolve(spec.device)
    cfg = load_config(job.config_path)
    if cfg.sha256 != spec.config_sha256:
        raise RunFailure(f"configuration {cfg.path} changed since the plan (sha256 {cfg.sha256})")
    corpus = load_corpus(job.corpus or spec.corpus, job.data_dir)
    run = _Run(spec, cfg, corpus, device)
    partial.note(env=_environment(run))
    model, arm = _model_and_arm(run, partial)
    batches = BatchStream(corpus.train, cfg.model.context, cfg.train.batch_size, spec.seed)
    meter = devices.MemoryMeter(device)
    t_setup = time.perf_counter()
    forward, compile_s = _compiled(run, model, arm, t_setup) if spec.compile else (model, 0.0)
    partial.curve, partial.val_curve = [], []  # filled by the trainer as it goes
    trainer = Trainer(run, model, forward, arm, batches, meter, partial.curve, partial.val_curve)
    return Prepared(
        run, model, forward, arm, trainer, meter, Path(job.checkpoint_path), t_start, t_setup, compile_s
    )


def finish(p: Prepared, partial: Partial, total_s: float | None = None) -> WorkerResult:
    """Evaluate, checkpoint and re-score a trained run, noting its timings (``total_s``: the run's
    own, from its start, unless given) in ``partial``; the result."""
    t = p.trainer
    measured, seconds = _evaluate(p.run, p.model, p.checkpoint, p.meter)
    partial.note(
        **measured,
        step_times={"wall_us": list(t.wall_us), "cpu_us": list(t.cpu_us)},
        timings={
            "setup_s": p.t_setup - p.t_start,
            "compile_s": p.compile_s,
            "training_s": t.clock,
            "training_cpu_s": t.cpu,
            "training_cpu_clock": CPU_CLOCK[t.cpu_clock],
            "time_to_target_s": t.time_to_target,
            "validation_s": t.validation_s,
            **({"warmup_s": t.warmup_s, "warmup_cpu_s": t.warmup_cpu_s} if t.warmup else {}),
            **({"planted_s": t.planted_s, "planted_cpu_s": t.planted_cpu_s} if t.plant is not None else {}),
            **seconds,
            "total_s": time.perf_counter() - p.t_start if total_s is None else total_s,
        },
    )
    rescored, test_bpb = measured["rescored_test_bpb"], measured["test_bpb"]
    if rescored != test_bpb:
        raise RunFailure(
            f"re-scored test BPB {rescored!r} differs from the in-run {test_bpb!r}: the checkpoint "
            "round trip is not exact"
        )
    partial.note(status="ok", reason=None)
    return partial.result


def execute(job: Job, partial: Partial) -> WorkerResult:
    """Run the job, noting in ``partial`` what it measured as it goes (so a failure keeps it)."""
    p = prepare(job, partial)
    while not p.trainer.done:
        p.trainer.step()
    return finish(p, partial)


def failure(e: BaseException) -> dict[str, str]:
    """A failed run's status, reason and traceback (fields of a :class:`~prereg.formats.record.WorkerResult`)."""
    oom = "out of memory" in str(e).lower()
    return {
        "status": "failed",
        "reason": f"{'out of memory' if oom else type(e).__name__}: {e}",
        "traceback": traceback.format_exc()[-4000:],
    }


def _environment(run: _Run) -> dict[str, object]:
    """Where and with what it ran: host, OS, Python, torch, device, threads, code, configuration, corpus."""
    from harness import devices

    device = run.device
    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": devices.device_name(device),
        # the instruction set torch dispatches its CPU kernels for (ATEN_CPU_CAPABILITY may lower it)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "harness_sha256": code_sha256()["harness"],
        "numpy": _version("numpy"),
        "isolated": bool(sys.flags.isolated),  # python -I: no PYTHONPATH, user site or current directory
        "config_sha256": run.cfg.sha256,
        "corpus_sha256": run.corpus.sha256(),
        # the machine's load (1, 5 and 15 minutes) as the run started: quiet or loaded, as it ran
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        # a variable that chooses the method's path where a caller leaves it open (COTANGENT_MODE), if set
        **({"code_path_env": seen} if (seen := recorded_environment()) else {}),
    }


def _model_and_arm(run: _Run, partial: Partial) -> tuple[torch.nn.Module, GradientPhase]:
    """The seeded model and its arm (which must not touch the global random state), noted in ``partial``."""
    from cotangent import exact_paths
    from harness.arms import ArmContext, resolve
    from harness.models import build_model, count_parameters

    spec = run.spec
    torch.manual_seed(spec.seed)
    model = build_model(run.cfg.model, spec.seed).to(run.device)
    partial.note(parameters=count_parameters(model))
    params = list(dict.fromkeys(model.parameters()))
    rng = torch.get_rng_state()
    arm = resolve(spec.arm)(ArmContext(model, params, run.cfg.train, run.device))
    if not torch.equal(rng, torch.get_rng_state()):
        raise RunFailure(
            f"arm {spec.arm} drew from the global random state while it was built; an arm must not "
            "touch the seed (harness/arms.py)"
        )
    paths = exact_paths(run.device.type)
    partial.note(
        method_paths={
            "bucketed_norm_dtypes": sorted(str(d).replace("torch.", "") for d in paths.bucketed_norm_dtypes),
            "update": paths.update,
            "origin": paths.origin,
            # the one-pass phase's CPU blocks (speed, not bits); None for arms without PackedAdamW
            "cpu_block_bytes": getattr(arm.optimizer, "block_bytes", None),
            # what runs the one-pass phase: phase.c (with the arithmetic forms its self-check chose)
            # or torch's kernels, and why; None for arms without PackedAdamW
            "phase_kernel": arm.optimizer.phase_kernel() if hasattr(arm.optimizer, "phase_kernel") else None,
            "phase_so_sha256": _phase_so_sha256(),  # the phase.c library this process loaded, verified (or None)
        }
    )
    return model, arm


def _compiled(
    run: _Run, model: torch.nn.Module, arm: GradientPhase, t_setup: float
) -> tuple[Callable[..., torch.Tensor], float]:
    """``torch.compile(model)`` warmed up on validation bytes (the training batch stream untouched; gradients
    discarded, weights and optimizer state unchanged), and the seconds since ``t_setup``."""
    from harness import devices
    from harness.data.batches import BatchStream

    forward = torch.compile(model)
    cfg, device = run.cfg, run.device
    warm = BatchStream(run.corpus.valid, cfg.model.context, cfg.train.batch_size, run.spec.seed + 1)
    for _ in range(2):
        x, y = warm.next()
        loss = F.cross_entropy(forward(x.to(device)).float().flatten(0, 1), y.to(device).flatten())
        loss.backward()
        arm.zero_grad()
    devices.synchronize(device)
    return forward, time.perf_counter() - t_setup


#: What the training CPU clock measures: one thread's CPU time when the run has one intra-op
#: thread (all its work is on the timing thread), the whole process's otherwise.
CPU_CLOCK = {
    "thread": "time.thread_time: the training thread's CPU time (one intra-op thread)",
    "process": "time.process_time: the process's CPU time, all its threads (more than one intra-op thread)",
}


class Trainer:
    """One run's training, a step at a time (:meth:`step`): each step on the training clocks (the
    device synchronised before and after; validation every ``val_every`` steps with the clocks
    paused), filling ``curve`` (step, loss, clock) and ``val_curve`` (step, bpb, clock).

    Two clocks: :attr:`clock`, wall time (``time.perf_counter``), and :attr:`cpu`, CPU time
    (:data:`CPU_CLOCK`, :attr:`cpu_clock` saying which)."""

    def __init__(
        self,
        run: _Run,
        model: torch.nn.Module,
        forward: Callable[..., torch.Tensor],
        arm: GradientPhase,
        batches: BatchStream,
        meter: MemoryMeter,
        curve: list[list[float]],
        val_curve: list[list[float]],
    ) -> None:
        self.run, self.model, self.forward, self.arm = run, model, forward, arm
        self.batches, self.meter, self.curve, self.val_curve = batches, meter, curve, val_curve
        self.clock = 0.0
        self.cpu = 0.0
        self.cpu_clock = "thread" if torch.get_num_threads() == 1 else "process"
        self._cpu_now = time.thread_time if self.cpu_clock == "thread" else time.process_time
        self.validation_s = 0.0
        self.time_to_target: float | None = None
        self.steps_done = 0
        # the first ``warmup_steps`` steps: trained and timed, but on clocks of their own
        self.warmup = run.spec.warmup_steps or 0
        self.warmup_s = self.warmup_cpu_s = 0.0
        self.plant = None if run.spec.planted is None else _plant(run)
        self.planted_s = self.planted_cpu_s = 0.0
        # each step's own wall and CPU time, microseconds (warm-up included): the carry-over analysis
        self.wall_us: list[int] = []
        self.cpu_us: list[int] = []

    @property
    def done(self) -> bool:
        return self.steps_done >= self.run.spec.steps

    def step(self) -> None:
        """One training step (and the validation due after it)."""
        from harness import devices
        from harness.data.batches import bits_per_byte

        spec, cfg, corpus, device = self.run.spec, self.run.cfg, self.run.corpus, self.run.device
        step, steps, arm = self.steps_done, spec.steps, self.arm
        arm.set_lr(cfg.lr_at(step, steps))
        x, y = self.batches.next()
        x, y = x.to(device), y.to(device)
        devices.synchronize(device)
        t0, c0 = time.perf_counter(), self._cpu_now()
        logits = self.forward(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        if step == 0:
            rng = torch.get_rng_state()
        arm.phase()
        plant = self.plant if self.plant is not None and self.plant.runs_in(step) else None
        if plant is not None:
            plant()
        devices.synchronize(device)
        wall, cpu = time.perf_counter() - t0, self._cpu_now() - c0
        self.wall_us.append(round(wall * 1e6))
        self.cpu_us.append(round(cpu * 1e6))
        if step < self.warmup:
            self.warmup_s += wall
            self.warmup_cpu_s += cpu
        else:
            self.clock += wall
            self.cpu += cpu
            if plant is not None:
                self.planted_s += plant.wall_s
                self.planted_cpu_s += plant.cpu_s
        if step == 0 and not torch.equal(rng, torch.get_rng_state()):
            raise RunFailure(
                f"arm {spec.arm} drew from the global random state in its gradient phase; an arm "
                "must not touch the seed (harness/arms.py)"
            )
        self.steps_done += 1
        self.meter.sample()
        value = float(loss.detach())
        self.curve.append([step + 1, value, self.clock])
        if not math.isfinite(value):
            raise RunFailure(f"non-finite training loss {value} at step {step + 1}")
        if (step + 1) % spec.val_every == 0 or step + 1 == steps:
            v0 = time.perf_counter()
            sub = cfg.eval.val_subset_windows
            bpb, _ = bits_per_byte(
                self.model, corpus.valid, cfg.model.context, cfg.eval.batch_size, device, sub
            )
            self.validation_s += time.perf_counter() - v0
            self.val_curve.append([step + 1, bpb, self.clock])
            if self.time_to_target is None and bpb <= spec.val_target_bpb:
                self.time_to_target = self.clock


def _plant(run: _Run) -> Plant:
    from harness.execute.plant import Plant

    assert run.spec.planted is not None
    return Plant(run.spec.planted, run.device)


def _evaluate(
    run: _Run, model: torch.nn.Module, ckpt: Path, meter: MemoryMeter
) -> tuple[dict[str, Any], dict[str, float]]:
    """Full BPB, the checkpoint re-scored by a fresh model, memory peaks (fields of a
    :class:`~prereg.formats.record.WorkerResult`); and the seconds each part took."""
    from harness.data.batches import bits_per_byte
    from harness.models import build_model

    spec, cfg, corpus, device = run.spec, run.cfg, run.corpus, run.device
    e0 = time.perf_counter()
    val_bpb, val_bytes = bits_per_byte(model, corpus.valid, cfg.model.context, cfg.eval.batch_size, device)
    test_bpb, test_bytes = bits_per_byte(model, corpus.test, cfg.model.context, cfg.eval.batch_size, device)
    evaluation_s = time.perf_counter() - e0
    c0 = time.perf_counter()
    from safetensors.torch import load_file, save_file

    ckpt.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    tmp = ckpt.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"run_id": spec.run_id, "config": cfg.name})
    os.replace(tmp, ckpt)
    ckpt_sha = sha256_bytes(ckpt.read_bytes())
    checkpoint_s = time.perf_counter() - c0
    r0 = time.perf_counter()
    fresh = build_model(cfg.model, spec.seed)
    fresh.load_state_dict(load_file(str(ckpt)))
    fresh.to(device)
    rescored, _ = bits_per_byte(fresh, corpus.test, cfg.model.context, cfg.eval.batch_size, device)
    rescore_s = time.perf_counter() - r0
    measured: dict[str, Any] = {
        "val_bpb": val_bpb,
        "test_bpb": test_bpb,
        "rescored_test_bpb": rescored,
        "rescore_identical": rescored == test_bpb,
        "eval_bytes": {"valid": val_bytes, "test": test_bytes},
        "memory": meter.peaks(),
        "checkpoint": {"path": str(ckpt), "sha256": ckpt_sha, "bytes": ckpt.stat().st_size},
    }
    return measured, {"evaluation_s": evaluation_s, "checkpoint_s": checkpoint_s, "rescore_s": rescore_s}
