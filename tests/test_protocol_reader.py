"""One reader of protocols, in the core (``prereg/protocol/``): the YAML subset reader keeps every
key's line as PyYAML's composer marks it (the native component), the harness and the audit read a
protocol into the same typed ``Protocol``, every key is declared once (its type, default and origin),
and what the reader does not read is refused naming the file and the line, nothing written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, harness, init_study, tiny_protocol
from hypothesis import HealthCheck, given, settings
from test_audit_yaml import DUMPS

from prereg.plan import PROTOCOL_DEFAULTS
from prereg.protocol import model
from prereg.protocol.read import protocol_from_text
from prereg.protocol.schema import NAMED, PROTOCOL, STUDY, TOP
from prereg.yamlflow import YamlError
from prereg.yamlsub import yaml_lines

SHIPPED = sorted([*(ROOT / "protocols").glob("*.yaml"), *(ROOT / "examples").glob("*.yaml")])


def pyyaml_lines(text: str) -> dict[tuple, int]:
    """Each key path's line as PyYAML's composer marks it: a mapping key's line, a sequence item's."""
    out: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = yaml.safe_load(yaml.serialize(k))
                out[path + (key,)] = k.start_mark.line + 1
                walk(v, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out[path + (i,)] = item.start_mark.line + 1
                walk(item, path + (i,))

    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is not None:
        walk(node, ())
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(*DUMPS)
def test_each_key_s_line_is_the_one_pyyaml_marks(doc, flow, width, unicode, style):
    """Every key path the reader reads (block and flow, over several lines) has PyYAML's line."""
    out = yaml.safe_dump(
        doc, default_flow_style=flow, width=width, allow_unicode=unicode, default_style=style, sort_keys=False
    )
    try:
        _, lines = yaml_lines(out)
    except YamlError:
        return  # a form the reader refuses (tags, complex keys, odd line breaks): test_audit_yaml's
    theirs = pyyaml_lines(out)
    for path, line in theirs.items():
        assert lines.get(path) == line, (path, out)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_harness_and_audit_read_every_shipped_protocol_into_the_same_typed_protocol(path: Path):
    """The harness's protocol is the core's typed protocol of the file's bytes, which the audit
    reads from the tag: one reading, not two compared; each study's level and ``block_steps`` read
    from it."""
    from harness.protocol import load_protocol

    proto = load_protocol(path)
    spec = protocol_from_text(path.read_bytes(), path)
    assert proto.spec == spec
    for mine, st in zip(proto.studies, spec.studies, strict=True):
        assert mine.interval_level == st.interval_level
        assert mine.block_steps == st.block_steps and (st.block_steps is not None) == st.design.shares_process


def test_every_key_is_declared_once_with_its_default_and_origin():
    """The typed model has a field for each top-level key and each study key of the schema; the
    named defaults (what every record lists under ``defaults``) are the schema's, and a study's
    level is the protocol's where it sets none."""
    fields = {f.name for f in dataclasses.fields(model.Protocol)}
    assert set(TOP) == fields - {"defaults"}
    assert set(STUDY) == {f.name for f in dataclasses.fields(model.Study)}
    assert PROTOCOL_DEFAULTS == {k: f.default for k, f in TOP.items() if f.origin == NAMED}
    assert STUDY["interval_level"].origin == PROTOCOL
    text = tiny_protocol().replace("interval_level: 0.9\n", "")
    spec = protocol_from_text(text.encode(), "tiny.yaml")
    assert spec.interval_level == PROTOCOL_DEFAULTS["interval_level"] == spec.studies[0].interval_level
    assert "interval_level" in spec.defaults


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("note: !!str 5\n", "not read"),
        ("note: 2001-01-01\n", "not read"),
        ('origins: {a: &n "x", b: *n}\n', "anchors (&) and aliases (*) are not allowed"),
        ("order_seed: 2\n", "duplicate key 'order_seed': write each key once"),
    ],
)
def test_what_the_reader_does_not_read_is_refused_naming_file_and_line(tmp_path: Path, line: str, says: str):
    """``harness plan`` refuses a protocol outside the subset with one line naming the file and the
    line (the audit reads no other form), exit 2, nothing written."""
    text = tiny_protocol().replace("order_seed: 1\n", "order_seed: 1\n" + line)
    repo = init_study(tmp_path / "study", protocol=text)
    n = text.splitlines().index(line.rstrip("\n")) + 1
    r = harness(repo, "plan", "protocols/tiny.yaml")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"protocols/tiny.yaml:{n}: " in r.stderr and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (repo / "runs").exists() and not (repo / "records").exists()
