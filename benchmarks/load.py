"""A known load for a calibration run "under load" (docs/decisions.md, "Effect classes"): busy
loops and a memory-heavy neighbour, each a process of its own, for a fixed time, then gone.

    python benchmarks/load.py --busy 1 --memory-mib 256 --seconds 1800 &
    harness run protocols/calibration-classes-loaded.yaml
    kill %1          # or let --seconds end it

A busy loop spins in pure Python (one core's worth of CPU, touching no memory to speak of); the
memory neighbour copies a buffer of ``--memory-mib`` MiB into another, over and over (a working set
far above the last-level cache: it takes memory bandwidth and evicts what the caches held, as a
data loader or another job on the machine would). Each process ends after ``--seconds`` or when
this process is stopped (SIGTERM or SIGINT stop them all, by process id). It prints each child's
process id, and at the end the copies the neighbour made (its bandwidth, GiB/s).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import sys
import time


def _busy(until: float) -> None:
    x = 0
    while time.monotonic() < until:
        for _ in range(10000):
            x += 1


def _memory(mib: int, until: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    src = bytearray(b"\x01" * (mib << 20))
    dst = bytearray(mib << 20)
    n, t0 = 0, time.monotonic()
    while time.monotonic() < until:
        dst[:] = src
        n += 1
    out.put((n, time.monotonic() - t0))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", type=int, default=1, help="busy loops (processes), default 1")
    ap.add_argument("--memory-mib", type=int, default=256, help="the neighbour's buffer, MiB (0: none)")
    ap.add_argument("--seconds", type=float, default=1800, help="how long, default 1800")
    a = ap.parse_args(argv)
    if a.busy < 0 or a.memory_mib < 0 or a.seconds <= 0:
        print("load.py: --busy and --memory-mib at least 0, --seconds above 0", file=sys.stderr)
        return 2
    until = time.monotonic() + a.seconds
    q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=_busy, args=(until,)) for _ in range(a.busy)]
    if a.memory_mib:
        procs.append(mp.Process(target=_memory, args=(a.memory_mib, until, q)))
    for p in procs:
        p.start()
        print(f"load.py: started {p.pid}", flush=True)

    def stop(*_: object) -> None:
        for p in procs:
            if p.is_alive():
                p.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.join()
    if a.memory_mib and not q.empty():
        n, dt = q.get()
        print(
            f"load.py: the neighbour copied {n} x {a.memory_mib} MiB in {dt:.0f} s ({n * a.memory_mib / 1024 / dt:.1f} GiB/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
