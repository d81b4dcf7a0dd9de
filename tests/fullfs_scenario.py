"""The full-filesystem scenario for tests/test_attempts.py, run in a private mount namespace.

``unshare --mount --propagation private python tests/fullfs_scenario.py REPO OUT.json``: mounts a
1 MiB tmpfs on ``REPO/records`` (visible to this namespace only, gone when it ends), then

1. fills it and runs the study: the first write (a started entry) fails;
2. frees it, runs again and, once a worker runs, pauses the runner, fills the filesystem and lets
   the runner go on: the record that ends the attempt cannot be written;
3. frees it and runs again to the end, then audits the records.

Writes what each step printed and left behind to ``OUT.json`` (outside the tmpfs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def fill(where: Path) -> None:
    chunk = b"\0" * 4096
    with open(where / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
    for i in range(64):  # the last few bytes, and inodes
        try:
            (where / f"filler.{i}").write_bytes(b"x")
        except OSError:
            break


def free(where: Path) -> None:
    for f in where.glob("filler*"):
        f.unlink()


def run(repo: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "protocols/tiny.yaml", "--quiet"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def left(records: Path) -> dict[str, list[str]]:
    names = sorted(p.name for p in (records / "tiny").glob("*")) if (records / "tiny").is_dir() else []
    return {"files": names, "tmp": [n for n in names if n.endswith(".tmp")]}


def worker_running(repo: Path) -> bool:
    for f in (repo / "runs" / "tiny" / "work").glob("*/worker.pid"):
        try:
            os.kill(int(f.read_text()), 0)
            return True
        except (OSError, ValueError):
            continue
    return False


def main() -> int:
    repo, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    records = repo / "records"
    records.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(records)], check=True)
    out: dict[str, object] = {}
    fill(records)
    p = run(repo)
    o, e = p.communicate(timeout=600)
    out["full"] = {"rc": p.returncode, "stdout": o, "stderr": e, **left(records)}
    free(records)
    p = run(repo)
    t = time.monotonic()
    while not worker_running(repo) and p.poll() is None and time.monotonic() - t < 300:
        time.sleep(0.05)
    p.send_signal(signal.SIGSTOP)
    fill(records)
    p.send_signal(signal.SIGCONT)
    o, e = p.communicate(timeout=600)
    out["record"] = {"rc": p.returncode, "stdout": o, "stderr": e, **left(records)}
    free(records)
    p = run(repo)
    o, e = p.communicate(timeout=900)
    out["resumed"] = {"rc": p.returncode, "stdout": o, "stderr": e, **left(records)}
    a = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(Path(__file__).resolve().parent.parent / "analysis" / "public_audit.py"),
            "records/tiny",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out["audit"] = {"rc": a.returncode, "stdout": a.stdout}
    out["records"] = [json.loads(p.read_text()) for p in sorted((records / "tiny").glob("*.record.json"))]
    out_path.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
