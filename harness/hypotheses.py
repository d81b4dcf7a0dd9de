"""The ``hypotheses`` block of a protocol: a multiplicity family of preregistered tests (schema and
validation; :func:`harness.protocol.load_protocol` calls it; docs/decisions.md says what each key means)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness import yamlio
from harness.names import ID_RE
from harness.yamlio import Field, one_of

if TYPE_CHECKING:
    from harness.study import Study

ENDPOINTS = ("training_time", "training_cpu_time", "time_to_target", "total_time", "test_bpb", "peak_memory")
_FAMILY = {
    "procedure": Field(str, check=one_of("holm", "fixed_sequence")),
    "family_alpha": Field(
        float, check=lambda v: None if 0 < v < 0.5 else "a one-sided family-wise error rate in (0, 0.5)"
    ),
    "min_pairs": Field(int, check=lambda v: None if v >= 3 else "at least 3 (an interval needs a spread)"),
    "tests": Field(list),
    # a budget stop depends on run times: decide time endpoints after one only if preregistered
    "decide_time_after_budget_stop": Field(bool, required=False, default=False),
}
_TEST = {
    "id": Field(str, check=lambda v: None if ID_RE.match(v) else "letters, digits, - and _ only"),
    "study": Field(str),
    "config": Field(str, required=False, default=None),
    "endpoint": Field(str, check=one_of(*ENDPOINTS)),
    "estimand": Field(str, check=one_of("difference", "relative_reduction", "log_ratio")),
    "type": Field(str, check=one_of("superiority", "non_inferiority", "equivalence")),
    "margin": Field(float, required=False, default=0.0),
    "better": Field(str, check=one_of("lower", "higher")),
    "censoring": Field(str, required=False, default=None, check=one_of("worst_rank", "restricted_mean")),
    "period_adjusted": Field(bool, required=False, default=False),
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
        if st is None or st.design != "paired":
            raise doc.error(tk + ("study",), f"{h['study']!r} is not a paired study of this protocol")
        if h["config"] is None:
            if len(st.configs) != 1:
                raise doc.error(tk, f"study {st.name!r} has several configurations: name one under 'config'")
            h["config"] = st.configs[0]
        elif h["config"] not in st.configs:
            raise doc.error(tk + ("config",), f"{h['config']!r} is not a configuration of study {st.name!r}")
        if h["type"] == "superiority" and h["margin"] < 0:
            raise doc.error(tk + ("margin",), "a superiority margin is >= 0")
        if h["type"] != "superiority" and h["margin"] <= 0:
            raise doc.error(tk + ("margin",), f"a {h['type']} hypothesis needs a positive margin")
        if h["endpoint"] == "time_to_target":
            if h["censoring"] is None:
                raise doc.error(
                    tk,
                    "a time_to_target hypothesis must say how an unreached target counts: "
                    "censoring: worst_rank or restricted_mean",
                )
            if h["censoring"] == "worst_rank" and (
                h["type"] != "superiority" or h["margin"] != 0 or h["period_adjusted"]
            ):
                raise doc.error(
                    tk + ("censoring",), "worst_rank is a rank test: superiority with margin 0 only"
                )
        elif h["censoring"] is not None:
            raise doc.error(tk + ("censoring",), "censoring applies to time_to_target only")
        if h["restriction_s"] is not None and h["censoring"] != "restricted_mean":
            raise doc.error(
                tk + ("restriction_s",), "restriction_s is the restriction time of censoring: restricted_mean"
            )
        if h["estimand"] == "relative_reduction" and h["margin"] >= 100:
            raise doc.error(tk + ("margin",), "a relative_reduction margin is a percentage below 100")
        if h["estimand"] != "difference" and h["endpoint"] == "test_bpb":
            raise doc.error(tk + ("estimand",), "test_bpb is compared as a difference (BPB)")
        tests.append(h)
    return {**fam, "tests": tests}
