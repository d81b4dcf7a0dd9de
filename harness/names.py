"""Names shared by the protocol schema and the code that runs them; free of torch so that
``harness plan``, ``tag`` and ``status`` start instantly. The corpora and splits are the core's
(:mod:`prereg.protocol.schema` declares the ``corpus`` key)."""

from prereg.protocol.schema import CORPORA, ID_RE, SPLITS

__all__ = ["ARMS", "CORPORA", "ID_RE", "SPLITS"]

#: The 2x2 factorial: (norms, optimizer) for each arm. ``native`` is the baseline, ``cotangent``
#: the candidate.
ARMS: dict[str, tuple[str, str]] = {
    "native": ("scalar", "native"),
    "bucketed": ("bucketed", "native"),
    "packed": ("scalar", "packed"),
    "cotangent": ("bucketed", "packed"),
}
