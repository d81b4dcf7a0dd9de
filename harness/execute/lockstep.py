"""A lockstep pair's run, in the one process that trains both arms (``design: lockstep``).

The two arms are built in plan order (the run at ``position`` 0 first), each exactly as a process
of its own builds it (seeded, its own model, arm, batch stream and clocks), and then trained in
alternating blocks of ``block_steps`` steps in ABBA order, the arm whose spec says ``steps_first``
taking the first block; an arm's two consecutive blocks (the BB of ABBA) run as one turn, nothing of its
partner's run between them. Each arm's trajectory is bitwise the one its seed gives in a process of its
own: each arm keeps its own global random state (swapped in and out at block boundaries, outside
the clocks), and nothing else is shared but the corpus bytes, which nothing writes.

Nothing may leak between the arms: their parameters must not share storage, and the arm that waits
must come out of the other's block untouched (the version counters of its parameters, gradients and
optimizer state, which every in-place write bumps); otherwise the pair fails, the arm named. One arm
failing fails the pair: both results say why. Then each arm is evaluated, checkpointed and re-scored
in build order.

Each arm's stall (its blocks' wall less CPU time, from its step times: ``prereg/interference.py``)
is in its record: a thread of one arm that holds the interpreter's lock, or otherwise keeps the
training thread off the processor, while its partner is timed shows there, and the pair is flagged.

What a lockstep pair cannot measure per arm (its memory peak, its whole-process times) is refused at
plan time (:data:`harness.protocol.LOCKSTEP_UNMEASURABLE`); each result's ``memory`` names no
``primary`` peak, and its ``lockstep`` environment says with whom and in which order it ran.
"""

from __future__ import annotations

import time

import torch

from harness.execute.job import Job, LockstepJob
from harness.execute.training import Partial, Prepared, RunFailure, failure, finish, prepare
from prereg.carryover import blocks, turns
from prereg.formats.record import WorkerResult
from prereg.interference import stall_s

__all__ = ["PairFailed", "blocks", "execute_pair"]


class _Slot:
    """One arm's own global random state (CPU and the device's), swapped in for its blocks."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.state = self._get()

    def _get(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.device.type == "cuda":
            return torch.get_rng_state(), torch.cuda.get_rng_state(self.device)
        if self.device.type == "mps":
            return torch.get_rng_state(), torch.mps.get_rng_state()
        return torch.get_rng_state(), None

    def enter(self) -> None:
        cpu, dev = self.state
        torch.set_rng_state(cpu)
        if dev is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(dev, self.device)
        elif dev is not None:
            torch.mps.set_rng_state(dev)

    def leave(self) -> None:
        self.state = self._get()


def _tensors(p: Prepared) -> list[torch.Tensor]:
    """An arm's tensors that training writes: parameters, buffers, gradients, the optimizer's state
    (and the arm's own tensor attributes, such as a packed optimizer's flat buffers)."""
    params = list(dict.fromkeys(p.model.parameters()))
    out = params + list(p.model.buffers()) + [q.grad for q in params if q.grad is not None]
    opt = getattr(p.arm, "optimizer", None)
    for st in getattr(opt, "state", {}).values():
        if isinstance(st, dict):
            out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    for holder in (p.arm, opt):
        out += (
            [v for v in vars(holder).values() if isinstance(v, torch.Tensor)]
            if hasattr(holder, "__dict__")
            else []
        )
    return list({id(t): t for t in out}.values())


#: Integer views of a tensor's bytes by element size, for an exact-enough checksum of its contents.
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _fingerprint(p: Prepared) -> tuple[object, ...]:
    """What the waiting arm must keep while its partner runs: each tensor's identity, version
    counter (every in-place write bumps it) and a checksum of its bytes (which also sees writes
    through ``.data``, which bump no counter)."""
    ts = [
        t
        for t in _tensors(p)
        if t.layout == torch.strided and t.numel() and not t.is_complex() and t.element_size() in _AS_INT
    ]
    sums = [
        t.detach().contiguous().reshape(-1).view(_AS_INT[t.element_size()]).sum(dtype=torch.int64) for t in ts
    ]
    values = torch.stack(sums).tolist() if sums else []
    return tuple((id(t), t._version, v) for t, v in zip(ts, values))


def _settings() -> dict[str, object]:
    """Process-wide torch settings an arm could change for both arms of a pair (there is no getter
    for ``torch.set_flush_denormal``, so that one is not checked)."""
    return {
        "threads": torch.get_num_threads(),
        "inter-op threads": torch.get_num_interop_threads(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "anomaly mode": torch.is_anomaly_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "cuda matmul allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn benchmark": torch.backends.cudnn.benchmark,
        "cudnn deterministic": torch.backends.cudnn.deterministic,
        "mkldnn enabled": torch.backends.mkldnn.enabled,
        "cpu autocast": torch.is_autocast_enabled("cpu"),
    }


def _same_settings(base: dict[str, object], arm: Prepared | Job, when: str) -> None:
    """RunFailure naming the arm when a process-wide setting differs from the pair's start."""
    now = _settings()
    changed = [f"{k} {base[k]} -> {now[k]}" for k in base if now[k] != base[k]]
    if changed:
        spec = arm.run.spec if isinstance(arm, Prepared) else arm.spec
        raise RunFailure(
            f"arm {spec.arm} ({spec.run_id}) changed process-wide torch settings {when} "
            f"({'; '.join(changed)}): in lockstep both arms share them, so it would change its "
            "partner's run too (compare such an arm with design: paired)"
        )


def _disjoint(a: Prepared, b: Prepared) -> None:
    """The two arms' parameters share no storage (else RunFailure naming the second arm)."""
    mine = {q.untyped_storage().data_ptr() for q in a.model.parameters()}
    shared = [n for n, q in b.model.named_parameters() if q.untyped_storage().data_ptr() in mine]
    if shared:
        raise RunFailure(
            f"arm {b.run.spec.arm} ({b.run.spec.run_id}) shares storage with its partner's parameters "
            f"({', '.join(shared[:3])}): a lockstep pair's arms must hold their own tensors"
        )


class PairFailed(RuntimeError):
    """The pair failed; both partials say why (the failing arm its reason, its partner whose)."""


def execute_pair(job: LockstepJob, partials: tuple[Partial, Partial]) -> tuple[WorkerResult, WorkerResult]:
    """Run the pair, each arm noting in its ``partial`` what it measured as it goes. A failure of
    either arm fails both (:class:`PairFailed`): the partials keep what each measured, the failing
    arm's says its reason and its partner's names it."""
    active: list[int | None] = [None]  # the arm being built, trained or evaluated (job order)
    try:
        return _pair(job, partials, active)
    except Exception as e:  # as a worker process reports a failure, for each arm
        noted = failure(e)
        culprit = active[0]
        for i, partial in enumerate(partials):
            partial.note(**noted)
            if culprit is not None and i != culprit:
                name = job.jobs[culprit].spec.run_id
                partial.note(reason=f"its lockstep partner {name} failed: {noted['reason']}")
        raise PairFailed(noted["reason"]) from e


def _pair(
    job: LockstepJob, partials: tuple[Partial, Partial], active: list[int | None]
) -> tuple[WorkerResult, WorkerResult]:
    t_start = time.perf_counter()
    if job.jobs[0].spec.threads:
        torch.set_num_threads(job.jobs[0].spec.threads)
    base = _settings()  # what both arms run with; neither may change it
    built, slots = _build(job, partials, active, base)
    spec = job.jobs[0].spec
    assert spec.block_steps is not None
    _train(job, built, slots, active, base)
    _evaluate(built, partials, slots, active, base)
    total = time.perf_counter() - t_start  # the pair's: one process ran both arms
    for p, partial in zip(built, partials):
        t = (
            p.trainer
        )  # its blocks' wall less CPU time: a partner that stalls it shows (prereg/interference.py)
        stall = stall_s(t.wall_us, t.cpu_us, spec.block_steps, t.warmup)
        partial.note(
            timings={
                **partial.result.timings,
                "total_s": total,
                "total_s_of": "the lockstep pair's process",
                "stall_s": stall,
            }
        )
    return partials[0].result, partials[1].result


def _build(
    job: LockstepJob, partials: tuple[Partial, Partial], active: list[int | None], base: dict[str, object]
) -> tuple[list[Prepared], list[_Slot]]:
    """Build both arms in job order, each checked against the pair's settings and its partner's
    tensors; each arm's ``env`` notes its place in the pair."""
    built: list[Prepared] = []
    slots: list[_Slot] = []
    for i, (j, partial) in enumerate(zip(job.jobs, partials)):
        active[0] = i
        before = _fingerprint(built[0]) if built else None
        p = prepare(j, partial)
        _same_settings(base, j, "while it was built")
        if built:
            _disjoint(built[0], p)
            _untouched(built[0], before, p, "while it was built")
        built.append(p)
        slots.append(_Slot(p.run.device))  # the state its build left, as in a process of its own
        partial.note(
            env={
                **(partial.result.env or {}),
                "lockstep": {
                    "partner": j.spec.partner,
                    "block_steps": j.spec.block_steps,
                    "built": "first" if j.spec.position == 0 else "second",
                    "steps": "first" if j.spec.steps_first else "second",
                    # an arm's consecutive blocks run as one turn, its partner checked around the
                    # turn: a step after its own has nothing of the partner's between (carryover.turns)
                    "turns": "joined",
                },
            }
        )
    return built, slots


def _train(
    job: LockstepJob,
    built: list[Prepared],
    slots: list[_Slot],
    active: list[int | None],
    base: dict[str, object],
) -> None:
    """The arms' blocks of steps in turn, each block checked against the pair's settings and its
    partner's tensors."""
    first = 0 if job.jobs[0].spec.steps_first else 1
    order = (first, 1 - first)  # arm 0 of blocks() is the one that steps first
    spec = job.jobs[0].spec
    assert spec.block_steps is not None
    for k, n in turns(spec.steps, spec.block_steps):  # an arm's consecutive blocks are one turn
        i = active[0] = order[k]
        me, other = built[i], built[1 - i]
        idle = _fingerprint(other)
        slots[i].enter()
        for _ in range(n):
            me.trainer.step()
        slots[i].leave()
        _same_settings(base, me, "during its block")
        _untouched(other, idle, me, "during its block")


def _evaluate(
    built: list[Prepared],
    partials: tuple[Partial, Partial],
    slots: list[_Slot],
    active: list[int | None],
    base: dict[str, object],
) -> None:
    """Evaluate each arm in its slot, checked as its blocks were; its ``memory`` notes the peaks are
    the pair's."""
    for i, (p, partial, slot) in enumerate(zip(built, partials, slots)):
        active[0] = i
        idle = _fingerprint(built[1 - i])
        slot.enter()
        r = finish(p, partial)
        slot.leave()
        _same_settings(base, p, "while it was evaluated")
        _untouched(built[1 - i], idle, p, "while it was evaluated")
        memory = {k: v for k, v in (r.memory or {}).items() if k != "primary"}
        memory["shared"] = "both arms of a lockstep pair in one process: the peaks are the pair's"
        partial.note(memory=memory)


def _untouched(other: Prepared, before: tuple[object, ...] | None, me: Prepared, when: str) -> None:
    """RunFailure naming ``me`` when ``other``'s tensors changed since ``before`` (its fingerprint)."""
    if before is not None and _fingerprint(other) != before:
        raise RunFailure(
            f"arm {me.run.spec.arm} ({me.run.spec.run_id}) wrote its partner's tensors {when}: a lockstep "
            "pair's arms must not touch each other's parameters, buffers, gradients or optimizer state"
        )
