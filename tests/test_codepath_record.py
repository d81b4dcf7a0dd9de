"""What a run records of the variables that choose the method's path where a caller leaves it open
(``COTANGENT_MODE``, :data:`harness.codepath.RECORDED`): a run under another mode says so in its
record's ``env.code_path_env``; a run with none set records nothing new."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import init_study, record_dicts, tiny_protocol

from cotangent.modes import ENV
from harness.codepath import CODE_PATH, RECORDED, recorded_environment
from harness.execute import commands
from harness.execute.inprocess import InProcessExecutor
from harness.execute.runner import Runner
from harness.protocol import load_protocol


def test_the_method_s_mode_variable_is_recorded_not_refused():
    assert ENV in RECORDED and ENV not in CODE_PATH  # the study's arms name their mode
    assert recorded_environment({ENV: "native", "PATH": "/bin"}) == {ENV: "native"}
    assert recorded_environment({"PATH": "/bin"}) == {}


def test_a_command_arm_s_mode_is_in_its_record():
    """A command arm whose ``env`` sets the mode: the record's env names it; without it, no key."""
    spec = SimpleNamespace(device="cpu", threads=1, command={"env": {ENV: "native", "X": "1"}})
    assert commands.env_facts(spec)["code_path_env"] == {ENV: "native"}
    spec.command = {"env": {"X": "1"}}
    assert "code_path_env" not in commands.env_facts(spec)


@pytest.mark.parametrize("mode", ["native", None])
def test_a_run_under_another_mode_is_visible_in_its_record(tmp_path, monkeypatch, mode):
    """The in-process executor trains in this process: the mode it saw set is in every record."""
    if mode is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, mode)
    repo = init_study(tmp_path / "study", protocol=tiny_protocol(steps=6))
    end = Runner(
        load_protocol(repo / "protocols" / "tiny.yaml"), echo=lambda _: None, executor=InProcessExecutor()
    ).run()
    assert end.left == 0 and end.failed == 0
    recs = record_dicts(repo / "records" / "tiny")
    assert recs and all(r["status"] == "ok" for r in recs)
    for r in recs:
        if mode is None:
            assert "code_path_env" not in r["env"]
        else:
            assert r["env"]["code_path_env"] == {ENV: mode}
