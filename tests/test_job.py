"""The job crosses the process boundary as JSON and comes back as the same typed object; a worker
refuses a job of another format or with fields it does not know, and reports why (the run is recorded
as failed, naming it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from harness.execute.job import JOB_FORMAT, Job, JobFormatError
from harness.plan import make_plan
from harness.protocol import load_protocol


@pytest.fixture(scope="module")
def job() -> Job:
    spec = make_plan(load_protocol(ROOT / "protocols" / "demo.yaml"))[0]
    return Job(
        spec=spec,
        attempt=2,
        config_path="configs/tiny_transformer.yaml",
        data_dir=None,
        corpus=None,
        checkpoint_path="runs/x/checkpoints/a.safetensors",
    )


def test_round_trip_through_json(job):
    back = Job.from_json(json.loads(json.dumps(job.to_json())))
    assert back == job and back.spec == job.spec and back.to_json()["format"] == JOB_FORMAT


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: d.update(format=2), "job format 2; this worker reads format 1"),
        (lambda d: d.update(extra=1), "job: unknown fields extra"),
        (lambda d: d["spec"].pop("seed"), "job spec: missing seed"),
        (lambda d: d["spec"].update(gpu=True), "job spec: unknown fields gpu"),
    ],
)
def test_other_formats_are_refused_naming_the_field(job, change, says):
    data = job.to_json()
    change(data)
    with pytest.raises(JobFormatError, match=says):
        Job.from_json(data)


def test_a_worker_reports_a_job_it_cannot_read(job, tmp_path):
    data = job.to_json()
    data["format"] = 9
    (tmp_path / "job.json").write_text(json.dumps(data))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.execute.worker",
            str(tmp_path / "job.json"),
            str(tmp_path / "result.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert r.returncode == 3 and result["status"] == "failed"
    assert result["reason"] == "JobFormatError: job format 9; this worker reads format 1"
