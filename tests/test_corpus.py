"""Local corpora: pinned in the protocol (size and sha256), verified before any run, shipped to Ray
nodes like WikiText-2 (tests/test_ray.py), recorded and audited."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from conftest import ROOT, harness, pinned_corpus, record_dicts, tiny_protocol

from audit.cli import NOT_VERIFIED
from harness.data import LocalCorpus, PinnedFile, load_corpus
from prereg.errors import DataError


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_one_file_is_cut_exactly_and_three_files_load_as_pinned(tmp_path):
    data = bytes(range(256)) * 40 + b"x"  # 10241 bytes
    (tmp_path / "c.bin").write_bytes(data)
    one = LocalCorpus("c", {"all": PinnedFile("c.bin", len(data), sha(data))}, ("0.9", "0.05", "0.05"))
    c = one.load(tmp_path)
    # floor(10241 * 9/10) = 9216, floor(10241 * 19/20) = 9728
    assert (c.train, c.valid, c.test) == (data[:9216], data[9216:9728], data[9728:])
    assert LocalCorpus.from_dict(one.as_dict()) == one
    for name, part in zip(("train", "valid", "test"), (c.train, c.valid, c.test)):
        (tmp_path / name).write_bytes(part)
    three = LocalCorpus(
        "c", {s: PinnedFile(s, len(c.split(s)), sha(c.split(s))) for s in ("train", "valid", "test")}
    )
    assert load_corpus(three.as_dict(), root=tmp_path) == c
    (tmp_path / "c.bin").write_bytes(data[:-1] + b"y")  # same size, other bytes
    with pytest.raises(DataError, match=r"c\.bin of corpus 'c' does not verify: expected 10241 bytes"):
        one.load(tmp_path)
    (tmp_path / "c.bin").unlink()
    with pytest.raises(DataError, match="missing corpus file"):
        one.load(tmp_path)


GOOD = (
    "{name: t, file: {path: c.txt, size: 10, sha256: "
    + "a" * 64
    + "}, split: {train: 0.9, valid: 0.05, test: 0.05}}"
)


@pytest.mark.parametrize(
    "corpus, key, message",
    [
        (GOOD.replace("a" * 64, "abc"), "corpus.file.sha256", "64 lowercase hex digits"),
        (GOOD.replace("test: 0.05", "test: 0.06"), "corpus.split", "sum to 1.01"),
        (GOOD.replace("name: t", "name: wikitext-2"), "corpus.name", "not wikitext-2"),
        (GOOD.replace("split:", "splits:"), "corpus.splits", "unknown key"),
        (GOOD.replace("size: 10", "size: 0"), "corpus.file.size", "positive byte count"),
        ("tinyshakespeare", "corpus", "unknown corpus 'tinyshakespeare'"),
    ],
)
def test_corpus_errors_name_file_key_line(repo, corpus, key, message):
    (repo / "protocols" / "tiny.yaml").write_text(tiny_protocol(corpus=corpus))
    r = harness(repo, "plan", "protocols/tiny.yaml")
    assert (
        r.returncode == 2 and message in r.stderr and f"key {key}" in r.stderr and "tiny.yaml:5," in r.stderr
    ), r.stderr


@pytest.mark.process
def test_local_corpus_from_pin_to_audit(repo):
    pinned_corpus(repo)
    pin = harness(repo, "data", "pin", "corpus/topics.txt", "--name", "topics")
    assert pin.returncode == 0 and "path: corpus/topics.txt" in pin.stdout, pin.stderr
    (repo / "protocols" / "tiny.yaml").write_text(
        tiny_protocol().replace("corpus: pydoc-topics", pin.stdout.strip())
    )
    v = harness(repo, "data", "verify", "protocols/tiny.yaml")
    assert v.returncode == 0 and "verified topics train" in v.stdout, v.stderr
    c = harness(
        repo,
        "compare-arms",
        "native",
        "cotangent",
        "--config",
        "tiny_conv",
        "--steps",
        "2",
        "--corpus",
        "protocols/tiny.yaml",
        "--json",
    )  # on the protocol's (local, verified) corpus
    assert c.returncode == 0 and json.loads(c.stdout)["summary"]["bitwise_equal"], c.stderr
    r = harness(repo, "run", "protocols/tiny.yaml", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    data = (repo / "corpus" / "topics.txt").read_bytes()
    a, b = len(data) * 9 // 10, len(data) * 19 // 20
    want = {"train": sha(data[:a]), "valid": sha(data[a:b]), "test": sha(data[b:])}
    recs = record_dicts(repo / "records" / "tiny")
    assert len(recs) == 4 and all(
        x["env"]["corpus_sha256"] == want and x["spec"]["corpus"] == "topics" for x in recs
    )
    audit = [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), "records/tiny"]
    out = subprocess.run(audit, cwd=repo, capture_output=True, text=True)
    assert (
        out.returncode == NOT_VERIFIED
        and "topics: 4 runs read one set of split hashes, the protocol's pins" in out.stdout
    ), out.stdout
    # one byte changed after the runs: nothing more runs, and the audit names the file
    (repo / "corpus" / "topics.txt").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    r = harness(repo, "run", "protocols/tiny.yaml", "--quiet")
    assert r.returncode == 2 and "corpus/topics.txt of corpus 'topics' does not verify" in r.stderr, r.stderr
    assert len(record_dicts(repo / "records" / "tiny")) == 4
    out = subprocess.run(audit, cwd=repo, capture_output=True, text=True)
    assert out.returncode == 1 and "the protocol pins" in out.stdout, out.stdout
