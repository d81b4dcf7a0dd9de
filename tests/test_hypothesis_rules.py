"""One home for the hypothesis rules: ``harness plan`` (the protocol parser), the audit's reader of the
tagged protocol and ``decide`` refuse the same hypotheses with the same words, on hypotheses drawn at
random over every key's values (not a hand-picked list). In process, no torch, no subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_protocol
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.protocol import load_protocol
from prereg.attempts import Completeness
from prereg.decisions import decide
from prereg.errors import InputError
from prereg.hypotheses import rule_problems
from prereg.plan import expected_summary
from prereg.protocol.read import protocol_from_text

#: The tiny protocol's one hypothesis, as it writes it (replaced by each drawn hypothesis).
HEAD = tiny_protocol().split("  tests:\n", 1)[1].split("order_seed:", 1)[0]

hypotheses = st.fixed_dictionaries(
    {
        "endpoint": st.sampled_from(["training_time", "time_to_target", "test_bpb", "total_time"]),
        "estimand": st.sampled_from(["difference", "relative_reduction", "log_ratio"]),
        "type": st.sampled_from(["superiority", "non_inferiority", "equivalence"]),
        "margin": st.sampled_from([-0.5, 0.0, 0.5, 2.0, 100.0]),
        "better": st.sampled_from(["lower", "higher"]),
    },
    optional={
        "censoring": st.sampled_from(["worst_rank", "restricted_mean"]),
        "period_adjusted": st.booleans(),
        "restriction_s": st.sampled_from([1.5]),
        "test": st.sampled_from(["t", "sign", "wilcoxon"]),
    },
)


def as_yaml(h: dict) -> str:
    lines = ["    - id: H1", "      study: pairs"]
    for k, v in h.items():
        lines.append(f"      {k}: {str(v).lower() if isinstance(v, bool) else v}")
    return "\n".join(lines) + "\n"


def written(folder: Path, h: dict) -> Path:
    text = tiny_protocol()
    assert HEAD in text
    (folder / "protocols").mkdir(parents=True, exist_ok=True)
    p = folder / "protocols" / "tiny.yaml"
    p.write_text(text.replace(HEAD, as_yaml(h)))
    return p


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    from conftest import ROOT

    f = tmp_path_factory.mktemp("rules")
    shutil.copytree(ROOT / "configs", f / "configs")
    return f


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(h=hypotheses)
def test_the_parser_the_audit_and_decide_refuse_the_same_hypotheses(folder, h):
    wrong = rule_problems({"id": "H1", **h})
    p = written(folder, h)
    raw = p.read_bytes()
    if not wrong:
        load_protocol(p)  # accepted
        summary = expected_summary(protocol_from_text(raw, p), "0" * 64, "protocols/tiny.yaml")
        assert summary["hypotheses"]["tests"][0]["type"] == h["type"]
        return
    key, message = wrong[0]
    with pytest.raises(InputError) as e:
        load_protocol(p)
    assert message in str(e.value) and str(p) in str(e.value)
    with pytest.raises(InputError) as audit:  # the audit reads the tagged file with the one reader
        protocol_from_text(raw, p)
    assert str(audit.value) == str(e.value) and "hypotheses.tests[0]" in str(e.value)
    family = {
        "procedure": "holm",
        "family_alpha": 0.05,
        "min_pairs": 3,
        "tests": [{"id": "H1", "study": "pairs", "config": "tiny_conv", **h}],
    }
    with pytest.raises(ValueError, match="hypothesis 'H1'"):
        decide(family, {}, Completeness(4, 4, 0, True, False, "complete"))


@pytest.mark.parametrize(
    ("h", "says"),
    [
        # the attacks of the statistician's review: each was tested as one-sided superiority at margin 0
        (
            {"endpoint": "time_to_target", "censoring": "worst_rank", "type": "equivalence", "margin": 5.0},
            "worst_rank is a rank test",
        ),
        (
            {
                "endpoint": "time_to_target",
                "censoring": "worst_rank",
                "type": "non_inferiority",
                "margin": 5.0,
            },
            "worst_rank is a rank test",
        ),
        (
            {"endpoint": "time_to_target", "censoring": "worst_rank", "type": "superiority", "margin": 1.0},
            "worst_rank is a rank test",
        ),
        (
            {"endpoint": "training_time", "type": "superiority", "margin": -5.0},
            "a superiority margin is >= 0",
        ),
    ],
)
def test_the_reviewers_invalid_hypotheses_are_refused_by_decide_and_the_audit(folder, h, says):
    full = {"estimand": "relative_reduction", "better": "lower", **h}
    assert rule_problems({"id": "H1", **full})[0][1].startswith(says)
    family = {
        "procedure": "holm",
        "family_alpha": 0.05,
        "min_pairs": 3,
        "tests": [{"id": "H1", "study": "pairs", "config": "tiny_conv", **full}],
    }
    with pytest.raises(ValueError, match=says):
        decide(family, {}, Completeness(4, 4, 0, True, False, "complete"))
    with pytest.raises(ValueError, match=says):
        protocol_from_text(written(folder, full).read_bytes(), "protocols/tiny.yaml")
