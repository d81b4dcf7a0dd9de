"""A protocol's studies: each entry of its ``studies`` list validated into a :class:`Study` (name and
design, arms or a factorial's cells, configurations and their plug-ins, seeds, validation targets).
:func:`harness.protocol.load_protocol` calls :func:`parse_studies`; every error names the key and
the line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.commandarm import check_arms
from harness.config import Config, config_dir, find_config
from harness.factorial import DEFAULT_CELLS, DEFAULT_DESIGN, Design, parse
from harness.names import ARMS, ID_RE
from harness.plugins import is_plugin, source_of
from prereg.designs import PAIRED
from prereg.designs import Design as StudyDesign
from prereg.errors import InputError
from prereg.planted import plant_problems
from prereg.protocol.model import Study as Declared
from prereg.protocol.schema import CommandArm, Document, KeyPath, Metric


@dataclass(frozen=True)
class Study:
    name: str
    design: str
    description: str
    arms: tuple[str, ...]
    configs: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    val_every: int
    val_target_bpb: dict[str, float]
    interval_level: float
    factorial: Design | None = None  # a factorial study's factors and cells (harness.factorial)
    # a lockstep study (``design: lockstep``): its pairs are analysed as pairs (``design`` is what
    # it is analysed as: ``kind.analysed_as``), each pair's two arms trained in one process in
    # alternating blocks of ``block_steps`` steps; None otherwise
    block_steps: int | None = None
    # a command study (harness.commandarm): each role's command arm, and the metric they report
    commands: dict[str, CommandArm] | None = None
    metric: Metric | None = None
    # a planted study (prereg/planted.py): the plant its candidate runs each step; None otherwise
    planted: dict[str, Any] | None = None
    # steps at the start of each run reported apart from the training clock (warm-up); None: none
    warmup_steps: int | None = None

    # the study's design as its protocol names it (prereg.designs), looked up once: what code asks
    # instead of comparing ``design``
    kind: StudyDesign = PAIRED

    @property
    def lockstep(self) -> bool:
        """Whether a unit's two runs take turns (``block_steps`` each)."""
        return self.kind.shares_process


def parse_studies(
    doc: Document,
    declared: tuple[Declared, ...],
    root: Path,
    configs: dict[str, Config],
    plugins: dict[str, str],
) -> list[Study]:
    """The protocol's studies, in order, resolved from the core's typed studies (``declared``, whose
    keys, seeds, steps and design rules :func:`prereg.protocol.read.protocol_of` checked): each
    study's configurations are found under ``root``'s ``configs/`` (into ``configs``, each once),
    its plug-in arms and model families recorded in ``plugins``, its command arms checked."""
    cdir = config_dir(root)
    studies: list[Study] = []
    for si, s in enumerate(declared):
        kp: KeyPath = ("studies", si)
        commands = metric = None
        if s.commands:
            commands, metric = _commands(doc, s, kp, root)
            arms, design = list(commands), None
            targets = dict.fromkeys(_labels(doc, s, kp), metric["target"])
        else:
            arms, design = _arms(doc, s, kp, root, plugins)
            _configs(doc, s, kp, root, cdir, configs, plugins)
            targets = _targets(doc, s, kp)
        _planted(doc, s, kp, arms, commands)
        studies.append(_study(s, arms, targets, design, commands, metric))
    return studies


def _study(
    s: Declared,
    arms: list[str],
    targets: dict[str, float],
    design: Design | None,
    commands: dict[str, CommandArm] | None,
    metric: Metric | None,
) -> Study:
    """The :class:`Study` of a typed study, resolved (a lockstep study's pairs are paired)."""
    return Study(
        name=s.name,
        design=s.design.analysed_as,
        description=s.description,
        arms=tuple(arms),
        configs=tuple(s.configs),
        seeds=s.seeds,
        steps=s.steps,
        val_every=s.val_every,
        val_target_bpb=targets,
        interval_level=s.interval_level,
        factorial=design,
        block_steps=s.block_steps,
        commands=commands,
        metric=metric,
        planted=s.planted,
        warmup_steps=s.warmup_steps,
        kind=s.design,
    )


def _planted(
    doc: Document, s: Declared, kp: KeyPath, arms: list[str], commands: dict[str, CommandArm] | None
) -> None:
    """A planted study is a pair of one arm against itself, the candidate running the plant: a
    study that also compares two different arms would mix the plant into a real change."""
    if s.planted is None:
        return
    for key, message in plant_problems(s.planted, commands is not None):
        raise doc.error(kp + ("planted", *key), message)
    if not s.design.pairwise:
        raise doc.error(kp + ("planted",), "a plant belongs to a pair (design paired or lockstep)")
    if commands is not None and not commands["candidate"]["reporter"]:
        raise doc.error(
            kp + ("planted",),
            "a planted command arm runs its plant in its reporter: the candidate has none (reporter: false)",
        )
    same = commands["baseline"] == commands["candidate"] if commands is not None else arms[0] == arms[1]
    if not same:
        raise doc.error(
            kp + ("planted",),
            "a planted study measures a design's bias against a known effect: its baseline and candidate "
            "must be the same arm (the candidate adds only the plant); a study that also claims a real "
            "change would mix the two (put the real change in a study of its own)",
        )


def _commands(doc: Document, s: Declared, kp: KeyPath, root: Path) -> tuple[dict[str, CommandArm], Metric]:
    """A command study's arms and metric as the core read them (:func:`prereg.commands.command_arms`:
    every key, the lockstep pair's reporters), each arm found where it runs
    (:func:`harness.commandarm.check_arms`); its ``configs`` are labels passed to ``{config}`` (the
    core refused its ``val_every``, ``val_target_bpb``, ``factors`` and ``cells``: the metric's
    target is its target)."""
    arms: dict[str, CommandArm] = s.arms
    assert s.metric is not None  # the core's reader refuses a command study without one
    check_arms(doc, arms, kp + ("arms",), root)
    return arms, s.metric


def _labels(doc: Document, s: Declared, kp: KeyPath) -> list[str]:
    """A command study's configuration labels (what ``{config}`` says), unique, each a name."""
    labels = s.configs
    if not labels:
        raise doc.error(kp + ("configs",), "a study needs at least one configuration")
    for ci, c in enumerate(labels):
        if not isinstance(c, str) or not ID_RE.match(c):
            raise doc.error(
                kp + ("configs", ci), f"a configuration label is a name (letters, digits, - and _), got {c!r}"
            )
    if len(set(labels)) != len(labels):
        raise doc.error(kp + ("configs",), "duplicate configuration")
    return list(labels)


def _arms(
    doc: Document, s: Declared, kp: KeyPath, root: Path, plugins: dict[str, str]
) -> tuple[list[str], Design | None]:
    """A study's arms and, for a factorial, its design: two arms for a pair; one per cell of a
    factorial (:func:`_factorial`); each built in or a plug-in whose source is found, recorded in
    ``plugins``."""
    design = None
    if s.design.pairwise:
        for key, value in (("factors", s.factors), ("cells", s.cells)):
            if value is not None:
                raise doc.error(kp + (key,), f"{key!r} belongs to a factorial study (design: factorial)")
        arms = s.arms
        if not isinstance(arms, list) or len(arms) != 2:
            raise doc.error(
                kp + ("arms",), f"a {s.design.name} study needs exactly two arms: [baseline, candidate]"
            )
    else:
        design = _factorial(doc, s, kp)
        arms = list(design.arms) if design.declared else s.arms or list(DEFAULT_CELLS)
    for ai, a in enumerate(arms):
        where = kp + (("arms", ai) if design is None or not design.declared else ("cells", design.cells[ai]))
        if a not in ARMS and not is_plugin(a):
            raise doc.error(
                where, f"unknown arm {a!r} (known: {', '.join(ARMS)}, or a plug-in module:function)"
            )
        if is_plugin(a):
            if source_of(a, root) is None:
                raise doc.error(
                    where,
                    f"plug-in arm {a!r}: module {a.partition(':')[0]} not found "
                    "(run from the study's root, or install it)",
                )
            plugins[a] = str(source_of(a, root))
    return arms, design


def _factorial(doc: Document, s: Declared, kp: KeyPath) -> Design:
    """A factorial study's design: declared (``factors`` and ``cells``), or the default 2x2 of the
    four built-in arms (``arms`` optional, then exactly those four)."""
    if s.factors is None:
        if s.cells is not None:
            raise doc.error(
                kp + ("cells",), "cells need their factors: declare 'factors' (docs/decisions.md)"
            )
        arms = s.arms if s.arms is not None else list(DEFAULT_CELLS)
        if not isinstance(arms, list) or sorted(map(str, arms)) != sorted(DEFAULT_CELLS):
            raise doc.error(
                kp + ("arms",),
                f"a factorial study without declared factors has the four cells "
                f"{', '.join(DEFAULT_CELLS)} (or declare 'factors' and 'cells')",
            )
        return DEFAULT_DESIGN
    if s.arms is not None:
        raise doc.error(kp + ("arms",), "a study with declared factors names each cell's arm under 'cells'")
    try:
        return parse(s.factors, s.cells)
    except ValueError as e:
        path, message = e.args[0]
        base = kp + (() if path[:1] == ("cells",) else ("factors",))
        raise doc.error(base + tuple(path), message) from None


def _configs(
    doc: Document,
    s: Declared,
    kp: KeyPath,
    root: Path,
    cdir: Path,
    configs: dict[str, Config],
    plugins: dict[str, str],
) -> None:
    """Find a study's configurations (into ``configs``, each once) and their plug-in model families
    (into ``plugins``); a configuration that names no file is an error at the study's key."""
    if not s.configs:
        raise doc.error(kp + ("configs",), "a study needs at least one configuration")
    for ci, c in enumerate(s.configs):
        if not isinstance(c, str):
            raise doc.error(kp + ("configs", ci), f"configuration names are strings, got {c!r}")
        if c not in configs:
            if not cdir.resolve().is_relative_to(root.resolve()):
                raise doc.error(
                    kp + ("configs", ci),
                    f"configuration {c!r}: the protocol's folder has no configs/ above it inside its "
                    f"repository (its root is {root}); a study runs inside the repository that "
                    "holds its configurations, so the tag binds both: put the protocol under that "
                    "repository's protocols/ (for this harness's configurations, its own checkout), "
                    "or add a configs/ folder at your repository's root; nothing was written",
                )
            try:
                configs[c] = find_config(c, cdir)
                fam = configs[c].model.family
                if is_plugin(fam):
                    src = source_of(fam, root)
                    if src is None:
                        raise doc.error(
                            kp + ("configs", ci),
                            f"configuration {c!r}: model family {fam!r} not "
                            "found (run from the study's root, or install it)",
                        )
                    plugins[fam] = str(src)
            except InputError as e:
                if e.file and e.file.endswith(f"{c}.yaml") and not Path(e.file).is_file():
                    raise doc.error(kp + ("configs", ci), e.message) from e
                raise
    if len(set(s.configs)) != len(s.configs):
        raise doc.error(kp + ("configs",), "duplicate configuration")


def _targets(doc: Document, s: Declared, kp: KeyPath) -> dict[str, float]:
    """A study's validation target per configuration: one number for all, or one per configuration."""
    target = s.val_target_bpb
    if isinstance(target, dict):
        for c in s.configs:
            if c not in target:
                raise doc.error(kp + ("val_target_bpb",), f"no target for configuration {c!r}")
        for c, v in target.items():
            if c not in s.configs:
                raise doc.error(kp + ("val_target_bpb", c), f"{c!r} is not a configuration of this study")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise doc.error(kp + ("val_target_bpb", c), f"target must be a positive number, got {v!r}")
        return {c: float(target[c]) for c in s.configs}
    if target is None or target <= 0:  # the core's reader requires it of a study of built-in arms
        raise doc.error(kp + ("val_target_bpb",), "target must be positive")
    return dict.fromkeys(s.configs, float(target))
