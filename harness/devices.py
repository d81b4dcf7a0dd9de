"""Device choice, synchronisation and memory peaks: the only device-specific code in the harness.

* choice: ``auto`` takes MPS, then CUDA, then CPU;
* synchronisation: ``torch.cuda.synchronize`` / ``torch.mps.synchronize``; nothing on CPU, whose
  kernels return when done;
* memory: CUDA max allocated and reserved bytes; MPS driver-allocated bytes sampled each step;
  CPU the worker process's peak resident set size.
"""

from __future__ import annotations

import platform
import resource
import sys

import torch

from harness.machine import cpu_model
from prereg.errors import InputError


def resolve(name: str) -> torch.device:
    if name == "auto":
        if torch.backends.mps.is_available():
            return torch.device("mps")
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("device 'cuda' requested but torch.cuda.is_available() is False")
    if name == "mps" and not torch.backends.mps.is_available():
        raise InputError("device 'mps' requested but torch.backends.mps.is_available() is False")
    if name not in ("cpu", "cuda", "mps"):
        raise InputError(f"unknown device {name!r} (auto, cpu, cuda or mps)")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"{cpu_model()} MPS (macOS {platform.mac_ver()[0]})"
    return cpu_model()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process.

    Linux: ``VmHWM`` from ``/proc/self/status``, which starts afresh with each program (the
    ``ru_maxrss`` of a child would also count its parent's size at fork, kept across exec).
    Elsewhere: ``ru_maxrss`` (bytes on macOS, KiB on Linux).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class MemoryMeter:
    """Peak memory of this process on ``device``; call :meth:`sample` once per step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.mps_peak = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def sample(self) -> None:
        if self.device.type == "mps":
            self.mps_peak = max(self.mps_peak, int(torch.mps.driver_allocated_memory()))

    def peaks(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {"process_peak_rss_bytes": peak_rss_bytes()}
        if self.device.type == "cuda":
            out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
            out["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved(self.device))
            out["primary"] = "cuda_max_allocated_bytes"
        elif self.device.type == "mps":
            out["mps_driver_allocated_peak_bytes"] = self.mps_peak
            out["primary"] = "mps_driver_allocated_peak_bytes"
        else:
            out["primary"] = "process_peak_rss_bytes"
        return out
