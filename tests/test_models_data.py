"""Models, configurations, corpora, batches and exact bits per byte."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import math
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.config import all_configs, config_dir, load_config
from harness.data import fetch_wikitext2, load_corpus, verify_wikitext2
from harness.data.batches import BatchStream, bits_per_byte, eval_windows
from harness.models import build_model, count_parameters
from prereg.errors import DataError, InputError

ROOT = Path(__file__).resolve().parent.parent
STUDY = {
    "small_transformer": "3.35M",
    "medium_transformer": "19.28M",
    "gated_gqa": "9.74M",
    "causal_conv": "3.75M",
}


@pytest.mark.parametrize("name", sorted(STUDY))
def test_study_parameter_counts(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    n = count_parameters(build_model(cfg.model, 0))
    assert f"{float(f'{n:.3g}') / 1e6:g}M" == STUDY[name] or f"{n / 1e6:.2f}M" == STUDY[name]


def test_configs_cli_json():
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "configs", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["small_transformer"]["parameters"] == 3_346_944
    assert rows["medium_transformer"]["parameters"] == 19_280_896
    assert all(r["parameters"] < 200_000 for n, r in rows.items() if n.startswith("tiny_"))


@pytest.mark.parametrize("cfg", all_configs(ROOT / "configs"), ids=lambda c: c.name)
def test_causal_and_deterministic(cfg):
    torch.manual_seed(0)
    m1, m2 = build_model(cfg.model, 7), build_model(cfg.model, 7)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)
    assert any(not torch.equal(p, q) for p, q in zip(m1.parameters(), build_model(cfg.model, 8).parameters()))
    x = torch.randint(0, 256, (1, cfg.model.context))
    t = cfg.model.context // 2
    y = x.clone()
    y[:, t + 1] = (y[:, t + 1] + 1) % 256
    with torch.no_grad():
        a, b = m1(x), m1(y)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.equal(a[:, t + 1 :], b[:, t + 1 :])


def test_config_errors_name_file_key_line(tmp_path):
    src = (ROOT / "configs" / "tiny_transformer.yaml").read_text()
    bad = tmp_path / "tiny_transformer.yaml"
    bad.write_text(src.replace("  n_layers: 2", "  n_layer: 2"))
    with pytest.raises(InputError) as e:
        load_config(bad)
    lines = bad.read_text().splitlines()
    line = next(i + 1 for i, s in enumerate(lines) if "n_layer:" in s)
    assert e.value.line == line and e.value.key == "model.n_layer" and str(bad) in str(e.value)
    bad.write_text(src.replace("batch_size: 8", "batch_size: eight", 1))
    with pytest.raises(InputError, match="must be int"):
        load_config(bad)


def test_batches_depend_on_seed_only():
    c = load_corpus("pydoc-topics")
    a, b, d = (BatchStream(c.train, 16, 4, s) for s in (1, 1, 2))
    for _ in range(3):
        (xa, ya), (xb, yb), (xd, _) = a.next(), b.next(), d.next()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa[:, 1:], ya[:, :-1])
    assert not torch.equal(xa, xd)


def test_pydoc_split_is_deterministic_and_balanced():
    c = load_corpus("pydoc-topics")
    sizes = {s: len(c.split(s)) for s in ("train", "valid", "test")}
    total = sum(sizes.values())
    assert 0.85 < sizes["train"] / total < 0.95 and sizes["valid"] > 0 and sizes["test"] > 0
    assert c.sha256() == load_corpus("pydoc-topics").sha256()


def test_bpb_matches_brute_force():
    cfg = load_config(ROOT / "configs" / "tiny_conv.yaml")
    model = build_model(cfg.model, 3).eval()
    split = bytes(range(200)) * 2 + b"tail"
    ctx = 16
    bpb, n = bits_per_byte(model, split, ctx, 5, torch.device("cpu"))
    assert n == len(split) - 1
    total = 0.0
    for start, length in eval_windows(split, ctx):
        window = torch.tensor(list(split[start : start + length + 1]))
        with torch.no_grad():
            logp = F.log_softmax(model(window[None, :-1]).double(), -1)[0]
        for i in range(length):
            total -= float(logp[i, window[i + 1]])
    assert bpb == pytest.approx(total / (math.log(2) * n), rel=1e-6)
    again, _ = bits_per_byte(model, split, ctx, 5, torch.device("cpu"))
    assert again == bpb
    sub, nsub = bits_per_byte(model, split, ctx, 5, torch.device("cpu"), max_windows=3)
    assert nsub == 3 * ctx


# ------------------------------------------------------------------------------------ wikitext


def _fake_corpus():
    members = {"train": b"train text " * 50, "valid": b"valid text " * 20, "test": b"test text " * 20}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for split, data in members.items():
            zf.writestr(f"wikitext-2-raw/wiki.{split}.raw", data)
    blob = buf.getvalue()
    pins = {
        "archive": {"name": "x.zip", "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()},
        "members": {
            s: {
                "path": f"wikitext-2-raw/wiki.{s}.raw",
                "size": len(d),
                "sha256": hashlib.sha256(d).hexdigest(),
            }
            for s, d in members.items()
        },
    }
    return blob, pins, members


def test_missing_and_wrong_hash_errors(tmp_path):
    with pytest.raises(
        DataError, match=r"missing corpus file .*wiki.train.raw.*harness data fetch wikitext-2"
    ):
        load_corpus("wikitext-2", tmp_path)
    blob, pins, members = _fake_corpus()
    d = tmp_path / "wikitext-2-raw"
    d.mkdir()
    for s, data in members.items():
        (d / f"wiki.{s}.raw").write_bytes(data)
    verify_wikitext2(tmp_path, pins)
    (d / "wiki.valid.raw").write_bytes(members["valid"] + b"x")
    with pytest.raises(
        DataError, match=r"wiki.valid.raw does not verify: expected .* refusing to use unverified bytes"
    ):
        verify_wikitext2(tmp_path, pins)
    with pytest.raises(DataError, match="does not verify"):  # the real pins never accept these bytes
        load_corpus("wikitext-2", tmp_path)


@pytest.fixture
def http_server(tmp_path):
    blob, pins, members = _fake_corpus()
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "good.zip").write_bytes(blob)
    (tmp_path / "serve" / "bad.zip").write_bytes(blob[:40] + bytes([blob[40] ^ 0xFF]) + blob[41:])

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(tmp_path / "serve"), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", pins, members
    server.shutdown()


def test_fetch_cli_against_local_server(tmp_path, http_server):
    base, pins, members = http_server
    pin_file = tmp_path / "pins.json"
    pin_file.write_text(json.dumps(pins))
    dest = tmp_path / "data"
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "data",
        "fetch",
        "wikitext-2",
        "--dir",
        str(dest),
        "--pins",
        str(pin_file),
    ]
    r = subprocess.run(cmd + ["--url", f"{base}/bad.zip"], capture_output=True, text=True)
    assert r.returncode == 2 and "bad.zip: archive has" in r.stderr and not (dest / "wikitext-2-raw").exists()
    r = subprocess.run(
        cmd + ["--url", f"{base}/missing.zip", "--url", f"{base}/good.zip"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "fetched from" in r.stdout and "good.zip" in r.stdout
    for s, data in members.items():
        assert (dest / "wikitext-2-raw" / f"wiki.{s}.raw").read_bytes() == data
    assert not list((dest / "wikitext-2-raw").glob(".fetch-*"))  # atomic placement leaves no temporaries


def test_fetch_refuses_oversized_member(tmp_path, http_server):
    base, pins, _ = http_server
    pins = json.loads(json.dumps(pins))
    pins["members"]["train"]["size"] = 10  # the archive's member is larger than pinned
    with pytest.raises(DataError, match="wiki.train.raw has"):
        fetch_wikitext2(tmp_path / "d", [f"{base}/good.zip"], pins)


@pytest.mark.process
def test_compile_smoke_cpu():
    cfg = load_config(ROOT / "configs" / "tiny_transformer.yaml")
    model = build_model(cfg.model, 0)
    compiled = torch.compile(model)
    x = torch.randint(0, 256, (2, 16))
    out = compiled(x)
    out.float().sum().backward()
    assert torch.allclose(out, model(x), atol=1e-5)
    assert all(p.grad is not None for p in model.parameters())


def test_config_dir_found_from_repo():
    assert config_dir(ROOT / "tests") == ROOT / "configs"
