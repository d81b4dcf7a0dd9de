"""The ``hypotheses`` block of a protocol: a multiplicity family of preregistered tests (schema and
validation; :func:`harness.protocol.load_protocol` calls it; docs/decisions.md says what each key means)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness import yamlio
from harness.names import ID_RE
from harness.yamlio import Field, one_of
from prereg.hypotheses import CHOICES, family_problems, rule_problems
from prereg.sequential import looks_problems

if TYPE_CHECKING:
    from harness.study import Study

#: A valid family, over which :func:`_family_check` judges one key at a time by the core's rule.
_VALID_FAMILY = {"procedure": "holm", "family_alpha": 0.05, "min_pairs": 3}


def _family_check(key: str) -> Any:
    """The core's rule (:func:`prereg.hypotheses.family_problems`) for one key of the family."""
    return lambda v: next((m for k, m in family_problems({**_VALID_FAMILY, key: v}) if k == key), None)


_FAMILY = {
    "procedure": Field(str, check=one_of(*CHOICES["procedure"])),
    "family_alpha": Field(float, check=_family_check("family_alpha")),
    "min_pairs": Field(int, check=_family_check("min_pairs")),
    "tests": Field(list),
    # a budget stop depends on run times: decide time endpoints after one only if preregistered
    "decide_time_after_budget_stop": Field(bool, required=False, default=False),
    # a group-sequential design: {looks: [n_1, ..., n_K], spending: ..., futility_z: ...}
    "sequential": Field(dict, required=False, default=None),
}
_TEST = {
    "id": Field(str, check=lambda v: None if ID_RE.match(v) else "letters, digits, - and _ only"),
    "study": Field(str),
    "config": Field(str, required=False, default=None),
    "endpoint": Field(str, check=one_of(*CHOICES["endpoint"])),
    "estimand": Field(str, check=one_of(*CHOICES["estimand"])),
    "type": Field(str, check=one_of(*CHOICES["type"])),
    "margin": Field(float, required=False, default=0.0),
    "better": Field(str, check=one_of(*CHOICES["better"])),
    "censoring": Field(str, required=False, default=None, check=one_of(*CHOICES["censoring"])),
    "period_adjusted": Field(bool, required=False, default=False),
    # the rule: t (the mean; the default) or sign (the exact sign test of the median, for skewed data)
    "test": Field(str, required=False, default=None),  # its values: the core's rule_problems
    # restricted mean: the restriction time tau (s) for both arms; default, per pair, the shorter training time
    "restriction_s": Field(
        float,
        required=False,
        default=None,
        check=lambda v: None if 0 < v < float("inf") else "a positive, finite time in seconds",
    ),
}


def parse_hypotheses(doc: yamlio.Document, raw: dict[str, Any], studies: list[Study]) -> dict[str, Any]:
    """The validated ``hypotheses`` block: a descriptive reason, or the family and its tests, each test
    resolved to its study's paired configuration."""
    kp: tuple[Any, ...] = ("hypotheses",)
    if "descriptive" in raw:
        if (
            set(raw) != {"descriptive"}
            or not isinstance(raw["descriptive"], str)
            or not raw["descriptive"].strip()
        ):
            raise doc.error(kp, 'a descriptive protocol says only why: hypotheses: {descriptive: "<reason>"}')
        return {"descriptive": raw["descriptive"]}
    fam = yamlio.mapping(doc, raw, kp, _FAMILY)
    if not fam["tests"]:
        raise doc.error(
            kp + ("tests",), "list at least one hypothesis, or say hypotheses: {descriptive: ...}"
        )
    by_name = {s.name: s for s in studies}
    tests, ids = [], set()
    for i, t in enumerate(fam["tests"]):
        tk = kp + ("tests", i)
        h = yamlio.mapping(doc, t, tk, _TEST)
        if h["id"] in ids:
            raise doc.error(tk + ("id",), f"duplicate hypothesis id {h['id']!r}")
        ids.add(h["id"])
        st = by_name.get(h["study"])
        if st is None or not st.kind.pairwise:
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
        wrong = rule_problems(h)  # the core's rules, which the audit and decide apply to the tag's
        if wrong:
            key, message = wrong[0]
            raise doc.error(tk + ((key,) if key in t else ()), message)
        if h["test"] is None:
            del h["test"]  # records of protocols that do not declare it stay as they were
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
