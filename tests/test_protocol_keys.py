"""Every key of a protocol declared once, in the core (issue 60): a command arm's, its metric's and a
local corpus's keys are the core schema's, so the core's reader alone (the public audit's, standard
library only) refuses a bad one naming the file, the key and the line; the harness keeps only what
needs the file system, declares no key table of its own, and reads each key from the core's typed
protocol rather than naming it again."""

from __future__ import annotations

import inspect

import pytest
from conftest import tiny_protocol
from test_command_arms import GOOD_ARM, PROTOCOL

import harness.commandarm
import harness.data.corpora
import harness.protocol
import harness.study
import prereg.protocol.schema as schema
from prereg.errors import InputError
from prereg.protocol.read import protocol_from_text
from prereg.protocol.schema import COMMAND_ARM, METRIC, PIN, STUDY, TOP, Field

SHA = "a" * 64
PIN_TEXT = f"{{path: data.txt, size: 10, sha256: {SHA}}}"


def _command_text(baseline: str = GOOD_ARM, metric: str = "{name: val_loss, target: 2.0}") -> str:
    text = PROTOCOL.format(baseline=baseline, endpoint="training_time")
    return text.replace("metric: {name: val_loss, target: 2.0}", f"metric: {metric}")


def _corpus_text(corpus: str) -> str:
    return tiny_protocol(corpus=corpus)


def _line_of(text: str, words: str) -> int:
    """The 1-based line of ``text`` that holds ``words`` (the line an error must name)."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if words in line)


@pytest.mark.parametrize(
    ("text", "key", "at", "says"),
    [
        (_command_text('"python train.py"'), "studies[0].arms.baseline", "baseline:", "shell string"),
        (
            _command_text('{command: [python, "{sed}"], timeout_s: 9}'),
            "studies[0].arms.baseline.command[1]",
            "baseline:",
            "unknown placeholder {sed}",
        ),
        (
            _command_text("{command: [python, train.py]}"),
            "studies[0].arms.baseline",
            "baseline:",
            "timeout_s",
        ),
        (
            _command_text("{command: [python, train.py], timeout_s: 9, cwd: /tmp}"),
            "studies[0].arms.baseline.cwd",
            "baseline:",
            "relative path",
        ),
        (
            _command_text("{command: [python, train.py], timeout_s: 9, ref: main}"),
            "studies[0].arms.baseline.ref",
            "baseline:",
            "not a full commit id",
        ),
        (
            _command_text("{command: [python, train.py], timeout_s: 9, env: {OMP_NUM_THREADS: '4'}}"),
            "studies[0].arms.baseline.env.OMP_NUM_THREADS",
            "baseline:",
            "the harness's to set",
        ),
        (
            _command_text("{command: [python, train.py], timeout_s: 9, env: {PATH: /x}}"),
            "studies[0].arms.baseline.env.PATH",
            "baseline:",
            "not on the allow-list",
        ),
        (
            _command_text("{command: [python, train.py], timeout_s: 9, shell: true}"),
            "studies[0].arms.baseline.shell",
            "baseline:",
            "unknown key 'shell'",
        ),
        (
            _command_text(metric="{name: val_loss, target: 2.0, better: sideways}"),
            "studies[0].metric.better",
            "metric:",
            "must be one of lower, higher",
        ),
        (_corpus_text("wikitext-3"), "corpus", "corpus:", "unknown corpus 'wikitext-3'"),
        (
            _corpus_text(f"{{name: mine, file: {PIN_TEXT}, split: {{train: 0.9, valid: 0.05, test: 0.1}}}}"),
            "corpus.split",
            "corpus:",
            "the fractions sum to",
        ),
        (
            _corpus_text(
                "{name: mine, file: {path: d.txt, size: 10, sha256: abc}, split: {train: 0.9, valid: 0.05, test: 0.05}}"
            ),
            "corpus.file.sha256",
            "corpus:",
            "64 lowercase hex digits",
        ),
        (
            _corpus_text(f"{{name: pydoc-topics, train: {PIN_TEXT}, valid: {PIN_TEXT}, test: {PIN_TEXT}}}"),
            "corpus.name",
            "corpus:",
            "not wikitext-2, pydoc-topics",
        ),
        (
            _corpus_text(f"{{name: mine, file: {PIN_TEXT}}}"),
            "corpus",
            "corpus:",
            "missing required key 'split'",
        ),
    ],
)
def test_the_core_reader_alone_refuses_a_bad_command_arm_metric_or_corpus(text, key, at, says):
    """The core's reader (what the audit runs on a bare Python), with no harness and no file system
    behind it, refuses each, naming the file, the key and its line; before, the core took a command
    arm, a metric and a local corpus as they came and left them to the harness."""
    with pytest.raises(InputError) as e:
        protocol_from_text(text.encode(), "p.yaml")
    assert e.value.file == "p.yaml" and e.value.key == key, str(e.value)
    assert e.value.line == _line_of(text, at), str(e.value)
    assert says in e.value.message, e.value.message


def test_the_core_types_command_arms_metric_and_corpus_with_their_defaults():
    """What the core reads is typed with the schema's defaults: each arm as every spec holds it, the
    metric's ``better``, a local corpus's pins and fractions."""
    spec = protocol_from_text(_command_text().encode(), "p.yaml")
    st = spec.studies[0]
    assert st.arms["baseline"] == {
        "command": ["python", "train.py", "--seed", "{seed}", "--out", "{out}"],
        "cwd": COMMAND_ARM["cwd"].default,
        "env": {},
        "timeout_s": 60.0,
        "ref": None,
        "reporter": COMMAND_ARM["reporter"].default,
    }
    assert st.metric == {"name": "val_loss", "target": 2.0, "better": METRIC["better"].default}
    text = _corpus_text(f"{{name: mine, file: {PIN_TEXT}, split: {{train: 0.9, valid: 0.05, test: 0.05}}}}")
    corpus = protocol_from_text(text.encode(), "p.yaml").corpus
    assert corpus == {
        "name": "mine",
        "file": {"path": "data.txt", "size": 10, "sha256": SHA},
        "split": {"train": 0.9, "valid": 0.05, "test": 0.05},
    }
    assert set(PIN) == set(corpus["file"])


def test_the_harness_declares_no_key_and_reads_each_from_the_core():
    """No module of the harness that resolves a protocol holds a table of keys (a mapping of
    :class:`Field`), and the harness's ``Protocol`` names none of the file's keys again: it reads
    them from the core's typed protocol (``proto.spec``)."""
    for module in (harness.commandarm, harness.data.corpora, harness.study, harness.protocol):
        tables = [
            name
            for name, value in vars(module).items()
            if isinstance(value, dict)
            and value
            and all(isinstance(f, Field) for f in value.values())
            and value is not getattr(schema, name, None)  # the core's own table, imported
        ]
        assert tables == [], (module.__name__, tables)
        assert "Field(" not in inspect.getsource(module), module.__name__
    props = {n for n, v in vars(harness.protocol.Protocol).items() if isinstance(v, property)}
    assert not props & (set(TOP) | set(STUDY) | {"tag_name"}), props & set(TOP)
