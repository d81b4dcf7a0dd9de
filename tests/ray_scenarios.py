"""Ray scenarios for tests/test_ray.py, run inside private network and PID namespaces.

``unshare --net --pid --fork --mount-proc python tests/ray_scenarios.py WORKDIR``: Ray then binds to
127.0.0.1 only (the namespace has nothing else), and every process the cluster starts lives in
this PID namespace, so it ends with this script and nothing outside it is touched. Starts a
two-node cluster (each node one ``harness-cpu``) with ``harness node``, then:

0. ``failing``: while only the head node is up, a study whose candidate fails at start-up (the
   failure rule, :mod:`prereg.failstop`);
1. ``full``: a protocol run with ``--ray``;
2. ``driver``: the driver killed after its first record, then started again;
3. ``node-during1``, ``node-between``, ``node-during2``: the second node killed (its processes, by
   their ids) at a fixed point of its first unit: while the unit's first run trains, between its
   two runs, while its second run trains. The node stops itself at that point
   (``HARNESS_TEST_HOLD``, a hook used only by tests, see :mod:`harness.execute.ray`) and says so,
   so the kill lands there however loaded the machine is; the node is then started again.

Writes ``WORKDIR/scenarios.json`` with what it did; the test reads the records itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PORT = 6479


def sh(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, **kw)


def harness(repo: Path, *args: str, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def records(repo: Path) -> list[Path]:
    return sorted((repo / "records" / "tiny").glob("*.record.json"))


def wait_for(cond, timeout: float = 300.0) -> None:
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(0.2)


def processes_of(node_dir: str) -> list[int]:
    """The node's processes: its raylet and everything started under it (they inherit its environment)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"HARNESS_NODE_DIR={node_dir}".encode() in env.split(b"\0"):
            out.append(int(pid))
    if not out:
        raise LookupError(f"no process with HARNESS_NODE_DIR={node_dir}")
    return out


def main() -> int:
    work = Path(sys.argv[1])
    out: dict[str, object] = {}
    sh("ip", "link", "set", "lo", "up", check=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    nodes = {"head": str(work / "node-head"), "second": str(work / "node-second")}
    r = sh(
        sys.executable,
        "-m",
        "harness.cli",
        "node",
        "--device",
        "cpu",
        "--port",
        str(PORT),
        "--no-block",
        env={**env, "HARNESS_NODE_DIR": nodes["head"]},
    )
    out["head"] = r.returncode
    address = f"127.0.0.1:{PORT}"
    hold = work / "hold-second"

    def second_node() -> int:
        return sh(
            sys.executable,
            "-m",
            "harness.cli",
            "node",
            "--device",
            "cpu",
            "--address",
            address,
            "--no-block",
            # its runs slowed eightfold (the test knob), so a hold "during" a run lands mid-run on any
            # machine, however fast the run itself is
            env={
                **env,
                "HARNESS_NODE_DIR": nodes["second"],
                "HARNESS_TEST_HOLD": str(hold),
                "HARNESS_TEST_SLOWDOWN": "8",
            },
        ).returncode

    # 0. while the head node is the only one (one unit at a time, as locally): a study whose candidate
    # fails at start-up, stopped by the failure rule
    p = harness(
        work / "failing", "run", "protocols/tiny.yaml", "--quiet", "--no-report", "--ray", address, env=env
    )
    out["failing_log"] = p.communicate(timeout=900)[0]
    out["failing_rc"] = p.returncode
    out["second"] = second_node()
    # 1. a full run
    p = harness(
        work / "full", "run", "protocols/tiny.yaml", "--quiet", "--no-report", "--ray", address, env=env
    )
    out["full_log"] = p.communicate(timeout=900)[0]
    out["full_rc"] = p.returncode
    # 1b. a lockstep study: each pair's process on one node
    p = harness(
        work / "lockstep", "run", "protocols/tiny.yaml", "--quiet", "--no-report", "--ray", address, env=env
    )
    out["lockstep_log"] = p.communicate(timeout=900)[0]
    out["lockstep_rc"] = p.returncode
    # 2. the driver killed after its first record, then started again
    p = harness(
        work / "driver", "run", "protocols/tiny.yaml", "--quiet", "--no-report", "--ray", address, env=env
    )
    wait_for(lambda: len(records(work / "driver")) >= 1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    out["driver_records_at_kill"] = len(records(work / "driver"))
    time.sleep(2)
    p = harness(
        work / "driver", "run", "protocols/tiny.yaml", "--quiet", "--no-report", "--ray", address, env=env
    )
    out["driver_log"] = p.communicate(timeout=900)[0]
    out["driver_rc"] = p.returncode
    # 3. the second node killed at fixed points of its first unit, then started again
    for name, point in (
        ("node-during1", "during:1"),
        ("node-between", "between:1"),
        ("node-during2", "during:2"),
    ):
        held = Path(f"{hold}.held")
        held.unlink(missing_ok=True)
        hold.write_text(point)
        p = harness(
            work / name, "run", "protocols/tiny.yaml", "--quiet", "--no-report", "--ray", address, env=env
        )
        wait_for(lambda held=held, p=p: held.exists() or p.poll() is not None, timeout=600)
        out[f"{name}_held"] = held.exists()
        pids = processes_of(nodes["second"])
        for pid in pids:  # the whole node dies at once, as a machine that loses power
            os.kill(pid, signal.SIGKILL)
        out[f"{name}_log"] = p.communicate(timeout=900)[0]
        out[f"{name}_rc"] = p.returncode
        hold.unlink(missing_ok=True)
        out[f"{name}_restart"] = second_node()
    sh("ray", "stop", "--force", env=env)
    (work / "scenarios.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
