"""The typed protocol: a protocol file's keys as :func:`prereg.protocol.read.protocol_of` reads them,
every key typed and every left-out key at its default (:mod:`prereg.protocol.schema` declares each
once). The plan (:func:`prereg.plan.plan_from_protocol`) and the protocol summary every record copies
(:func:`prereg.plan.expected_summary`) are derived from it; the harness resolves on top of it what
needs the file system or torch (``harness.protocol.Protocol``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prereg.designs import Design
from prereg.hypotheses import Family
from prereg.protocol.schema import CorpusFiles, Metric

__all__ = ["Protocol", "Study"]


@dataclass(frozen=True)
class Study:
    """One study of a protocol, as its file declares it.

    Attributes
    ----------
    name, description
        Its name (unique in the protocol) and description.
    design
        Its design (:mod:`prereg.designs`), looked up once: what code asks instead of its name.
    arms
        A pair's two arms or a default factorial's four (a list), a command study's arms by role (a
        mapping, each arm as every spec holds it: :func:`prereg.commands.arm_of`), or None (a
        declared factorial names each cell's arm under ``cells``).
    factors, cells
        A declared factorial's factors and cells (None otherwise).
    configs
        Its configurations (built-in arms) or configuration labels (command arms), as written.
    seeds
        Its seeds (a list, or ``count`` seeds from ``base``).
    steps, val_every
        Training steps and the evaluation interval (a command study's: ``steps``).
    val_target_bpb, metric
        A built-in study's validation target (one number, or one per configuration); a command
        study's metric (its name, target and which way is better).
    interval_level
        Its two-sided interval level: its own, else the protocol's (:func:`prereg.plan.study_level`).
    block_steps
        A lockstep study's steps per turn (None for any other design): the one shape of it.
    planted, warmup_steps
        A planted study's plant, and the warm-up steps reported apart (None: none).
    """

    name: str
    design: Design
    description: str
    arms: Any
    factors: dict[str, Any] | None
    cells: dict[str, Any] | None
    configs: tuple[Any, ...]
    seeds: tuple[int, ...]
    steps: int
    val_every: int
    val_target_bpb: float | dict[str, Any] | None
    metric: Metric | None
    interval_level: float
    block_steps: int | None
    planted: dict[str, Any] | None
    warmup_steps: int | None

    @property
    def commands(self) -> bool:
        """Whether its arms are commands (a mapping of the two roles)."""
        return isinstance(self.arms, dict)


@dataclass(frozen=True)
class Protocol:
    """A protocol, as its file declares it: each top-level key of
    :data:`prereg.protocol.schema.TOP`, typed, at its default where left out.

    Attributes
    ----------
    corpus
        A built-in corpus's name, or a local corpus's pinned files (:func:`prereg.corpora.corpus_of`).
    hypotheses
        The resolved ``hypotheses`` block as every record carries it: ``{"descriptive": reason}``,
        or the family with each test's configuration filled in (:attr:`family` is it typed).
    studies
        Its studies, in order.
    defaults
        The keys left out whose defaults every record names (``protocol.defaults``), sorted.
    """

    id: str
    version: int
    description: str
    preregistered: bool
    corpus: str | CorpusFiles
    data_dir: str | None
    device: str
    compile: bool
    torch_version: str | None
    threads: int | None
    launcher: str
    budget_device_seconds: float
    interval_level: float
    hypotheses: dict[str, Any]
    max_attempts: int
    order_seed: int
    records_dir: str | None
    origins: dict[str, Any] | None
    calibration: dict[str, Any] | None
    studies: tuple[Study, ...]
    schedule: str
    design_calibration: str | None
    effect_class: str | None
    replicates: dict[str, Any] | None
    defaults: tuple[str, ...] = ()

    @property
    def family(self) -> Family | None:
        """The hypotheses, typed (None for a descriptive protocol)."""
        return None if "descriptive" in self.hypotheses else Family.of(self.hypotheses)

    @property
    def tag_name(self) -> str:
        """The tag that freezes a preregistered protocol: ``protocol-<id>``."""
        return f"protocol-{self.id}"

    def study(self, name: str) -> Study:
        """The study named ``name`` (KeyError when none is)."""
        for s in self.studies:
            if s.name == name:
                return s
        raise KeyError(name)
