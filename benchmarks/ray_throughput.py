"""One local runner against a two-node Ray cluster on the same protocol: throughput and overhead.

Builds a study (the tiny convolution model, ``--seeds`` pairs, ``--steps`` steps, one thread per
run), runs it with the local executor, then on a two-node Ray cluster on localhost (each node one
``harness-cpu``; inside private network and PID namespaces, so Ray binds to 127.0.0.1 and every
process it starts ends with the benchmark). It prints, side by side:

* wall time of each execution and units per minute; the throughput ratio Ray / local;
* scheduling overhead per unit: the device time each execution spent not running a worker,
  ``(wall x devices - sum of the runs' launcher wall times) / units``, and what Ray adds to it.

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

PORT = 6579


def make_study(base: Path, name: str, seeds: int, steps: int) -> Path:
    from conftest import init_study, tiny_protocol

    text = tiny_protocol(steps=steps, launcher="spawn", budget=100000).replace(
        "seeds: [1, 2]", f"seeds: {list(range(1, seeds + 1))}").replace("val_every: 5", f"val_every: {steps}")
    return init_study(base / name, protocol=text)


def run(repo: Path, *extra: str, env: dict[str, str] | None = None) -> float:
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "harness.cli", "run", "protocols/tiny.yaml", "--quiet", "--no-report", *extra],
                   cwd=repo, check=True, capture_output=True, env=env)
    return time.monotonic() - t


def launcher_total(repo: Path) -> float:
    from harness.records import load_records

    return sum(r["timings"]["launcher_wall_s"] for r in load_records(repo / "records" / "tiny"))


def inside(work: Path) -> None:
    """In the namespaces: start the cluster, run the study with --ray, write timings."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    t = time.monotonic()
    for args, node in ((["--port", str(PORT)], "head"), (["--address", f"127.0.0.1:{PORT}"], "second")):
        subprocess.run([sys.executable, "-m", "harness.cli", "node", "--device", "cpu", "--no-block", *args],
                       check=True, capture_output=True, env={**env, "HARNESS_NODE_DIR": str(work / f"node-{node}")})
    start = time.monotonic() - t
    wall = run(work / "ray", "--ray", f"127.0.0.1:{PORT}", env=env)
    subprocess.run(["ray", "stop", "--force"], capture_output=True, env=env)
    (work / "ray.json").write_text(json.dumps({"cluster_start_s": start, "wall_s": wall}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--inside", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        inside(Path(args.inside))
        return 0
    work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    try:
        make_study(work, "local", args.seeds, args.steps)
        make_study(work, "ray", args.seeds, args.steps)
        local_wall = run(work / "local")
        subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", sys.executable, __file__,
                        "--inside", str(work)], check=True)
        ray = json.loads((work / "ray.json").read_text())
        units = args.seeds
        local_busy, ray_busy = launcher_total(work / "local"), launcher_total(work / "ray")
        res = {
            "units": units, "runs": 2 * units, "steps": args.steps,
            "local_wall_s": local_wall, "ray_wall_s": ray["wall_s"], "ray_cluster_start_s": ray["cluster_start_s"],
            "local_units_per_min": 60 * units / local_wall, "ray_units_per_min": 60 * units / ray["wall_s"],
            "throughput_ratio": local_wall / ray["wall_s"],
            "local_overhead_per_unit_s": (local_wall - local_busy) / units,
            "ray_overhead_per_unit_s": (2 * ray["wall_s"] - ray_busy) / units,
            "local_mean_run_s": local_busy / (2 * units), "ray_mean_run_s": ray_busy / (2 * units),
        }
        res["ray_added_per_unit_s"] = res["ray_overhead_per_unit_s"] - res["local_overhead_per_unit_s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{units} units ({2 * units} runs of {args.steps} steps), tiny_conv, one thread per run; "
          f"cluster start {res['ray_cluster_start_s']:.1f} s (not counted)\n")
    print("| Executor | Wall (s) | Units per minute | Mean run (s) | Overhead per unit (s) |\n|---|---|---|---|---|")
    print(f"| local | {res['local_wall_s']:.1f} | {res['local_units_per_min']:.2f} | {res['local_mean_run_s']:.2f} | "
          f"{res['local_overhead_per_unit_s']:.2f} |")
    print(f"| ray, 2 nodes | {res['ray_wall_s']:.1f} | {res['ray_units_per_min']:.2f} | {res['ray_mean_run_s']:.2f} | "
          f"{res['ray_overhead_per_unit_s']:.2f} |")
    print(f"\nthroughput ratio (ray / local) {res['throughput_ratio']:.2f}; scheduling overhead added per unit "
          f"{res['ray_added_per_unit_s']:+.2f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
