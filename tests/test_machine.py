"""One home for this machine's CPU model (``harness/machine.py``): a command arm's record names the
CPU as a built-in arm's does, so a calibration's records and a study's compare by one name."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from conftest import ROOT

from harness.devices import device_name
from harness.execute.commands import env_facts
from harness.machine import cpu_model


def test_a_command_record_names_the_cpu_as_a_built_in_record_does():
    """The code before this wrote ``platform.processor()`` (``x86_64`` here) for a command arm."""
    facts = env_facts(SimpleNamespace(device="cpu", threads=1, command=None))  # type: ignore[arg-type]
    assert facts["device_name"] == cpu_model() == device_name(torch.device("cpu"))


def test_the_cpu_model_is_read_in_one_place():
    found = [
        str(p.relative_to(ROOT))
        for pkg in ("prereg", "audit", "analysis", "harness", "cotangent")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "platform.processor()" in p.read_text()
    ]
    assert found == ["harness/machine.py"]
