"""Protocols: strict YAML schema and identity by sha256.

A protocol is validated completely before anything runs; every error names the file, the key
and the line. Its identity is the sha256 of the file's bytes. Freezing (the tag and what it
binds) lives in :mod:`harness.freeze`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import gitutil, yamlio
from harness.config import Config, config_dir, find_config
from harness.data.corpora import Corpus, LocalCorpus, load_corpus, parse_corpus
from harness.errors import InputError
from harness.factorial import DEFAULT_CELLS, DEFAULT_DESIGN, Design, parse
from harness.hypotheses import parse_hypotheses
from harness.names import ARMS, ID_RE
from harness.plugins import fingerprint, is_plugin, source_of
from harness.yamlio import Field, one_of, positive


def _level(v: Any) -> str | None:
    return None if 0.5 < v < 1 else "must be a two-sided level between 0.5 and 1 (e.g. 0.99)"


_STUDY = {
    "name": Field(str, check=lambda v: None if ID_RE.match(v) else "letters, digits, - and _ only"),
    "design": Field(str, check=one_of("paired", "factorial")),
    "description": Field(str, required=False, default=""),
    "arms": Field(list, required=False, default=None),
    "factors": Field(dict, required=False, default=None),
    "cells": Field(dict, required=False, default=None),
    "configs": Field(list),
    "seeds": Field((list, dict)),
    "steps": Field(int, check=positive),
    "val_every": Field(int, check=positive),
    "val_target_bpb": Field((float, dict)),
    "interval_level": Field(float, required=False, default=None, check=_level),
}
_TOP = {
    "id": Field(str, check=lambda v: None if ID_RE.match(v) else "letters, digits, - and _ only"),
    "version": Field(int, check=positive),
    "description": Field(str),
    "preregistered": Field(bool),
    "corpus": Field((str, dict)),
    "data_dir": Field(str, required=False, default=None),
    "device": Field(str, check=one_of("auto", "cpu", "cuda", "mps")),
    "compile": Field(bool),
    "torch_version": Field(str, required=False, default=None),
    "threads": Field(int, required=False, default=None, check=positive),
    "launcher": Field(str, required=False, default="spawn", check=one_of("spawn", "forkserver")),
    "budget_device_seconds": Field(float, check=positive),
    "interval_level": Field(float, check=_level),
    "hypotheses": Field(dict),
    "max_attempts": Field(int, required=False, default=1, check=positive),
    "order_seed": Field(int),
    "records_dir": Field(str, required=False, default=None),
    "origins": Field(dict, required=False, default=None),
    "calibration": Field(dict, required=False, default=None),
    "studies": Field(list),
}


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


@dataclass(frozen=True)
class Protocol:
    id: str
    version: int
    description: str
    preregistered: bool
    corpus: str | LocalCorpus
    data_dir: str | None
    device: str
    compile: bool
    torch_version: str | None
    threads: int | None
    launcher: str
    budget_device_seconds: float
    interval_level: float
    hypotheses: dict[str, Any]  # resolved: {"descriptive": str} or procedure, family_alpha, min_pairs, tests
    max_attempts: int
    order_seed: int
    records_dir: str | None
    studies: tuple[Study, ...]
    calibration_pending: bool
    path: Path
    root: Path
    sha256: str
    configs: dict[str, Config] = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)  # plug-in name -> its source file

    def corpus_data(self) -> Corpus:
        """The protocol's corpus, every byte verified (DataError otherwise): WikiText-2 under
        ``data_dir``, a local corpus's paths relative to the study's root."""
        return load_corpus(self.corpus, self.root / self.data_dir if self.data_dir else None, self.root)

    def plugin_fingerprints(self) -> dict[str, dict[str, str]]:
        """Each plug-in's source file (relative to the root when inside it) and sha256."""
        out = {}
        for name in sorted(self.plugins):
            fp = fingerprint(name, self.root)
            path = Path(fp["path"]).resolve()
            if path.is_relative_to(self.root.resolve()):
                fp["path"] = path.relative_to(self.root.resolve()).as_posix()
            out[name] = fp
        return out

    @property
    def tag_name(self) -> str:
        return f"protocol-{self.id}"

    @property
    def records_path(self) -> Path:
        return self.root / (self.records_dir or f"records/{self.id}")

    @property
    def runs_path(self) -> Path:
        return self.root / "runs" / self.id

    @property
    def relpath(self) -> str:
        return self.path.resolve().relative_to(self.root.resolve()).as_posix()

    def summary(self) -> dict[str, Any]:
        """What every record says about its protocol (and the audit reads)."""
        return {
            "id": self.id,
            "version": self.version,
            "sha256": self.sha256,
            "path": self.relpath,
            "preregistered": self.preregistered,
            "tag": self.tag_name if self.preregistered else None,
            "interval_level": self.interval_level,
            "hypotheses": self.hypotheses,
            "max_attempts": self.max_attempts,
            "launcher": self.launcher,
            "device": self.device,
            "compile": self.compile,
            "corpus": self.corpus.as_dict() if isinstance(self.corpus, LocalCorpus) else self.corpus,
            "budget_device_seconds": self.budget_device_seconds,
            "plugins": self.plugin_fingerprints(),
            "studies": [
                {
                    "name": s.name,
                    "design": s.design,
                    "arms": list(s.arms),
                    "configs": list(s.configs),
                    "seeds": list(s.seeds),
                    "interval_level": s.interval_level,
                    "steps": s.steps,
                    **(s.factorial.summary() if s.factorial is not None and s.factorial.declared else {}),
                }
                for s in self.studies
            ],
        }


def project_root(path: Path) -> Path:
    """The folder the protocol's ``configs/``, ``records/`` and ``runs/`` hang from."""
    here = path.resolve().parent
    for d in (here, *here.parents):
        if (d / "configs").is_dir():
            return d
    top = gitutil.toplevel(path)
    return top if top is not None else here


def _seeds(doc: yamlio.Document, value: Any, kp: tuple[Any, ...]) -> tuple[int, ...]:
    if isinstance(value, dict):
        spec = yamlio.mapping(doc, value, kp, {"count": Field(int, check=positive), "base": Field(int)})
        return tuple(range(spec["base"], spec["base"] + spec["count"]))
    seeds = []
    for i, s in enumerate(value):
        if not isinstance(s, int) or isinstance(s, bool):
            raise doc.error(kp + (i,), f"seed must be an integer, got {s!r}")
        if s in seeds:
            raise doc.error(kp + (i,), f"duplicate seed {s}")
        seeds.append(s)
    if len(seeds) < 2:
        raise doc.error(kp, "a study needs at least two seeds")
    return tuple(seeds)


#: Keys of protocol schema 1, replaced by ``hypotheses`` (docs/decisions.md).
REPLACED = {
    "quality_tolerance_bpb": "a non_inferiority hypothesis on endpoint test_bpb with that margin",
    "unreached_target": "the censoring rule of a time_to_target hypothesis (worst_rank or restricted_mean)",
    "primary_endpoint": "hypotheses (the first of a fixed_sequence family is the primary one)",
    "quality_decision": "a non_inferiority hypothesis on endpoint test_bpb (or hypotheses: {descriptive: ...})",
}


def load_protocol(path: str | Path) -> Protocol:
    """Load and validate a protocol completely (configurations included)."""
    p = Path(path)
    doc = yamlio.load(p)
    _refuse_schema_1(doc)
    top = yamlio.mapping(doc, doc.data, (), _TOP)
    root = project_root(p)
    cdir = config_dir(root)
    studies: list[Study] = []
    configs: dict[str, Config] = {}
    plugins: dict[str, str] = {}
    names: set[str] = set()
    if not top["studies"]:
        raise doc.error(("studies",), "a protocol needs at least one study")
    for si, raw in enumerate(top["studies"]):
        kp: tuple[Any, ...] = ("studies", si)
        s = yamlio.mapping(doc, raw, kp, _STUDY)
        if s["name"] in names:
            raise doc.error(kp + ("name",), f"duplicate study name {s['name']!r}")
        names.add(s["name"])
        arms, design = _arms(doc, s, kp, root, plugins)
        _configs(doc, s, kp, root, cdir, configs, plugins)
        seeds = _seeds(doc, s["seeds"], kp + ("seeds",))
        targets = _targets(doc, s, kp)
        if s["val_every"] > s["steps"]:
            raise doc.error(kp + ("val_every",), "val_every exceeds steps")
        studies.append(
            Study(
                name=s["name"],
                design=s["design"],
                description=s["description"],
                arms=tuple(arms),
                configs=tuple(s["configs"]),
                seeds=seeds,
                steps=s["steps"],
                val_every=s["val_every"],
                val_target_bpb=targets,
                interval_level=s["interval_level"] or top["interval_level"],
                factorial=design,
            )
        )
    for key in ("records_dir", "data_dir"):
        if top[key] is not None:
            where = (root / top[key]).resolve()
            if not where.is_relative_to(root.resolve()):
                raise doc.error(
                    (key,),
                    f"{top[key]!r} resolves to {where}, outside the study's repository {root}; "
                    "records and data must stay inside it",
                )
    pending = _calibration_pending(doc, top["calibration"])
    if top["origins"] is not None:
        for k, v in top["origins"].items():
            if not isinstance(v, str):
                raise doc.error(
                    ("origins", k), "each origin is a sentence saying where the number comes from"
                )
    return Protocol(
        id=top["id"],
        version=top["version"],
        description=top["description"],
        preregistered=top["preregistered"],
        corpus=parse_corpus(doc, top["corpus"]),
        data_dir=top["data_dir"],
        device=top["device"],
        compile=top["compile"],
        torch_version=top["torch_version"],
        threads=top["threads"],
        launcher=top["launcher"],
        budget_device_seconds=top["budget_device_seconds"],
        interval_level=top["interval_level"],
        hypotheses=parse_hypotheses(doc, top["hypotheses"], studies),
        max_attempts=top["max_attempts"],
        order_seed=top["order_seed"],
        records_dir=top["records_dir"],
        studies=tuple(studies),
        calibration_pending=pending,
        path=p,
        root=root,
        sha256=hashlib.sha256(doc.raw).hexdigest(),
        configs=configs,
        plugins=plugins,
    )


def _refuse_schema_1(doc: yamlio.Document) -> None:
    """Refuse, naming the first one, a key of protocol schema 1 at the top or in a study."""
    if not isinstance(doc.data, dict):
        return
    old: list[tuple[str, yamlio.KeyPath]] = [(k, ()) for k in REPLACED if k in doc.data]
    for i, st in enumerate(doc.data.get("studies") or []):
        if isinstance(st, dict):
            old += [(k, ("studies", i)) for k in REPLACED if k in st]
    if old:
        k, base = old[0]
        raise doc.error(
            base + (k,),
            f"{k!r} belongs to protocol schema 1 and was replaced by 'hypotheses': "
            f"write {REPLACED[k]} (docs/decisions.md)",
        )


def _arms(
    doc: yamlio.Document, s: dict[str, Any], kp: yamlio.KeyPath, root: Path, plugins: dict[str, str]
) -> tuple[list[str], Design | None]:
    """A study's arms and, for a factorial, its design: two arms for a pair; one per cell of a
    factorial (:func:`_factorial`); each built in or a plug-in whose source is found, recorded in
    ``plugins``."""
    design = None
    if s["design"] == "paired":
        for key in ("factors", "cells"):
            if s[key] is not None:
                raise doc.error(kp + (key,), f"{key!r} belongs to a factorial study (design: factorial)")
        arms = s["arms"]
        if not isinstance(arms, list) or len(arms) != 2:
            raise doc.error(kp + ("arms",), "a paired study needs exactly two arms: [baseline, candidate]")
    else:
        design = _factorial(doc, s, kp)
        arms = list(design.arms) if design.declared else s["arms"] or list(DEFAULT_CELLS)
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


def _factorial(doc: yamlio.Document, s: dict[str, Any], kp: yamlio.KeyPath) -> Design:
    """A factorial study's design: declared (``factors`` and ``cells``), or the default 2x2 of the
    four built-in arms (``arms`` optional, then exactly those four)."""
    if s["factors"] is None:
        if s["cells"] is not None:
            raise doc.error(
                kp + ("cells",), "cells need their factors: declare 'factors' (docs/decisions.md)"
            )
        arms = s["arms"] if s["arms"] is not None else list(DEFAULT_CELLS)
        if not isinstance(arms, list) or sorted(map(str, arms)) != sorted(DEFAULT_CELLS):
            raise doc.error(
                kp + ("arms",),
                f"a factorial study without declared factors has the four cells "
                f"{', '.join(DEFAULT_CELLS)} (or declare 'factors' and 'cells')",
            )
        return DEFAULT_DESIGN
    if s["arms"] is not None:
        raise doc.error(kp + ("arms",), "a study with declared factors names each cell's arm under 'cells'")
    try:
        return parse(s["factors"], s["cells"])
    except ValueError as e:
        path, message = e.args[0]
        base = kp + (() if path[:1] == ("cells",) else ("factors",))
        raise doc.error(base + tuple(path), message) from None


def _configs(
    doc: yamlio.Document,
    s: dict[str, Any],
    kp: yamlio.KeyPath,
    root: Path,
    cdir: Path,
    configs: dict[str, Config],
    plugins: dict[str, str],
) -> None:
    """Find a study's configurations (into ``configs``, each once) and their plug-in model families
    (into ``plugins``); a configuration that names no file is an error at the study's key."""
    if not s["configs"]:
        raise doc.error(kp + ("configs",), "a study needs at least one configuration")
    for ci, c in enumerate(s["configs"]):
        if not isinstance(c, str):
            raise doc.error(kp + ("configs", ci), f"configuration names are strings, got {c!r}")
        if c not in configs:
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
    if len(set(s["configs"])) != len(s["configs"]):
        raise doc.error(kp + ("configs",), "duplicate configuration")


def _targets(doc: yamlio.Document, s: dict[str, Any], kp: yamlio.KeyPath) -> dict[str, float]:
    """A study's validation target per configuration: one number for all, or one per configuration."""
    target = s["val_target_bpb"]
    if isinstance(target, dict):
        for c in s["configs"]:
            if c not in target:
                raise doc.error(kp + ("val_target_bpb",), f"no target for configuration {c!r}")
        for c, v in target.items():
            if c not in s["configs"]:
                raise doc.error(kp + ("val_target_bpb", c), f"{c!r} is not a configuration of this study")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise doc.error(kp + ("val_target_bpb", c), f"target must be a positive number, got {v!r}")
        return {c: float(target[c]) for c in s["configs"]}
    if target <= 0:
        raise doc.error(kp + ("val_target_bpb",), "target must be positive")
    return dict.fromkeys(s["configs"], float(target))


def _calibration_pending(doc: yamlio.Document, raw: Any) -> bool:
    """Whether the protocol's ``calibration`` block (if any) says its calibration is still pending."""
    if raw is None:
        return False
    cal = yamlio.mapping(
        doc,
        raw,
        ("calibration",),
        {
            "status": Field(str, check=one_of("pending", "done")),
            "pilot": Field(str),
            "command": Field(str),
        },
    )
    return cal["status"] == "pending"
