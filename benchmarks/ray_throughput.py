"""One local runner against a two-node Ray cluster on the same protocol: throughput and overhead.

Builds a study (the tiny convolution model, ``--seeds`` pairs, ``--steps`` steps, one thread per
run), runs it with the local executor, then on a two-node Ray cluster on localhost (each node one
``harness-cpu``; inside private network and PID namespaces, so Ray binds to 127.0.0.1 and every
process it starts ends with the benchmark). It prints, side by side:

* wall time of each execution and units per minute; the throughput ratio Ray / local;
* scheduling overhead per unit: the device time each execution spent not running a worker,
  ``(wall x devices - sum of the runs' launcher wall times) / units``, and what Ray adds to it;
* that overhead in two parts: the fixed start (from the command's start to each device's first
  run, plus from each device's last run to the command's end, per device) and the steady-state
  gap (between consecutive runs on one device), each per unit.

    python benchmarks/ray_throughput.py --seeds 6 --steps 20 --json runs/ray-bench.json

Linux, as root (``unshare``). Cluster start-up is timed separately and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.tiny import tiny_protocol

ROOT = Path(__file__).resolve().parent.parent

PORT = 6579


def make_study(base: Path, name: str, seeds: int, steps: int, launcher: str) -> Path:
    """A git repository at ``base / name`` holding the project's configs and protocols/tiny.yaml."""
    repo = base / name
    (repo / "protocols").mkdir(parents=True)
    shutil.copytree(ROOT / "configs", repo / "configs", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".gitignore").write_text("runs/\n__pycache__/\n")
    text = tiny_protocol(  # the test suite's tiny study, with the pairs and steps asked for
        description="tiny throughput protocol",
        launcher=launcher,
        budget=100000,
        seeds=range(1, seeds + 1),
        steps=steps,
        val_every=steps,
    )
    (repo / "protocols" / "tiny.yaml").write_text(text)
    who = ["-c", "user.email=b@example.invalid", "-c", "user.name=B"]
    for cmd in (["init", "-q", "-b", "main"], [*who, "add", "-A"], [*who, "commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def run(repo: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """Wall seconds of ``harness run``, and its start and end (``time.time()``)."""
    t, start = time.monotonic(), time.time()
    subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "protocols/tiny.yaml", "--quiet", "--no-report", *extra],
        cwd=repo,
        check=True,
        capture_output=True,
        env=env,
    )
    return time.monotonic() - t, start, time.time()


def split_overhead(repo: Path, start: float, end: float) -> tuple[float, float, float]:
    """(fixed, steady) idle device seconds: before each device's first run and after its last, and
    between consecutive runs on one device; and the steady-state rate in runs per second: on each
    device, the runs after its first over the time from its first run's end to its last's."""
    from datetime import datetime

    from prereg.formats.record import load_records

    by_device: dict[str, list[tuple[float, float]]] = {}
    for r in load_records(repo / "records" / "tiny"):
        span = tuple(datetime.fromisoformat(t or "").timestamp() for t in (r.started_at, r.finished_at))
        by_device.setdefault((r.node or {}).get("id", "local"), []).append(span)  # type: ignore[arg-type]
    fixed = steady = rate = 0.0
    for spans in by_device.values():
        spans.sort()
        fixed += (spans[0][0] - start) + (end - spans[-1][1])
        steady += sum(b[0] - a[1] for a, b in zip(spans, spans[1:]))
        rate += (len(spans) - 1) / (spans[-1][1] - spans[0][1]) if len(spans) > 1 else 0.0
    return fixed, steady, rate


def launcher_total(repo: Path) -> float:
    from prereg.formats.record import load_records

    return sum(r.timings["launcher_wall_s"] for r in load_records(repo / "records" / "tiny"))


def inside(work: Path) -> None:
    """In the namespaces: start the cluster, run the study with --ray, write timings."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    t = time.monotonic()
    for args, node in ((["--port", str(PORT)], "head"), (["--address", f"127.0.0.1:{PORT}"], "second")):
        subprocess.run(
            [sys.executable, "-m", "harness.cli", "node", "--device", "cpu", "--no-block", *args],
            check=True,
            capture_output=True,
            env={**env, "HARNESS_NODE_DIR": str(work / f"node-{node}")},
        )
    start = time.monotonic() - t
    wall, t0, t1 = run(work / "ray", "--ray", f"127.0.0.1:{PORT}", env=env)
    subprocess.run(["ray", "stop", "--force"], capture_output=True, env=env)
    (work / "ray.json").write_text(
        json.dumps({"cluster_start_s": start, "wall_s": wall, "start": t0, "end": t1})
    )


# long: the script's two runs (local, then Ray in its namespaces) and the table of their timings
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--launcher", default="forkserver", choices=["forkserver", "spawn"])
    ap.add_argument("--json")
    ap.add_argument(
        "--keep", action="store_true", help="keep the two studies (records, per-run timings) and say where"
    )
    ap.add_argument("--inside", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        inside(Path(args.inside))
        return 0
    work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    try:
        make_study(work, "local", args.seeds, args.steps, args.launcher)
        make_study(work, "ray", args.seeds, args.steps, args.launcher)
        local_wall, t0, t1 = run(work / "local")
        local_fixed, local_steady, local_rate = split_overhead(work / "local", t0, t1)
        subprocess.run(
            [
                "unshare",
                "--net",
                "--pid",
                "--fork",
                "--mount-proc",
                sys.executable,
                __file__,
                "--inside",
                str(work),
            ],
            check=True,
        )
        ray = json.loads((work / "ray.json").read_text())
        units = args.seeds
        local_busy, ray_busy = launcher_total(work / "local"), launcher_total(work / "ray")
        ray_fixed, ray_steady, ray_rate = split_overhead(work / "ray", ray["start"], ray["end"])
        res = {
            "units": units,
            "runs": 2 * units,
            "steps": args.steps,
            "launcher": args.launcher,
            "local_fixed_per_unit_s": local_fixed / units,
            "local_steady_per_unit_s": local_steady / units,
            "ray_fixed_per_unit_s": ray_fixed / units,
            "ray_steady_per_unit_s": ray_steady / units,
            "local_fixed_s": local_fixed,
            "ray_fixed_per_device_s": ray_fixed / 2,
            "steady_throughput_ratio": ray_rate / local_rate,
            "local_wall_s": local_wall,
            "ray_wall_s": ray["wall_s"],
            "ray_cluster_start_s": ray["cluster_start_s"],
            "local_units_per_min": 60 * units / local_wall,
            "ray_units_per_min": 60 * units / ray["wall_s"],
            "throughput_ratio": local_wall / ray["wall_s"],
            "local_overhead_per_unit_s": (local_wall - local_busy) / units,
            "ray_overhead_per_unit_s": (2 * ray["wall_s"] - ray_busy) / units,
            "local_mean_run_s": local_busy / (2 * units),
            "ray_mean_run_s": ray_busy / (2 * units),
        }
        res["ray_added_per_unit_s"] = res["ray_overhead_per_unit_s"] - res["local_overhead_per_unit_s"]
    finally:
        if args.keep:
            print(f"studies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{units} units ({2 * units} runs of {args.steps} steps), tiny_conv, one thread per run, {args.launcher} "
        f"launcher; cluster start {res['ray_cluster_start_s']:.1f} s (not counted)\n"
    )
    print(
        "| Executor | Wall (s) | Units per minute | Mean run (s) | Overhead per unit (s) | of which fixed start "
        "| of which steady gaps |\n|---|---|---|---|---|---|---|"
    )
    for name, k in (("local", "local"), ("ray, 2 nodes", "ray")):
        print(
            f"| {name} | {res[k + '_wall_s']:.1f} | {res[k + '_units_per_min']:.2f} | {res[k + '_mean_run_s']:.2f} | "
            f"{res[k + '_overhead_per_unit_s']:.2f} | {res[k + '_fixed_per_unit_s']:.2f} | "
            f"{res[k + '_steady_per_unit_s']:.2f} |"
        )
    print(
        f"\nthroughput ratio (ray / local): whole execution {res['throughput_ratio']:.2f}, steady state "
        f"{res['steady_throughput_ratio']:.2f}"
    )
    print(
        f"scheduling overhead added per unit: {res['ray_added_per_unit_s']:+.2f} s in all, of which steady-state gaps "
        f"{res['ray_steady_per_unit_s'] - res['local_steady_per_unit_s']:+.2f} s; fixed start per device "
        f"{res['ray_fixed_per_device_s']:.1f} s with Ray, {res['local_fixed_s']:.1f} s locally (once per execution)"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
