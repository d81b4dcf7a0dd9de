"""The report's markdown helpers: number cells, an interval's ends, a level as a percentage, and the
markdown table that every section of ``report.md`` (:mod:`prereg.render.report_studies`,
:mod:`prereg.render.report_protocol`) is made of.
"""

from __future__ import annotations

from prereg.descriptive import PairedInterval

__all__ = ["interval_end", "level_pct", "md_table", "num"]


def num(x: float | None, fmt: str) -> str:
    """``x`` in ``fmt`` (a trailing ``%`` is printed after the number), ``n/a`` for ``None``.

    Parameters
    ----------
    x : float or None
        The number.
    fmt : str
        A format specification, as for :func:`format`, optionally followed by ``%``.

    Returns
    -------
    str
        The formatted number, or ``"n/a"``.
    """
    return "n/a" if x is None else format(x, fmt.rstrip("%")) + "%" * fmt.endswith("%")


def interval_end(iv: PairedInterval | None, end: str) -> float | None:
    """An interval's ``estimate``, ``low`` or ``high``; ``None`` without an interval.

    Parameters
    ----------
    iv : PairedInterval or None
        The interval, or ``None`` where none could be computed.
    end : str
        ``"estimate"``, ``"low"`` or ``"high"``.

    Returns
    -------
    float or None
        That end of the interval.
    """
    return None if iv is None else float(getattr(iv, end))


def level_pct(level: float) -> str:
    """An interval level as a percentage (``0.95`` gives ``"95%"``).

    Parameters
    ----------
    level : float
        The level, a fraction.

    Returns
    -------
    str
        The level with a ``%`` sign.
    """
    return f"{level * 100:g}%"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the header row, its rule, and one line per row.

    Parameters
    ----------
    header : list of str
        The column headers.
    rows : list of list of str
        The rows' cells, as markdown text.

    Returns
    -------
    list of str
        The table's lines.
    """
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
