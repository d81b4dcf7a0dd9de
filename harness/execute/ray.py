"""The Ray executor: units on the devices of a Ray cluster, with no shared filesystem.

* Placement: each unit (a pair or a factorial block) is one Ray task that holds one whole timing
  device for its duration, through a custom resource each node advertises per device
  (``harness-cpu``, ``harness-cuda``, ``harness-mps``; :func:`node_command` starts a node with the
  right ones). A unit's arms run back to back on that one device, each in a fresh worker process;
  no two timed runs ever share a device. A unit is never split: one that must run again (a node
  died) runs whole, as new attempts, on whichever eligible node takes it; the rest of a unit whose
  driver was stopped runs on the node that ran its first part.
* Shipping: the driver sends the study's tree (configurations, protocols, verified paths) as the
  task's working directory and the running ``harness``/``analysis`` packages as modules; a corpus
  other than the embedded one travels as its three verified splits through the object store (a
  local corpus file inside the tree is left out of the working directory). Each node checks,
  before running anything, that its copy of the code hashes as the driver's
  (:func:`harness.freeze.code_sha256`), that the corpus it will read has the driver's sha256
  (the shipped splits are written under the node's folder and pinned to them), and, asking a
  worker process (:func:`harness.execute.worker.probe`), its PyTorch version (the protocol's) and its
  device; it refuses otherwise.
* Start-up: the node's Ray worker process serves unit after unit (``max_calls=0``) and keeps the
  protocol's launcher, so a fork server imports torch once per node and device, not per unit;
  its start-up is outside every run's time. The driver blocks on the nodes' messages (no polling)
  and collects a unit as soon as its task says it ended.
* Results: each run's outcome comes back through a Ray queue as soon as it ends; only the driver
  writes records, in ledger order. Checkpoints and logs stay on the node
  (``$HARNESS_NODE_DIR``, default ``~/cotangent-harness-node``); the record names the node and holds
  the checkpoint's sha256.
* Attempts: a node announces each run before its worker starts and waits until the driver has
  appended the run's started entry to the ledger (a gate actor on the driver's node opens it), so
  every attempt that ever started is in the chain.
* The failure rule (:mod:`prereg.failstop`): the driver applies it after each failed record, as the
  local executor does, and refuses at the gate every run announced after it stopped the study,
  writing nothing: a paired unit's second run, whose partner failed early, does not start (no
  started entry, no record, as locally), nor do the unit's further runs; nor does a unit shipped
  before the stop that has not started. A lockstep pair's one process runs as before.
* Faults: a node or worker that dies mid-unit leaves the runs it started without an outcome; they
  are recorded ``interrupted`` with the node named and the unit runs again, whole, as a new unit
  attempt (the earlier one's records are superseded). A driver killed and started again finds the
  started entries without records and resumes as locally.
* Tests only: ``HARNESS_TEST_HOLD`` names a file; when it exists and says ``during:K`` (the unit's
  K-th run is under way) or ``between:K`` (after its K-th run's outcome was sent), the node's first
  unit writes ``<file>.held`` and stops there, so a test kills the node at a fixed point.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import cast

from filelock import FileLock

from harness.execute.base import Claim, RunnerPort
from harness.execute.grouping import process_groups, process_job
from harness.execute.job import JobFile
from harness.execute.ray_node import (
    RESOURCE,
    Expect,
    Gate,
    GateHandle,
    MessageQueue,
    NodeInfo,
    driver_tree,
    node_command,
    run_unit,
)
from harness.execute.state import RunState
from harness.ledger import describe
from harness.names import SPLITS
from harness.packages import package_dirs
from harness.plan import RunSpec, units
from prereg.errors import RefusedError

__all__ = ["EXCLUDES", "RayExecutor", "node_command"]

EXCLUDES = ["runs/", "records/", ".git/", "__pycache__/", "*.safetensors", ".whl/", ".gl/"]


def _corpus_paths(runner: RunnerPort) -> list[str]:
    """A local corpus's files inside the tree (``/``-rooted, as Ray's ``excludes`` name them): they
    travel once, through the object store, not with the working directory."""
    corpus, root = runner.context.proto.corpus, runner.context.root
    if isinstance(corpus, str):
        return []
    return [
        "/" + (root / f.path).resolve().relative_to(root.resolve()).as_posix()
        for f in corpus.files.values()
        if (root / f.path).resolve().is_relative_to(root.resolve())
    ]


#: The units running on the cluster: by task (its Ray object ref), the unit, its claim's lock, its
#: expected device seconds and the node each of its started runs is on.
_Inflight = dict[object, tuple[list[RunSpec], FileLock, float, dict[str, NodeInfo]]]


class RayExecutor:
    """Place units on a Ray cluster at ``address`` (``auto`` or host:port)."""

    name = "ray"

    def __init__(self, address: str) -> None:
        self.address = address
        self.gate: GateHandle | None = None
        self.unit_attempts: dict[tuple[str, int], int] = {}

    def _init(self, runner: RunnerPort) -> tuple[ModuleType, MessageQueue]:
        try:
            import ray
            from ray.util.queue import Queue
        except ImportError as e:
            raise RefusedError("--ray needs Ray: python -m pip install -e '.[ray]'") from e
        # a local corpus inside the tree travels once, through the object store, not with the tree
        root = runner.context.root
        shipped = _corpus_paths(runner)
        runtime_env = {
            "working_dir": str(root),
            "excludes": EXCLUDES + shipped,
            "py_modules": [str(p) for p in package_dirs()],
        }
        ray.init(
            address=self.address,
            runtime_env=runtime_env,
            namespace="cotangent-harness",
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # the queue lives on the driver's own node, so a node that dies cannot take the results with it
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        gate = ray.remote(Gate).options(num_cpus=0, scheduling_strategy=here).remote()
        self.gate = cast(GateHandle, gate)  # an actor handle: Gate's methods, called through .remote
        return ray, Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})

    def execute(self, runner: RunnerPort) -> None:
        ray, queue = self._init(runner)
        proto = runner.context.proto
        device = proto.spec.device if proto.spec.device != "auto" else "cpu"
        resource = RESOURCE.format(device=device)
        capacity = int(ray.cluster_resources().get(resource, 0))
        if capacity < 1:
            raise RefusedError(
                f"no node of the Ray cluster at {self.address} advertises {resource}; start nodes with: "
                f"harness node --device {device} --address ADDRESS"
            )
        expect, corpus_ref = self._expect(runner, ray, device)
        gpus = {"num_gpus": 1} if device == "cuda" else {}  # Ray sets CUDA_VISIBLE_DEVICES to the unit's GPU
        base_options = {"num_cpus": 0, "resources": {resource: 1}, "max_retries": 0, **gpus}
        task = ray.remote(max_calls=0)(
            run_unit
        )  # the node worker (and its fork server) serves unit after unit
        waiting = list(units(runner.context.runs))
        inflight: _Inflight = {}
        by_id = {s.run_id: s for s in runner.context.runs}
        ended = 0  # units whose task said it ended and that are not collected yet
        placement: dict[str, object] = {}  # where _widen pins the unit being claimed
        widen = partial(self._widen, runner, ray, placement)

        def launch(jobs: list[JobFile]) -> object:
            """The unit's task, on the node _widen pinned it to (if any)."""
            return task.options(**base_options, **placement).remote(
                jobs, expect, corpus_ref, queue, self.gate
            )

        try:
            while (waiting and not runner.halted) or inflight:
                self._fill(runner, waiting, inflight, capacity, widen, launch)
                if inflight:
                    ended = self._gather(runner, ray, queue, inflight, by_id, waiting, ended)
        finally:
            for ref, (_unit, lock, _, _) in inflight.items():
                ray.cancel(ref, force=True)
                lock.release()
            ray.shutdown()

    def _fill(
        self,
        runner: RunnerPort,
        waiting: list[list[RunSpec]],
        inflight: _Inflight,
        capacity: int,
        widen: Callable[[list[RunSpec], list[RunSpec], dict[str, RunState]], list[RunSpec]],
        launch: Callable[[list[JobFile]], object],
    ) -> None:
        """Claim and launch units while the cluster has a free slot, unless a look's pairs are still
        running (the look is taken before the next unit)."""
        while waiting and not runner.halted and len(inflight) < capacity:
            if inflight and runner.look_waits(waiting[0]):
                break  # a look's pairs are still running: take the look before this unit
            claim = runner.claim(waiting.pop(0), sum(r[2] for r in inflight.values()), widen)
            if claim is None:
                continue
            ref = launch(self._jobs(runner, claim))
            inflight[ref] = (claim.unit, claim.lock, claim.expected_s, {})

    def _jobs(self, runner: RunnerPort, claim: Claim) -> list[JobFile]:
        """A claimed unit's jobs, one per worker process: a run, or a lockstep pair
        (:mod:`harness.execute.grouping`); each attempt's unit attempt noted."""
        jobs = []
        for group in process_groups(claim.todo):
            each = [runner.job(s, runner.next_attempt(s)) for s in group]
            for j in each:
                self.unit_attempts[(j.spec.run_id, j.attempt)] = claim.unit_attempt
            jobs.append(process_job(each))
        return jobs

    def _gather(
        self,
        runner: RunnerPort,
        ray: ModuleType,
        queue: MessageQueue,
        inflight: _Inflight,
        by_id: dict[str, RunSpec],
        waiting: list[list[RunSpec]],
        ended: int,
    ) -> int:
        """Block on the nodes' messages (no polling; a unit's "end" says its task returns now), then
        collect every task that returned; the units that said they ended and are not collected yet."""
        ended += self._drain(runner, queue, inflight, by_id, wait=0.0 if ended else 0.5)
        if ended:
            ray.wait(list(inflight), num_returns=1, timeout=5.0)
        ready, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=0)
        for ref in ready:
            ended = max(0, ended + self._collect(runner, ray, queue, inflight, by_id, ref, waiting) - 1)
        return ended

    @staticmethod
    def _expect(runner: RunnerPort, ray: ModuleType, device: str) -> tuple[Expect, object]:
        """What every node must match (code, PyTorch, corpus, device, launcher, threads, the verified
        phase.c build), and the corpus's splits put in the object store (None for the embedded corpus,
        which every node has)."""
        from harness.freeze import code_sha256

        proto = runner.context.proto
        corpus = runner.context.corpus  # verified by the runner before any run
        expect: Expect = {
            "code": code_sha256(),
            "torch": proto.spec.torch_version,
            "protocol": proto.spec.id,
            "corpus": corpus.name,
            "device": device,
            "launcher": proto.spec.launcher,
            "corpus_sha256": corpus.sha256(),
            "threads": proto.spec.threads,
            "phase_sha256": (runner.context.env or {}).get("COTANGENT_PHASE_SHA256"),
            # the shipped working directory every node must hold (ray_node.shipped_problems)
            "tree": driver_tree(runner.context.root, EXCLUDES + _corpus_paths(runner)),
        }
        shipped = {s: corpus.split(s) for s in SPLITS} if corpus.name != "pydoc-topics" else None
        return expect, (ray.put(shipped) if shipped is not None else None)

    def _widen(
        self,
        runner: RunnerPort,
        ray: ModuleType,
        placement: dict[str, object],
        unit: list[RunSpec],
        todo: list[RunSpec],
        states: dict[str, RunState],
    ) -> list[RunSpec]:
        """Never split a pair across devices: the rest of a unit on the node that ran its first
        part while that node lives (a restarted driver), else the whole unit again."""
        placement.clear()
        if len(todo) < len(unit) and any(states.get(s.run_id, RunState()).last == "ok" for s in unit):
            node = self._node_of(runner, unit)
            if node is None or node not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}:
                return list(unit)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            placement["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return todo

    def _collect(
        self,
        runner: RunnerPort,
        ray: ModuleType,
        queue: MessageQueue,
        inflight: _Inflight,
        by_id: dict[str, RunSpec],
        ref: object,
        waiting: list[list[RunSpec]],
    ) -> int:
        """Collect a unit's finished task (its last messages first) and release its claim; a unit lost
        with its node or its task's process goes back to the front of ``waiting``, to run again whole.
        Returns how many units' tasks said they ended among the messages drained."""
        unit, lock, _, started = inflight.pop(ref)
        ended = self._drain(runner, queue, {ref: (unit, lock, 0.0, started)}, by_id)
        try:
            label = ray.get(ref)
            runner.context.echo(
                f"  unit {unit[0].unit} done on {label}; {describe(runner.context.ledger.head())}"
            )
        except RefusedError:
            lock.release()
            raise
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, RefusedError):
                lock.release()
                raise e.cause from e
            self._lost(runner, unit, started, e)
            waiting.insert(0, unit)
        except ray.exceptions.RayError as e:  # the node or the task's process died
            self._lost(runner, unit, started, e)
            waiting.insert(0, unit)
        lock.release()
        return ended

    @staticmethod
    def _node_of(runner: RunnerPort, unit: list[RunSpec]) -> str | None:
        """The Ray node that ran the unit's ok runs (their latest attempts)."""
        ids = {s.run_id for s in unit}
        recs = [r for r in runner.context.ledger.records() if r.spec.run_id in ids]
        latest = max([1, *(r.unit_attempt for r in recs)])  # the unit attempt being resumed
        nodes = {r.node["id"] for r in recs if r.unit_attempt == latest and r.status == "ok" and r.node}
        return nodes.pop() if len(nodes) == 1 else None

    def _drain(
        self,
        runner: RunnerPort,
        queue: MessageQueue,
        inflight: _Inflight,
        by_id: dict[str, RunSpec],
        wait: float = 0.0,
    ) -> int:
        """Apply every message the nodes sent (markers for started runs, records for ended ones),
        waiting up to ``wait`` seconds for the first; returns how many units' tasks said they ended."""
        from ray.util.queue import Empty

        started_of: dict[str, dict[str, NodeInfo]] = {}
        for _ref, (unit, _lock, _e, started) in inflight.items():
            for s in unit:
                started_of[s.run_id] = started
        ended, block = 0, wait > 0
        while True:
            try:
                msg = queue.get(block=block, timeout=wait if block else None)
            except Empty:
                return ended
            block = False
            if msg[0] == "end":
                ended += 1
            elif msg[0] == "start":
                self._start(runner, by_id[msg[1]], msg[2], msg[3], started_of)
            else:
                _, rid, attempt, node, out = msg
                rec = runner.finished(by_id[rid], attempt, out, node)
                runner.context.echo(
                    f"  {rec.status} ({runner.context.progress.executed_s[-1]:.1f} s) on {node['host']}/{node['id'][:8]}"
                )
                if rec.status != "ok":
                    runner.context.echo(f"    reason: {rec.reason or '(none recorded)'} (logs on that node)")
                for started in started_of.values():
                    started.pop(rid, None)
                if rec.status == "failed":
                    runner.failure_stops()  # says so once, where it stops the study

    def _start(
        self,
        runner: RunnerPort,
        spec: RunSpec,
        attempt: int,
        node: NodeInfo,
        started_of: dict[str, dict[str, NodeInfo]],
    ) -> None:
        """A node is about to start a run: append its started entry and open the run's gate; or,
        once the failure rule (:mod:`prereg.failstop`) stops the study, refuse it with nothing
        written, as the local executor never starts it (a lockstep pair's process, which runs both
        arms at once, is never refused: its two runs are announced together)."""
        key, gate = f"{spec.run_id}.a{attempt}", self.gate
        assert gate is not None, "the gate is made by _init, before any unit runs"
        if not spec.lockstep and runner.failure_stops():
            gate.open.remote(key, False)  # the node starts neither this run nor its unit's further ones
            return
        where = f"{node['host']}/{node['id'][:8]}"
        runner.started(spec, attempt, where, unit_attempt=self.unit_attempts.get((spec.run_id, attempt), 1))
        gate.open.remote(key)
        runner.announce(spec, attempt, f" on {where}")
        if spec.run_id in started_of:
            started_of[spec.run_id][spec.run_id] = node

    @staticmethod
    def _lost(runner: RunnerPort, unit: list[RunSpec], started: dict[str, NodeInfo], err: Exception) -> None:
        where = ", ".join(sorted({f"{n['host']}/{n['id'][:8]}" for n in started.values()})) or "its node"
        runner.context.echo(
            f"  unit {unit[0].unit} lost on {where} ({type(err).__name__}); it runs again, whole"
        )
        for spec in unit:
            runner.next_attempt(spec)  # records its interrupted attempts
        time.sleep(0.5)
