"""A Ray node's shipped working directory against the driver's (``harness/execute/ray_node.py``),
without a Ray cluster (issue 59, case 11): the driver's tree from a real git repository, a node's
copy of it changed as a node with stale or edited files would hold it, and the workers'
environment built on the node."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.execute.ray import EXCLUDES
from harness.execute.ray_node import driver_tree, node_env, shipped_problems
from prereg.errors import RefusedError


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    r = tmp_path / "driver"
    for rel, text in {
        "arms/fast.py": "def build(ctx):\n    return None\n",
        "configs/tiny.yaml": "d_model: 8\n",
        "data/corpus.txt": "the corpus, sent apart\n",
        "records/x.record.json": "{}\n",
        "docs/notes.md": "exempt\n",
    }.items():
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(text)
    _git(r, "init", "-q")
    _git(r, "-c", "user.email=t@e.invalid", "-c", "user.name=T", "add", "-A")
    _git(r, "-c", "user.email=t@e.invalid", "-c", "user.name=T", "commit", "-qm", "study")
    return r


def test_a_node_whose_shipped_files_differ_from_the_drivers_is_refused_each_named(driver, tmp_path):
    (driver / "arms" / "new.py").write_text("X = 1\n")  # new, not yet committed: Ray ships it too
    (driver / ".gitignore").write_text("*.log\n")
    (driver / "arms" / "train.log").write_text("ignored: Ray does not ship it\n")
    tree = driver_tree(driver, EXCLUDES + ["/data/corpus.txt"])
    # what Ray ships of the frozen entries; not records, docs, the corpus sent apart, ignored files
    assert set(tree) == {"arms/fast.py", "arms/new.py", "configs/tiny.yaml"}
    node = tmp_path / "node"
    shutil.copytree(driver, node, ignore=shutil.ignore_patterns(".git"))
    assert shipped_problems(tree, node, "n1") == []
    (node / "configs" / "tiny.yaml").write_text("d_model: 16\n")  # a stale or edited configuration
    (node / "arms" / "evil.py").write_text("import os\n")  # a source the driver never shipped
    (node / "arms" / "fast.py").unlink()
    found = shipped_problems(tree, node, "n1")
    assert found == [
        "node n1: arms/fast.py is missing from the shipped working directory",
        "node n1: configs/tiny.yaml differs from the driver's (its sha256 is not the frozen file's)",
        "node n1: arms/evil.py is a source the driver did not ship",
    ]
    with pytest.raises(RefusedError, match="configs/tiny.yaml differs"):
        node_env({"tree": tree, "threads": 1}, node, "n1")


def test_the_nodes_workers_verify_the_frozen_sources_as_local_workers_do(driver, tmp_path):
    """Each import of a frozen entry's module on the node is checked against the hashes read there
    (``HARNESS_SOURCES`` covers ``arms/``), not only the packages."""
    tree = driver_tree(driver, EXCLUDES)
    node = tmp_path / "node"
    shutil.copytree(driver, node, ignore=shutil.ignore_patterns(".git"))
    env = node_env({"tree": tree, "threads": 1}, node, "n1")
    sources = json.loads(env["HARNESS_SOURCES"])
    assert "fast.py" in sources[str((node / "arms").resolve())]
    assert str((node / "arms").resolve()) in env["HARNESS_FRESH_ROOTS"].split(":")
    assert driver_tree(tmp_path, EXCLUDES) == {}  # no repository: nothing frozen to compare
