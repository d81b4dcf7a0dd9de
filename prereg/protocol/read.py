"""A protocol file read once, with the standard library alone: its bytes (bounded: a regular file of
at most :data:`MAX_BYTES`), UTF-8 without a byte order mark, read as the YAML subset
(:func:`prereg.yamlsub.yaml_lines`) into a :class:`~prereg.protocol.schema.Document` that keeps
every key's line. The harness (``harness plan``, ``run``, ``tag``) and the public audit read a
protocol with this one reader, so what the harness accepts is what the audit reads; each refusal is
an :class:`~prereg.errors.InputError` naming the file and the line."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from prereg.bounded import InputLimitError, read_target
from prereg.commands import checked_metric, command_arms
from prereg.corpora import corpus_of
from prereg.designs import Design, design_named
from prereg.errors import InputError
from prereg.hypotheses import rule_problems
from prereg.plan import study_level
from prereg.protocol.model import Protocol, Study
from prereg.protocol.schema import (
    FAMILY,
    NAMED,
    SEEDS,
    STUDY,
    TEST,
    TOP,
    CommandArm,
    Document,
    KeyPath,
    mapping,
)
from prereg.sequential import looks_problems
from prereg.yamlflow import YamlError
from prereg.yamlsub import yaml_lines

__all__ = [
    "MAX_BYTES",
    "MAX_SEEDS",
    "document_of",
    "protocol_from_data",
    "protocol_from_text",
    "protocol_of",
    "read_document",
]

#: The largest protocol or configuration file read (a protocol of the largest study is a few kB).
MAX_BYTES = 1 << 20

#: The reader's refusal of an anchor (``&a``) or an alias (``*a``): a quoted token that starts so.
_ANCHOR = re.compile(r"""['"][&*]""")


def read_document(path: str | Path) -> Document:
    """Read the protocol file at ``path`` (a link followed to a regular file of at most
    :data:`MAX_BYTES` bytes) into a :class:`Document`; :class:`InputError` naming the file otherwise.

    Parameters
    ----------
    path : str or Path
        The protocol file.

    Returns
    -------
    Document
        Its data (as ``yaml.safe_load`` gives it, for the subset read), each key path's line, its bytes.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", file=str(p)) from e
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (a FIFO, a device or a folder)", file=str(p))
    if st.st_size > MAX_BYTES:
        raise InputError(
            f"{st.st_size} bytes: a protocol or configuration file is at most {MAX_BYTES} bytes", file=str(p)
        )
    try:
        raw = read_target(str(p), MAX_BYTES)
    except InputLimitError as e:
        raise InputError(str(e).removeprefix(f"{p}: "), file=str(p)) from e
    return document_of(raw, p)


def refuse_bom(raw: bytes, path: Path) -> None:
    """Refuse a YAML file whose bytes start with a UTF-8 byte order mark (protocols here, and the
    harness's configuration files): :class:`InputError` naming the file and line 1."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise InputError(
            "the file starts with a UTF-8 byte order mark: save it without one (the protocol's sha256 "
            "is of its bytes, and the mark is invisible in most editors)",
            file=str(path),
            line=1,
        )


def document_of(raw: bytes, path: str | Path) -> Document:
    """The :class:`Document` of a protocol's bytes ``raw`` (``path``: the file its errors name).

    Parameters
    ----------
    raw : bytes
        The file's bytes (the protocol's sha256 is of these).
    path : str or Path
        The file, as errors name it.

    Returns
    -------
    Document
        The data and each key path's line; :class:`InputError` naming the line where the bytes are
        not UTF-8, start with a byte order mark, or hold YAML beyond the subset read.
    """
    p = Path(path)
    refuse_bom(raw, p)
    try:
        data, lines = yaml_lines(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError("not UTF-8 text", file=str(p)) from e
    except YamlError as e:
        raise InputError(_refusal(str(e).partition(": ")[2]), file=str(p), line=e.line) from e
    return Document(p, data, lines, raw)


def _refusal(problem: str) -> str:
    """The sentence of the reader's ``problem``: an anchor or alias named as such, else what it
    could not read and what to do."""
    if _ANCHOR.match(problem):
        return (
            "anchors (&) and aliases (*) are not allowed: write each value out (the public audit's "
            "YAML reader reads none)"
        )
    if problem.startswith("duplicate key"):
        return f"{problem}: write each key once"
    return (
        f"not read: {problem} (the protocol's reader, the public audit's, reads plain YAML); "
        "write that line in a plainer form"
    )


#: The most seeds (pairs or blocks) one study may plan: far above any study these machines can run,
#: and low enough that a plan is made in well under a second.
MAX_SEEDS = 10_000


def protocol_of(doc: Document) -> Protocol:
    """The typed :class:`~prereg.protocol.model.Protocol` of a read protocol file: every key of
    :data:`~prereg.protocol.schema.TOP` checked and defaulted, each study's keys
    (:data:`~prereg.protocol.schema.STUDY`) and the rules of its design, its seeds and steps, and
    the hypotheses (:data:`~prereg.protocol.schema.FAMILY`, :data:`~prereg.protocol.schema.TEST`,
    the core's rules); each refusal an :class:`InputError` naming the file, the key and the line.
    What needs the file system or torch (configurations, arms, corpora, command programs) the
    harness checks on top.

    Parameters
    ----------
    doc : Document
        The read file (:func:`read_document`, :func:`document_of`).

    Returns
    -------
    Protocol
        The protocol, typed.
    """
    top = mapping(doc, doc.data, (), TOP)
    studies = _studies(doc, top["studies"], top["interval_level"])
    hypotheses = _hypotheses(doc, top["hypotheses"], studies)
    named = sorted(k for k, f in TOP.items() if f.origin == NAMED and k not in doc.data)
    return Protocol(
        **{k: v for k, v in top.items() if k not in ("studies", "hypotheses", "corpus")},
        corpus=corpus_of(doc, top["corpus"]),
        studies=tuple(studies),
        hypotheses=hypotheses,
        defaults=tuple(named),
    )


def protocol_from_text(raw: bytes, path: str | Path) -> Protocol:
    """:func:`protocol_of` the protocol file whose bytes are ``raw`` (``path``: as errors name it)."""
    return protocol_of(document_of(raw, path))


def _studies(doc: Document, raw: list[object], level: float) -> list[Study]:
    """The protocol's studies, in order: at least one, names unique."""
    if not raw:
        raise doc.error(("studies",), "a protocol needs at least one study")
    out: list[Study] = []
    for si, entry in enumerate(raw):
        kp: KeyPath = ("studies", si)
        s = mapping(doc, entry, kp, STUDY)
        if any(st.name == s["name"] for st in out):
            raise doc.error(kp + ("name",), f"duplicate study name {s['name']!r}")
        out.append(_study(doc, s, kp, level))
    return out


def _study(doc: Document, s: dict[str, Any], kp: KeyPath, level: float) -> Study:
    """One study from its checked keys ``s``: the keys its kind of arms needs and refuses, its
    seeds, its lockstep turns and its warm-up."""
    design = design_named(s["design"])
    if isinstance(s["arms"], dict):
        _command_keys(doc, s, design, kp)
        s["arms"] = command_arms(doc, s["arms"], kp + ("arms",))
        _lockstep_reporters(doc, s["arms"], design, kp)
        s["metric"] = checked_metric(doc, s["metric"], kp + ("metric",))
        s["val_every"] = s["steps"]  # a command study's scripts evaluate when they choose
    else:
        for key in ("val_every", "val_target_bpb"):
            if s[key] is None:
                raise doc.error(kp, f"missing required key {key!r}")
        if s["metric"] is not None:
            raise doc.error(kp + ("metric",), "metric belongs to a study of command arms")
    seeds = _seeds(doc, s["seeds"], kp + ("seeds",))
    if s["val_every"] > s["steps"]:
        raise doc.error(kp + ("val_every",), "val_every exceeds steps")
    _lockstep(doc, s, design, kp)
    if s["warmup_steps"] is not None and s["warmup_steps"] >= s["steps"]:
        raise doc.error(kp + ("warmup_steps",), "warmup_steps must leave timed steps: fewer than steps")
    return Study(
        name=s["name"],
        design=design,
        description=s["description"],
        arms=s["arms"],
        factors=s["factors"],
        cells=s["cells"],
        configs=tuple(s["configs"]),
        seeds=seeds,
        steps=s["steps"],
        val_every=s["val_every"],
        val_target_bpb=s["val_target_bpb"],
        metric=s["metric"],
        interval_level=study_level(s["interval_level"], level),
        block_steps=s["block_steps"],
        planted=s["planted"],
        warmup_steps=s["warmup_steps"],
    )


def _command_keys(doc: Document, s: dict[str, Any], design: Design, kp: KeyPath) -> None:
    """A command study is a pair with a ``metric``, and has no ``val_every``, ``val_target_bpb``,
    ``factors`` or ``cells`` (its scripts evaluate when they choose; the target is
    ``metric.target``)."""
    if not design.pairwise:
        raise doc.error(kp + ("arms",), "command arms are a pair: design paired or lockstep")
    if s["metric"] is None:
        raise doc.error(
            kp, "a command study names the metric its endpoints read: metric: {name: val_loss, target: 3.0}"
        )
    for key in ("val_every", "val_target_bpb", "factors", "cells"):
        if s[key] is not None:
            raise doc.error(
                kp + (key,),
                f"{key!r} does not belong to a study of command arms (its scripts evaluate when they "
                "choose; the target is metric.target)",
            )


def _lockstep_reporters(doc: Document, arms: dict[str, CommandArm], design: Design, kp: KeyPath) -> None:
    """A lockstep pair of command arms hands the turn over through the reporter: both arms have one."""
    plain = [role for role, a in arms.items() if not a["reporter"]]
    if design.shares_process and plain:
        raise doc.error(
            kp + ("arms", plain[0], "reporter"),
            "a lockstep pair hands the turn over through the reporter: an arm without it "
            "(reporter: false) would train beside its partner (use design: paired)",
        )


def _lockstep(doc: Document, s: dict[str, Any], design: Design, kp: KeyPath) -> None:
    """A lockstep study names its ``block_steps`` (at most its ``steps``); no other study does."""
    if not design.shares_process:
        if s["block_steps"] is not None:
            raise doc.error(
                kp + ("block_steps",), "block_steps belongs to a lockstep study (design: lockstep)"
            )
        return
    if s["block_steps"] is None:
        raise doc.error(
            kp,
            "a lockstep study says how many steps each arm takes before the other: block_steps "
            "(a preregistered number; state its origin under origins.block_steps)",
        )
    if s["block_steps"] > s["steps"]:
        raise doc.error(kp + ("block_steps",), "block_steps exceeds steps")


def _seeds(doc: Document, value: object, kp: KeyPath) -> tuple[int, ...]:
    """A study's seeds: a list of distinct integers (at least two), or ``count`` from ``base``; at
    most :data:`MAX_SEEDS`."""
    too_many = f"at most {MAX_SEEDS} seeds in a study"
    if isinstance(value, dict):
        spec = mapping(doc, value, kp, SEEDS)
        if spec["count"] > MAX_SEEDS:
            raise doc.error(kp + ("count",), too_many)
        return tuple(range(spec["base"], spec["base"] + spec["count"]))
    if not isinstance(value, list):  # the study's keys admit a list or a mapping
        raise doc.error(kp, f"expected a list or a mapping, got {type(value).__name__}")
    if len(value) > MAX_SEEDS:
        raise doc.error(kp, too_many)
    seeds: list[int] = []
    for i, s in enumerate(value):
        if not isinstance(s, int) or isinstance(s, bool):
            raise doc.error(kp + (i,), f"seed must be an integer, got {s!r}")
        if s in seeds:
            raise doc.error(kp + (i,), f"duplicate seed {s}")
        seeds.append(s)
    if len(seeds) < 2:
        raise doc.error(kp, "a study needs at least two seeds")
    return tuple(seeds)


def _hypotheses(doc: Document, raw: dict[str, Any], studies: list[Study]) -> dict[str, Any]:
    """The checked ``hypotheses`` block as records carry it: a descriptive reason, or the family and
    its tests, each test resolved to its study's configuration (docs/decisions.md)."""
    kp: KeyPath = ("hypotheses",)
    if "descriptive" in raw:
        reason = raw["descriptive"]
        if set(raw) != {"descriptive"} or not isinstance(reason, str) or not reason.strip():
            raise doc.error(kp, 'a descriptive protocol says only why: hypotheses: {descriptive: "<reason>"}')
        return {"descriptive": reason}
    fam = mapping(doc, raw, kp, FAMILY)
    if not fam["tests"]:
        raise doc.error(
            kp + ("tests",), "list at least one hypothesis, or say hypotheses: {descriptive: ...}"
        )
    by_name = {s.name: s for s in studies}
    tests: list[dict[str, Any]] = []
    for i, t in enumerate(fam["tests"]):
        h = _test(doc, t, kp + ("tests", i), by_name)
        if any(x["id"] == h["id"] for x in tests):
            raise doc.error(kp + ("tests", i, "id"), f"duplicate hypothesis id {h['id']!r}")
        tests.append(h)
    if fam["sequential"] is None:
        del fam["sequential"]  # records of protocols without one stay as they were
    else:
        planned = [len(by_name[h["study"]].seeds) for h in tests]
        wrong = looks_problems(fam["sequential"], planned, fam["min_pairs"], [h["study"] for h in tests])
        if wrong:
            key, message = wrong[0]
            raise doc.error(kp + ("sequential",) + ((key,) if key in fam["sequential"] else ()), message)
    return {**fam, "tests": tests}


def _test(doc: Document, t: object, tk: KeyPath, by_name: dict[str, Study]) -> dict[str, Any]:
    """One hypothesis: its keys, a paired study of the protocol that is not planted, its
    configuration (the study's one where left out), and the core's rules
    (:func:`prereg.hypotheses.rule_problems`)."""
    h = mapping(doc, t, tk, TEST)
    st = by_name.get(h["study"])
    if st is None or not st.design.pairwise:
        raise doc.error(tk + ("study",), f"{h['study']!r} is not a paired study of this protocol")
    if st.planted is not None:
        raise doc.error(
            tk + ("study",),
            f"study {st.name!r} is planted (a known cost added to one arm to measure the design's "
            "bias): it is reported apart and never decides a hypothesis about a real change",
        )
    if h["config"] is None:
        if len(st.configs) != 1:
            raise doc.error(tk, f"study {st.name!r} has several configurations: name one under 'config'")
        h["config"] = st.configs[0]
    elif h["config"] not in st.configs:
        raise doc.error(tk + ("config",), f"{h['config']!r} is not a configuration of study {st.name!r}")
    wrong = rule_problems(h)  # the core's rules, which decide applies to the records' copy too
    if wrong:
        key, message = wrong[0]
        raise doc.error(tk + ((key,) if isinstance(t, dict) and key in t else ()), message)
    if h["test"] is None:
        del h["test"]  # records of protocols that do not declare it stay as they were
    return h


def protocol_from_data(data: object, path: str | Path = "<document>") -> Protocol:
    """:func:`protocol_of` a protocol already held as data (what ``yaml.safe_load`` gives; errors
    name ``path`` and no line): a protocol built in code, or a test's."""
    return protocol_of(Document(Path(path), data, {}, b""))
