"""This machine's CPU model, standard library only: the one home of the name every run record's
``env.device_name`` gives a CPU (a built-in arm's worker and a command arm's, which loads no torch)
and that a calibration's records are compared with (``prereg/calibrated.py``)."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model name: ``/proc/cpuinfo`` on Linux, ``sysctl`` on macOS, else the platform's word."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess

        r = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=False
        )
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    return platform.processor() or platform.machine()
