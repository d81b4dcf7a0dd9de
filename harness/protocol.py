"""Protocols, resolved: the core reads and types the file (:mod:`prereg.protocol`: every key
declared once, with its type, default and origin; the public audit's reader), and this module
resolves on top what needs the file system or torch, into :class:`Protocol`.

A protocol is validated completely before anything runs; every error names the file, the key
and the line. Its identity is the sha256 of the file's bytes. Each study's arms, configurations
and command arms are resolved in :mod:`harness.study`. Freezing (the tag and what it binds) lives
in :mod:`harness.freeze`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import gitutil
from harness.config import Config
from harness.data.corpora import Corpus, LocalCorpus, load_corpus, local_corpus
from harness.plugins import fingerprint
from harness.study import Study, parse_studies
from prereg.plan import defaults_text
from prereg.planted import DEFAULT_CLASS, calibrated_designs, uncalibrated
from prereg.protocol.model import Protocol as ProtocolSpec
from prereg.protocol.read import protocol_of, read_document
from prereg.protocol.schema import CALIBRATION, Document, KeyPath, mapping
from prereg.replicates import replicates_problems


@dataclass(frozen=True)
class Protocol:
    """A protocol, resolved: the core's typed protocol (``spec``, every key the file declares, read
    by the public audit's reader: ``proto.spec.device``; the one home of each key) and, on top, what
    needs the file system or torch: the corpus, each study's arms, configurations and command arms,
    the plug-ins' sources, the file's identity."""

    spec: ProtocolSpec
    corpus: str | LocalCorpus
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
        data_dir = self.spec.data_dir
        return load_corpus(self.corpus, self.root / data_dir if data_dir else None, self.root)

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

    def defaults_note(self) -> str | None:
        """The keys the file leaves out and the defaults they took (``prereg.plan.PROTOCOL_DEFAULTS``,
        which every record names under ``protocol.defaults``); None when it leaves none out."""
        if not self.spec.defaults:
            return None
        return (
            "defaults (keys this protocol leaves out; every record names them): "
            f"{defaults_text(list(self.spec.defaults))}"
        )

    @property
    def records_path(self) -> Path:
        return self.root / (self.spec.records_dir or f"records/{self.spec.id}")

    @property
    def runs_path(self) -> Path:
        return self.root / "runs" / self.spec.id

    @property
    def relpath(self) -> str:
        return self.path.resolve().relative_to(self.root.resolve()).as_posix()

    def summary(self) -> dict[str, object]:
        """What every record says about its protocol (and the audit reads): the core's
        :func:`prereg.plan.expected_summary` of the file, and its plug-ins' fingerprints."""
        from prereg.plan import expected_summary

        return {
            **expected_summary(self.spec, self.sha256, self.relpath),
            "plugins": self.plugin_fingerprints(),
        }


def project_root(path: Path) -> Path:
    """The folder the protocol's ``configs/``, ``records/`` and ``runs/`` hang from."""
    here = path.resolve().parent
    for d in (here, *here.parents):
        if (d / "configs").is_dir():
            return d
    top = gitutil.toplevel(path)
    return top if top is not None else here


#: Keys of protocol schema 1, replaced by ``hypotheses`` (docs/decisions.md).
REPLACED = {
    "quality_tolerance_bpb": "a non_inferiority hypothesis on endpoint test_bpb with that margin",
    "unreached_target": "the censoring rule of a time_to_target hypothesis (worst_rank or restricted_mean)",
    "primary_endpoint": "hypotheses (the first of a fixed_sequence family is the primary one)",
    "quality_decision": "a non_inferiority hypothesis on endpoint test_bpb (or hypotheses: {descriptive: ...})",
}


def load_protocol(path: str | Path) -> Protocol:
    """Load and validate a protocol completely: read and typed by the core
    (:func:`prereg.protocol.read.protocol_of`, the public audit's reader), then what needs the file
    system or torch resolved on top (configurations, corpora, arms and plug-ins, command arms, the
    calibration it names)."""
    p = Path(path)
    doc = read_document(p)
    _refuse_schema_1(doc)
    spec = protocol_of(doc)
    root = project_root(p)
    configs: dict[str, Config] = {}
    plugins: dict[str, str] = {}
    studies = parse_studies(doc, spec.studies, root, configs, plugins)
    _refuse_outside_root(doc, spec, root)
    _refuse_unmeasurable(doc, spec, studies)
    pending = _calibration_pending(doc, spec.calibration)
    if spec.design_calibration is not None:
        _refuse_uncalibrated(doc, spec.design_calibration, root, studies, spec.effect_class or DEFAULT_CLASS)
    elif spec.effect_class is not None:
        raise doc.error(
            ("effect_class",),
            "effect_class names the class whose bias the calibration measured; name that calibration "
            "(design_calibration: protocols/<calibration>.yaml, run with harness calibration-study)",
        )
    if spec.replicates is not None:
        counts = {s.name: len(s.seeds) for s in studies}
        for where, message in replicates_problems(spec.replicates, counts):
            raise doc.error(("replicates", *where), message)
        _refuse_unreplicable(doc, spec, studies)
    if spec.origins is not None:
        _refuse_bad_origins(doc, spec.origins)
    return Protocol(
        spec=spec,
        corpus=local_corpus(spec.corpus),
        studies=tuple(studies),
        calibration_pending=pending,
        path=p,
        root=root,
        sha256=hashlib.sha256(doc.raw).hexdigest(),
        configs=configs,
        plugins=plugins,
    )


def _refuse_unreplicable(doc: Document, spec: ProtocolSpec, studies: list[Study]) -> None:
    """A replicated protocol's decisions are made over its replicates: refuse sequential looks
    (they would decide on pooled pairs before later replicates exist) and an order-cell hypothesis
    whose replicates are too small for its estimate (4 cells and at least 1 degree of freedom)."""
    declared = spec.hypotheses
    if "sequential" in declared:
        raise doc.error(
            ("replicates",),
            "replicates with sequential looks: the looks decide on the pooled pairs, before later "
            "replicates exist; declare one or the other",
        )
    count = spec.replicates["count"] if spec.replicates else 1
    lockstep = {s.name: len(s.seeds) for s in studies if s.block_steps is not None}
    for i, h in enumerate(declared.get("tests") or []):
        seeds = lockstep.get(h.get("study"))
        if h.get("period_adjusted") and seeds is not None and seeds // count < 5:
            raise doc.error(
                ("hypotheses", "tests", i, "period_adjusted"),
                f"each replicate of study {h.get('study')!r} has {seeds // count} pairs; its order-cell "
                "estimate needs at least 5 in every replicate (more seeds or fewer replicates)",
            )


def _refuse_outside_root(doc: Document, spec: ProtocolSpec, root: Path) -> None:
    """Refuse a ``records_dir`` or ``data_dir`` that resolves outside the study's repository."""
    for key, value in (("records_dir", spec.records_dir), ("data_dir", spec.data_dir)):
        if value is not None:
            where = (root / value).resolve()
            if not where.is_relative_to(root.resolve()):
                raise doc.error(
                    (key,),
                    f"{value!r} resolves to {where}, outside the study's repository {root}; "
                    "records and data must stay inside it",
                )


def _refuse_bad_origins(doc: Document, origins: dict[str, Any]) -> None:
    """Refuse an ``origins`` entry that is not a sentence."""
    for k, v in origins.items():
        if not isinstance(v, str):
            raise doc.error(("origins", k), "each origin is a sentence saying where the number comes from")


#: What a lockstep pair cannot measure per arm, and why (docs/decisions.md, "Lockstep pairs").
LOCKSTEP_UNMEASURABLE = {
    "peak_memory": "one process holds both arms, so its memory peak is the pair's, not an arm's",
    "total_time": "one process runs both arms, so its start-up, evaluation and device seconds are the pair's",
}


#: What a study of command arms measures: its script's reporter gives the training clock, time to
#: target and the metric; the harness's clock of the process gives the total time.
#: The endpoints of a lockstep study's after-own steps (prereg/carryover.own_step_means).
AFTER_OWN = ("own_step_time", "own_step_cpu_time")
COMMAND_ENDPOINTS = (
    "training_time",
    "training_cpu_time",
    *AFTER_OWN,
    "time_to_target",
    "total_time",
    "final_metric",
)
#: What an arm without the reporter (``reporter: false``) leaves: the process's time and the metric
#: its output shows.
OUTPUT_ENDPOINTS = ("total_time", "final_metric")


def command_unmeasurable(study: Study, endpoint: str) -> str | None:
    """Why ``study`` cannot measure ``endpoint`` (None: it can): ``final_metric`` belongs to command
    studies, ``test_bpb`` and ``peak_memory`` to built-in arms, and the training clock to arms whose
    script reports its steps."""
    if study.commands is None:
        return (
            "final_metric is a command study's metric (its arms are built in: use test_bpb)"
            if endpoint == "final_metric"
            else None
        )
    if endpoint not in COMMAND_ENDPOINTS:
        return (
            f"a study of command arms cannot measure {endpoint}: its scripts report "
            f"{', '.join(COMMAND_ENDPOINTS)} (the metric is final_metric)"
        )
    plain = [r for r, a in study.commands.items() if not a["reporter"]]
    if plain and endpoint not in OUTPUT_ENDPOINTS:
        return (
            f"arm {plain[0]} has no reporter (reporter: false), so only the process's time and its output's "
            f"metric are measured ({', '.join(OUTPUT_ENDPOINTS)}), not {endpoint}"
        )
    return None


def _refuse_unmeasurable(doc: Document, spec: ProtocolSpec, studies: list[Study]) -> None:
    """Refuse, naming the key, what a study's design or the device cannot measure: a lockstep study's
    per-arm memory and whole-process times, a compiled lockstep study, an undeclared origin of a
    preregistered ``block_steps``, and CPU time on a GPU."""
    lockstep = {s.name for s in studies if s.lockstep}
    if lockstep and spec.compile:
        raise doc.error(
            ("compile",),
            "a lockstep study runs eagerly: two compiled models in one process share dynamo's and "
            "inductor's caches, so the second arm's compile and first steps are not those of a process "
            "of its own (use design: paired to compare compiled arms)",
        )
    if lockstep and spec.preregistered and not (spec.origins or {}).get("block_steps"):
        raise doc.error(
            ("origins",),
            "a preregistered lockstep study states where its block_steps comes from: origins.block_steps",
        )
    by_name = {s.name: s for s in studies}
    for i, t in enumerate(spec.hypotheses.get("tests", [])):
        why = command_unmeasurable(by_name[t["study"]], t["endpoint"])
        if why:
            raise doc.error(("hypotheses", "tests", i, "endpoint"), f"study {t['study']!r}: {why}")
        why = LOCKSTEP_UNMEASURABLE.get(t["endpoint"]) if t["study"] in lockstep else None
        if why:
            raise doc.error(
                ("hypotheses", "tests", i, "endpoint"),
                f"study {t['study']!r} is a lockstep study, which cannot measure {t['endpoint']} per arm: {why}",
            )
        if t["endpoint"] in AFTER_OWN and t["study"] not in lockstep:
            raise doc.error(
                ("hypotheses", "tests", i, "endpoint"),
                f"{t['endpoint']} is the mean step time after the arm's own step, which a lockstep study "
                f'keeps (docs/decisions.md, "Effect classes"); study {t["study"]!r} is not one',
            )
        if t["endpoint"] in ("training_cpu_time", "own_step_cpu_time") and spec.device != "cpu":
            raise doc.error(
                ("hypotheses", "tests", i, "endpoint"),
                f"{t['endpoint']} on device {spec.device!r}: the host thread's CPU time does not "
                "measure work a GPU does asynchronously (waiting for it costs none); use training_time",
            )


def _refuse_uncalibrated(
    doc: Document, value: str, root: Path, studies: list[Study], effect_class: str
) -> None:
    """``design_calibration``: the calibration study (a protocol file inside the repository) whose
    planted effects measured each design's bias; every study of this protocol that is not itself
    planted must use a design it covers (:func:`prereg.planted.uncalibrated`), named at its key."""
    where = (root / value).resolve()
    if not where.is_relative_to(root.resolve()) or not where.is_file():
        raise doc.error(
            ("design_calibration",),
            f"{value!r} is not a protocol file inside the repository {root} (the calibration study, "
            "e.g. protocols/calibration-cpu.yaml)",
        )
    cal = read_document(where).data
    covered = calibrated_designs(cal if isinstance(cal, dict) else {})
    if not covered:
        raise doc.error(
            ("design_calibration",),
            f"{value} plants nothing in a paired or lockstep study: it measured no design's bias",
        )
    for si, st in enumerate(studies):
        if st.planted is not None or not st.kind.pairwise:
            continue
        why = uncalibrated(st.block_steps, covered, value, effect_class)
        if why:
            key = "block_steps" if st.block_steps is not None else "design"
            raise doc.error(("effect_class",) if "effect_class" in doc.data else ("studies", si, key), why)


def _refuse_schema_1(doc: Document) -> None:
    """Refuse, naming the first one, a key of protocol schema 1 at the top or in a study."""
    if not isinstance(doc.data, dict):
        return
    old: list[tuple[str, KeyPath]] = [(k, ()) for k in REPLACED if k in doc.data]
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


def _calibration_pending(doc: Document, raw: Any) -> bool:
    """Whether the protocol's ``calibration`` block (if any) says its calibration is still pending."""
    if raw is None:
        return False
    cal = mapping(doc, raw, ("calibration",), CALIBRATION)
    return cal["status"] == "pending"
