"""Protocols: strict YAML schema and identity by sha256.

A protocol is validated completely before anything runs; every error names the file, the key
and the line. Its identity is the sha256 of the file's bytes. This module holds the top-level
keys and :class:`Protocol`; each study's keys are validated in :mod:`harness.study`, the
``hypotheses`` block in :mod:`harness.hypotheses`. Freezing (the tag and what it binds) lives in
:mod:`harness.freeze`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import gitutil, yamlio
from harness.config import Config
from harness.data.corpora import Corpus, LocalCorpus, load_corpus, parse_corpus
from harness.hypotheses import parse_hypotheses
from harness.names import ID_RE
from harness.plugins import fingerprint
from harness.study import Study, parse_studies, two_sided_level
from harness.yamlio import Field, one_of, positive
from prereg.plan import PROTOCOL_DEFAULTS as DEFAULTS
from prereg.plan import defaults_text, with_defaults
from prereg.planted import CLASSES, DEFAULT_CLASS, calibrated_designs, uncalibrated
from prereg.replicates import replicates_problems

#: Each key with a safe default takes it from the core's one home (prereg.plan.PROTOCOL_DEFAULTS),
#: which the audit's reader of the tagged file applies too.
_TOP = {
    "id": Field(str, check=lambda v: None if ID_RE.match(v) else "letters, digits, - and _ only"),
    "version": Field(int, required=False, default=DEFAULTS["version"], check=positive),
    "description": Field(str, required=False, default=DEFAULTS["description"]),
    "preregistered": Field(bool, required=False, default=DEFAULTS["preregistered"]),
    "corpus": Field((str, dict), required=False, default=DEFAULTS["corpus"]),
    "data_dir": Field(str, required=False, default=None),
    "device": Field(
        str, required=False, default=DEFAULTS["device"], check=one_of("auto", "cpu", "cuda", "mps")
    ),
    "compile": Field(bool, required=False, default=DEFAULTS["compile"]),
    "torch_version": Field(str, required=False, default=None),
    "threads": Field(int, required=False, default=None, check=positive),
    "launcher": Field(str, required=False, default="spawn", check=one_of("spawn", "forkserver")),
    "budget_device_seconds": Field(float, check=positive),
    "interval_level": Field(float, required=False, default=DEFAULTS["interval_level"], check=two_sided_level),
    "hypotheses": Field(dict, required=False, default=DEFAULTS["hypotheses"]),
    "max_attempts": Field(int, required=False, default=1, check=positive),
    "order_seed": Field(int, required=False, default=DEFAULTS["order_seed"]),
    "records_dir": Field(str, required=False, default=None),
    "origins": Field(dict, required=False, default=None),
    "calibration": Field(dict, required=False, default=None),
    "studies": Field(list),
    # in_order: each study's units after the one before; interleaved: every study's units in one
    # seeded random order, so the studies meet the same load (a calibration study's designs)
    "schedule": Field(str, required=False, default="in_order", check=one_of("in_order", "interleaved")),
    # the calibration study whose planted effects measured the bias of this protocol's designs
    "design_calibration": Field(str, required=False, default=None),
    # the class of change the protocol measures, whose bias the calibration must know
    # (prereg/planted.py CLASSES; default cache-heavy: an optimizer or kernel change)
    "effect_class": Field(str, required=False, default=None, check=one_of(*sorted(set(CLASSES.values())))),
    # separate runs of the runner at different times or on different machines (prereg/replicates.py)
    "replicates": Field(dict, required=False, default=None),
}


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
    # the file as YAML read it (the hash above is of its bytes): what the plan and the summary,
    # whose one home is the audit's core, are derived from
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # ``replicates: {count, min_gap_s}`` (prereg/replicates.py); None: one run of the runner does all
    replicates: dict[str, int] | None = None

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

    def defaults_note(self) -> str | None:
        """The keys the file leaves out and the defaults they took (``prereg.plan.PROTOCOL_DEFAULTS``,
        which every record names under ``protocol.defaults``); None when it leaves none out."""
        keys = self.document.get("defaults") or []
        if not keys:
            return None
        return f"defaults (keys this protocol leaves out; every record names them): {defaults_text(keys)}"

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
        """What every record says about its protocol (and the audit reads): the core's
        :func:`prereg.plan.expected_summary` of the file, and its plug-ins' fingerprints."""
        from prereg.plan import expected_summary

        return {
            **expected_summary(self.document, self.sha256, self.relpath),
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
    """Load and validate a protocol completely (configurations included)."""
    p = Path(path)
    doc = yamlio.load(p)
    _refuse_schema_1(doc)
    top = yamlio.mapping(doc, doc.data, (), _TOP)
    root = project_root(p)
    configs: dict[str, Config] = {}
    plugins: dict[str, str] = {}
    studies = parse_studies(doc, top["studies"], top["interval_level"], root, configs, plugins)
    _refuse_outside_root(doc, top, root)
    hypotheses = parse_hypotheses(doc, top["hypotheses"], studies)
    _refuse_unmeasurable(doc, top, studies, hypotheses)
    pending = _calibration_pending(doc, top["calibration"])
    if top["design_calibration"] is not None:
        _refuse_uncalibrated(
            doc, top["design_calibration"], root, studies, top["effect_class"] or DEFAULT_CLASS
        )
    elif top["effect_class"] is not None:
        raise doc.error(
            ("effect_class",),
            "effect_class names the class whose bias the calibration measured; name that calibration "
            "(design_calibration: protocols/<calibration>.yaml, run with harness calibration-study)",
        )
    if top["replicates"] is not None:
        counts = {s.name: len(s.seeds) for s in studies}
        for where, message in replicates_problems(top["replicates"], counts):
            raise doc.error(("replicates", *where), message)
        _refuse_unreplicable(doc, top, studies)
    if top["origins"] is not None:
        _refuse_bad_origins(doc, top["origins"])
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
        hypotheses=hypotheses,
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
        document=with_defaults(doc.data),
        replicates=dict(top["replicates"]) if top["replicates"] is not None else None,
    )


def _refuse_unreplicable(doc: Any, top: dict[str, Any], studies: list[Any]) -> None:
    """A replicated protocol's decisions are made over its replicates: refuse sequential looks
    (they would decide on pooled pairs before later replicates exist) and an order-cell hypothesis
    whose replicates are too small for its estimate (4 cells and at least 1 degree of freedom)."""
    spec = top["hypotheses"] if isinstance(top["hypotheses"], dict) else {}
    if "sequential" in spec:
        raise doc.error(
            ("replicates",),
            "replicates with sequential looks: the looks decide on the pooled pairs, before later "
            "replicates exist; declare one or the other",
        )
    count = top["replicates"]["count"]
    lockstep = {s.name: len(s.seeds) for s in studies if s.block_steps is not None}
    for i, h in enumerate(spec.get("tests") or []):
        seeds = lockstep.get(h.get("study"))
        if h.get("period_adjusted") and seeds is not None and seeds // count < 5:
            raise doc.error(
                ("hypotheses", "tests", i, "period_adjusted"),
                f"each replicate of study {h.get('study')!r} has {seeds // count} pairs; its order-cell "
                "estimate needs at least 5 in every replicate (more seeds or fewer replicates)",
            )


def _refuse_outside_root(doc: yamlio.Document, top: dict[str, Any], root: Path) -> None:
    """Refuse a ``records_dir`` or ``data_dir`` that resolves outside the study's repository."""
    for key in ("records_dir", "data_dir"):
        if top[key] is not None:
            where = (root / top[key]).resolve()
            if not where.is_relative_to(root.resolve()):
                raise doc.error(
                    (key,),
                    f"{top[key]!r} resolves to {where}, outside the study's repository {root}; "
                    "records and data must stay inside it",
                )


def _refuse_bad_origins(doc: yamlio.Document, origins: dict[str, Any]) -> None:
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


def _refuse_unmeasurable(
    doc: yamlio.Document, top: dict[str, Any], studies: list[Study], hypotheses: dict[str, Any]
) -> None:
    """Refuse, naming the key, what a study's design or the device cannot measure: a lockstep study's
    per-arm memory and whole-process times, a compiled lockstep study, an undeclared origin of a
    preregistered ``block_steps``, and CPU time on a GPU."""
    lockstep = {s.name for s in studies if s.lockstep}
    if lockstep and top["compile"]:
        raise doc.error(
            ("compile",),
            "a lockstep study runs eagerly: two compiled models in one process share dynamo's and "
            "inductor's caches, so the second arm's compile and first steps are not those of a process "
            "of its own (use design: paired to compare compiled arms)",
        )
    if lockstep and top["preregistered"] and not (top["origins"] or {}).get("block_steps"):
        raise doc.error(
            ("origins",),
            "a preregistered lockstep study states where its block_steps comes from: origins.block_steps",
        )
    by_name = {s.name: s for s in studies}
    for i, t in enumerate(hypotheses.get("tests", [])):
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
        if t["endpoint"] in ("training_cpu_time", "own_step_cpu_time") and top["device"] != "cpu":
            raise doc.error(
                ("hypotheses", "tests", i, "endpoint"),
                f"{t['endpoint']} on device {top['device']!r}: the host thread's CPU time does not "
                "measure work a GPU does asynchronously (waiting for it costs none); use training_time",
            )


def _refuse_uncalibrated(
    doc: yamlio.Document, value: str, root: Path, studies: list[Study], effect_class: str
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
    cal = yamlio.load(where).data
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
