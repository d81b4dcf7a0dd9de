"""A read YAML document (its data, the line of every key path, its bytes) and the field checks of
its mappings: every problem an :class:`~prereg.errors.InputError` naming the file, the key path and
the line."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from prereg.designs import design_names, find_design
from prereg.errors import InputError
from prereg.hypotheses import CHOICES, family_problems
from prereg.planted import CLASSES
from prereg.yamlflow import KeyPath

__all__ = [
    "CALIBRATION",
    "COMMAND_ARM",
    "CORPORA",
    "CORPUS_FILE",
    "CORPUS_SPLITS",
    "FAMILY",
    "FIXED",
    "FRACTIONS",
    "ID_RE",
    "METRIC",
    "NAMED",
    "PIN",
    "PROTOCOL",
    "SEEDS",
    "SPLITS",
    "STUDY",
    "TEST",
    "TOP",
    "CommandArm",
    "CorpusFiles",
    "Document",
    "Field",
    "Metric",
    "Pin",
    "KeyPath",
    "dotted",
    "mapping",
    "named_defaults",
    "non_negative",
    "one_of",
    "positive",
    "two_sided_level",
]


@dataclass
class Document:
    """A parsed YAML file: its data, the line of each key path, its bytes."""

    path: Path
    data: Any  # the YAML subset's value: mappings, lists, strings, numbers, booleans, null
    lines: dict[KeyPath, int]
    raw: bytes

    def line(self, keypath: KeyPath) -> int | None:
        """The line of ``keypath``, else of the nearest key path above it that has one."""
        while keypath:
            if keypath in self.lines:
                return self.lines[keypath]
            keypath = keypath[:-1]
        return self.lines.get((), 1)

    def error(self, keypath: KeyPath, message: str) -> InputError:
        """The :class:`InputError` of ``message`` at ``keypath`` (the file, the key, its line)."""
        return InputError(message, file=str(self.path), key=dotted(keypath), line=self.line(keypath))


def dotted(keypath: KeyPath) -> str:
    """``studies[0].seeds``: a key path as an error names it."""
    out = ""
    for k in keypath:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "<top level>"


#: A left-out key's origin: it takes the default, and every record names the key under
#: ``protocol.defaults`` (:func:`named_defaults`; docs/your-change.md, "A minimal protocol").
NAMED = "named"
#: A left-out key's origin: it takes the default, which records do not name (it was the rule before
#: left-out keys were named, so naming it now would change the records' format).
FIXED = "fixed"
#: A left-out key's origin: it takes the protocol's value of the same key (a study's interval level).
PROTOCOL = "protocol"


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its expected type(s), whether required, a default, a check, and where a
    left-out key's value comes from (``origin``: :data:`NAMED`, :data:`FIXED`, :data:`PROTOCOL`,
    or ``""``: None, the feature it declares is off)."""

    types: type | tuple[type, ...]
    required: bool = True
    default: object = None
    check: Callable[[Any], str | None] | None = None  # called on a value of ``types``
    origin: str = ""


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _typed(doc: Document, v: object, field: Field, where: KeyPath) -> object:
    """``v`` checked against ``field``'s types (an int where a float is expected read as a float;
    a float must be finite), then its check."""
    key = where[-1]
    types = field.types if isinstance(field.types, tuple) else (field.types,)
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if float in types and isinstance(v, int) and not isinstance(v, bool):
        ok = True
        try:
            v = float(v)
        except OverflowError:
            raise doc.error(where, f"{key!r} must be a finite number, got {str(v)[:24]}...") from None
    if float in types and isinstance(v, float) and not math.isfinite(v):
        raise doc.error(where, f"{key!r} must be a finite number, got {v!r}")
    if not ok:
        raise doc.error(where, f"{key!r} must be {_type_name(field.types)}, got {type(v).__name__} {v!r}")
    if field.check is not None:
        problem = field.check(v)
        if problem:
            raise doc.error(where, f"{key!r}: {problem}")
    return v


def mapping(doc: Document, value: object, keypath: KeyPath, schema: dict[str, Field]) -> dict[str, Any]:
    """Validate ``value`` as a mapping against ``schema``; unknown keys are errors, a left-out key
    takes its field's default."""
    if not isinstance(value, dict):
        raise doc.error(keypath, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise doc.error(keypath + (key,), f"unknown key {key!r} (known keys: {known})")
    out: dict[str, Any] = {}
    for key, field in schema.items():
        if key not in value:
            if field.required:
                raise doc.error(keypath, f"missing required key {key!r}")
            out[key] = field.default
            continue
        out[key] = _typed(doc, value[key], field, keypath + (key,))
    return out


def positive(v: object) -> str | None:
    """The check of a positive number (its type checked before)."""
    return None if isinstance(v, (int, float)) and v > 0 else "must be positive"


def non_negative(v: object) -> str | None:
    """The check of a number at least 0 (its type checked before)."""
    return None if isinstance(v, (int, float)) and v >= 0 else "must be non-negative"


def one_of(*choices: object) -> Callable[[object], str | None]:
    """The check of a value among ``choices``."""

    def check(v: object) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(str, choices))}"

    return check


#: Protocol, study and hypothesis ids: letters, digits, - and _ (\Z: "$" would also match before a
#: final newline).
ID_RE = re.compile(r"^[A-Za-z0-9_-]+\Z")


def _ident(v: object) -> str | None:
    return None if isinstance(v, str) and ID_RE.match(v) else "letters, digits, - and _ only"


def two_sided_level(v: object) -> str | None:
    """The check of an ``interval_level`` key (the protocol's and a study's; its type checked before)."""
    return (
        None
        if isinstance(v, (int, float)) and 0.5 < v < 1
        else "must be a two-sided level between 0.5 and 1 (e.g. 0.99)"
    )


#: The top-level keys of a protocol, each once: its type, whether required, its default and where a
#: left-out key's value comes from. Defaults claim nothing a user did not write: no
#: preregistration, no hypothesis tested, the CPU, eager mode, the embedded corpus (no download; read
#: only by built-in arms). The budget has no safe default (it is the study's stop) and is required.
TOP: dict[str, Field] = {
    "id": Field(str, check=_ident),
    "version": Field(int, required=False, default=1, check=positive, origin=NAMED),
    "description": Field(str, required=False, default="", origin=NAMED),
    "preregistered": Field(bool, required=False, default=False, origin=NAMED),
    "corpus": Field((str, dict), required=False, default="pydoc-topics", origin=NAMED),
    "data_dir": Field(str, required=False),
    "device": Field(
        str, required=False, default="cpu", check=one_of("auto", "cpu", "cuda", "mps"), origin=NAMED
    ),
    "compile": Field(bool, required=False, default=False, origin=NAMED),
    "torch_version": Field(str, required=False),
    "threads": Field(int, required=False, check=positive),
    "launcher": Field(
        str, required=False, default="spawn", check=one_of("spawn", "forkserver"), origin=FIXED
    ),
    "budget_device_seconds": Field(float, check=positive),
    "interval_level": Field(float, required=False, default=0.95, check=two_sided_level, origin=NAMED),
    "hypotheses": Field(
        dict,
        required=False,
        default={"descriptive": "no hypotheses declared: intervals only, no decision (the default)"},
        origin=NAMED,
    ),
    "max_attempts": Field(int, required=False, default=1, check=positive, origin=FIXED),
    "order_seed": Field(int, required=False, default=0, origin=NAMED),
    "records_dir": Field(str, required=False),
    "origins": Field(dict, required=False),
    "calibration": Field(dict, required=False),
    "studies": Field(list),
    # in_order: each study's units after the one before; interleaved: every study's units in one
    # seeded random order, so the studies meet the same load (a calibration study's designs)
    "schedule": Field(
        str, required=False, default="in_order", check=one_of("in_order", "interleaved"), origin=FIXED
    ),
    # the calibration study whose planted effects measured the bias of this protocol's designs
    "design_calibration": Field(str, required=False),
    # the class of change the protocol measures, whose bias the calibration must know
    # (prereg/planted.py CLASSES; default cache-heavy: an optimizer or kernel change)
    "effect_class": Field(str, required=False, check=one_of(*sorted(set(CLASSES.values())))),
    # separate runs of the runner at different times or on different machines (prereg/replicates.py)
    "replicates": Field(dict, required=False),
}


def named_defaults() -> dict[str, object]:
    """The top-level keys whose left-out value every record names, and that value (:data:`NAMED`)."""
    return {k: f.default for k, f in TOP.items() if f.origin == NAMED}


def _design(v: object) -> str | None:
    return None if isinstance(v, str) and find_design(v) else f"must be one of {', '.join(design_names())}"


#: The keys of one entry of a protocol's ``studies``.
STUDY: dict[str, Field] = {
    "name": Field(str, check=_ident),
    "design": Field(str, check=_design),
    # lockstep: both arms of a pair in one process, alternating blocks of this many steps (ABBA)
    "block_steps": Field(int, required=False, check=positive),
    "description": Field(str, required=False, default="", origin=FIXED),
    "arms": Field((list, dict), required=False),  # a mapping: command arms
    "factors": Field(dict, required=False),
    "cells": Field(dict, required=False),
    "configs": Field(list),
    "seeds": Field((list, dict)),
    "steps": Field(int, check=positive),
    "val_every": Field(int, required=False, check=positive),
    "val_target_bpb": Field((float, dict), required=False),
    # a command study's metric (harness.commandarm): the name its scripts report, target, better
    "metric": Field(dict, required=False),
    "interval_level": Field(float, required=False, check=two_sided_level, origin=PROTOCOL),
    # a planted reference effect on the candidate arm of an A/A study (prereg/planted.py)
    "planted": Field(dict, required=False),
    # the first steps of every run, trained and timed but reported apart from the training clock
    "warmup_steps": Field(int, required=False, check=positive),
}

#: A study's ``seeds`` written as a count from a base.
SEEDS: dict[str, Field] = {"count": Field(int, check=positive), "base": Field(int)}

#: A valid family, over which :func:`_family_check` judges one key at a time by the core's rule.
_VALID_FAMILY = {"procedure": "holm", "family_alpha": 0.05, "min_pairs": 3}


def _family_check(key: str) -> Callable[[object], str | None]:
    """The core's rule (:func:`prereg.hypotheses.family_problems`) for one key of the family."""
    return lambda v: next((m for k, m in family_problems({**_VALID_FAMILY, key: v}) if k == key), None)


#: The keys of a protocol's ``hypotheses`` family (unless it says only ``descriptive``).
FAMILY: dict[str, Field] = {
    "procedure": Field(str, check=one_of(*CHOICES["procedure"])),
    "family_alpha": Field(float, check=_family_check("family_alpha")),
    "min_pairs": Field(int, check=_family_check("min_pairs")),
    "tests": Field(list),
    # a budget stop depends on run times: decide time endpoints after one only if preregistered
    "decide_time_after_budget_stop": Field(bool, required=False, default=False, origin=FIXED),
    # a group-sequential design: {looks: [n_1, ..., n_K], spending: ..., futility_z: ...}
    "sequential": Field(dict, required=False),
}

#: The keys of one hypothesis of the family's ``tests``.
TEST: dict[str, Field] = {
    "id": Field(str, check=_ident),
    "study": Field(str),
    "config": Field(str, required=False),  # left out: the study's one configuration
    "endpoint": Field(str, check=one_of(*CHOICES["endpoint"])),
    "estimand": Field(str, check=one_of(*CHOICES["estimand"])),
    "type": Field(str, check=one_of(*CHOICES["type"])),
    "margin": Field(float, required=False, default=0.0, origin=FIXED),
    "better": Field(str, check=one_of(*CHOICES["better"])),
    "censoring": Field(str, required=False, check=one_of(*CHOICES["censoring"])),
    "period_adjusted": Field(bool, required=False, default=False, origin=FIXED),
    # the rule: t (the mean; the default) or sign (the exact sign test of the median, for skewed data)
    "test": Field(str, required=False),  # its values: the core's rule_problems
    # restricted mean: the restriction time tau (s) for both arms; default, per pair, the shorter training time
    "restriction_s": Field(
        float,
        required=False,
        check=lambda v: (
            None
            if isinstance(v, (int, float)) and 0 < v < float("inf")
            else "a positive, finite time in seconds"
        ),
    ),
}

#: The keys of a protocol's ``calibration`` block (a calibration still pending, or done).
CALIBRATION: dict[str, Field] = {
    "status": Field(str, check=one_of("pending", "done")),
    "pilot": Field(str),
    "command": Field(str),
}


#: The keys of one command arm (a study of command arms' ``arms.baseline`` and ``arms.candidate``;
#: :func:`prereg.commands.command_arms` applies them and the arm's rules; the harness then finds its
#: working directory, its commit and its program, what needs the file system).
COMMAND_ARM: dict[str, Field] = {
    "command": Field(list),  # the argument list, no shell; placeholders (prereg.commands.PLACEHOLDERS)
    "cwd": Field(
        str, required=False, default=".", origin=FIXED
    ),  # inside the repository (or the ref's checkout)
    "env": Field(dict, required=False),  # added to the allow-listed environment (prereg.commands.env_problem)
    # the wall-clock limit of one run (a run past it is killed and failed)
    "timeout_s": Field(
        (int, float),
        check=lambda v: None if math.isfinite(v) and v > 0 else "a finite number of seconds above 0",
    ),
    "ref": Field(str, required=False),  # run in a clean checkout of that commit (its full id)
    "reporter": Field(
        bool, required=False, default=True, origin=FIXED
    ),  # false: metrics_regex reads its output
    "metrics_regex": Field(dict, required=False),
}


class _Arm(TypedDict):
    command: list[str]  # the argument list, placeholders unfilled
    cwd: str  # relative to the repository (or the ref's checkout)
    env: dict[str, str]
    timeout_s: float
    ref: str | None  # a full commit id, or None: the working tree
    reporter: bool


class CommandArm(_Arm, total=False):
    """One command arm as the typed protocol and every spec hold it (:data:`COMMAND_ARM`'s keys,
    defaults filled in: :func:`prereg.commands.arm_of`)."""

    metrics_regex: dict[str, str]  # an arm without the reporter: each metric's expression


#: The keys of a command study's ``metric``: the name its scripts report, the target its endpoints
#: ``time_to_target`` and ``final_metric`` read, and which way is better.
METRIC: dict[str, Field] = {
    "name": Field(str, check=lambda v: None if v.strip() else "a metric's name, not empty"),
    "target": Field((int, float), check=lambda v: None if math.isfinite(v) else "must be a finite number"),
    "better": Field(str, required=False, default="lower", check=one_of("lower", "higher"), origin=FIXED),
}


class Metric(TypedDict):
    """A command study's metric as the typed protocol holds it (:data:`METRIC`'s keys:
    :func:`prereg.commands.metric_of`)."""

    name: str
    target: float
    better: str  # "lower" or "higher"


#: The built-in corpora a protocol's ``corpus`` may name (else a local corpus of pinned files), and
#: the three splits every corpus has.
CORPORA = ("wikitext-2", "pydoc-topics")
SPLITS = ("train", "valid", "test")


def _corpus_name(v: object) -> str | None:
    ok = isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_-]+", v) and v not in CORPORA
    return None if ok else f"letters, digits, - and _ only, not {', '.join(CORPORA)}"


#: A local corpus of one file cut by fractions: ``{name, file: PIN, split: FRACTIONS}``
#: (:func:`prereg.corpora.corpus_of` reads it).
CORPUS_FILE: dict[str, Field] = {
    "name": Field(str, check=_corpus_name),
    "file": Field(dict),
    "split": Field(dict),
}
#: A local corpus of one file per split: ``{name, train: PIN, valid: PIN, test: PIN}``.
CORPUS_SPLITS: dict[str, Field] = {"name": Field(str, check=_corpus_name), **{s: Field(dict) for s in SPLITS}}
#: A local corpus file's pin: its path (relative to the study's root, or absolute), bytes and sha256.
PIN: dict[str, Field] = {
    "path": Field(str),
    "size": Field(int, check=lambda v: None if v > 0 else "a positive byte count"),
    "sha256": Field(
        str, check=lambda v: None if re.fullmatch(r"[0-9a-f]{64}", v) else "64 lowercase hex digits"
    ),
}
#: The fractions of one file that make each split (exact decimals summing to 1).
FRACTIONS: dict[str, Field] = {
    s: Field(float, check=lambda v: None if 0 < v < 1 else "a fraction in (0, 1)") for s in SPLITS
}


class Pin(TypedDict):
    """A file's pin: its path, byte count and sha256 (:data:`PIN`'s keys)."""

    path: str
    size: int
    sha256: str


class _CorpusName(TypedDict):
    name: str


class CorpusFiles(_CorpusName, total=False):
    """A local corpus as the typed protocol and a job carry it (:func:`prereg.corpora.corpus_of`):
    one ``file`` cut by ``split``'s fractions, or one file per split."""

    file: Pin
    train: Pin
    valid: Pin
    test: Pin
    split: dict[str, float]
