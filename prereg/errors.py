"""The harness's exceptions. Each maps to a command-line exit code."""

from __future__ import annotations


class HarnessError(Exception):
    """Base class; ``exit_code`` is what the command line returns."""

    exit_code = 1


class InputError(HarnessError, ValueError):
    """Bad user input: names the file, the key and the line where known. Exit code 2."""

    exit_code = 2

    def __init__(
        self, message: str, *, file: str | None = None, key: str | None = None, line: int | None = None
    ):
        self.message = message
        self.file = file
        self.key = key
        self.line = line
        where = []
        if file:
            where.append(file if line is None else f"{file}:{line}")
        if key:
            where.append(f"key {key}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class RefusedError(HarnessError, RuntimeError):
    """A refusal that protects the study (tags, frozen protocols, existing records). Exit code 2."""

    exit_code = 2


class DataError(HarnessError, OSError):
    """A corpus file is missing or does not verify. Exit code 2."""

    exit_code = 2


class WriteError(HarnessError, OSError):
    """A file of the study could not be written (a full disk, a failing filesystem). Exit code 2."""

    exit_code = 2


class Terminated(BaseException):
    """SIGTERM during ``harness run`` (:mod:`harness.clirun` raises it from its handler): unwinds
    like Ctrl-C's KeyboardInterrupt (the attempt in progress recorded, claims released, workers
    ended), and like it is not an ``Exception``."""
