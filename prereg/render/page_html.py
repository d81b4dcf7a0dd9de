"""The study page's HTML helpers: escaping, number and interval cells, and the accessible table.

Every section of the page (:mod:`prereg.render.page_studies`, :mod:`prereg.render.page_protocol`) builds its
markup with these, so escaping and the table's caption and header cells are done in one place.
"""

from __future__ import annotations

from html import escape
from typing import Any

from prereg.descriptive import PairedInterval

__all__ = ["esc", "html_table", "interval_cells", "num"]


def esc(x: Any) -> str:
    """``x`` as text, HTML-escaped for element content and attribute values.

    Parameters
    ----------
    x : Any
        Any value; it is shown as ``str(x)``.

    Returns
    -------
    str
        The escaped text (quotes included).
    """
    return escape(str(x), quote=True)


def num(x: float | None, fmt: str) -> str:
    """``x`` formatted by ``fmt``, or ``n/a`` for ``None``.

    Parameters
    ----------
    x : float or None
        The number.
    fmt : str
        A format specification, as for :func:`format`.

    Returns
    -------
    str
        The formatted number, or ``"n/a"``.
    """
    return "n/a" if x is None else format(x, fmt)


def interval_cells(iv: PairedInterval | None, fmt: str = ".2f", unit: str = "%") -> tuple[str, str]:
    """(estimate, 'low to high') of an interval, or n/a.

    Parameters
    ----------
    iv : PairedInterval or None
        The interval; ``None`` (none could be computed) gives ``("n/a", "n/a")``.
    fmt : str, optional
        The numbers' format specification.
    unit : str, optional
        Written after the estimate and after the interval's high end.

    Returns
    -------
    tuple of str
        The estimate's cell and the interval's cell.
    """
    if not iv:
        return "n/a", "n/a"
    return num(iv.estimate, fmt) + unit, f"{num(iv.low, fmt)} to {num(iv.high, fmt)}{unit}"


def html_table(
    caption: str, header: list[str], rows: list[list[str]], row_class: list[str] | None = None
) -> str:
    """A table with a caption, column header cells, and the first cell of each row as its row header.

    Parameters
    ----------
    caption : str
        The table's caption (escaped here).
    header : list of str
        The column headers (escaped here).
    rows : list of list of str
        The rows, as plain text (escaped here); an empty list shows one "none" row.
    row_class : list of str, optional
        A CSS class per row (empty for none), e.g. ``adverse``.

    Returns
    -------
    str
        The table's HTML.
    """
    head = "".join(
        f'<th scope="col"{" class=l" if i == 0 else ""}>{esc(h)}</th>' for i, h in enumerate(header)
    )
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        cells = f'<th scope="row">{esc(r[0])}</th>' + "".join(f"<td>{esc(c)}</td>" for c in r[1:])
        body.append(f"<tr{cls}>{cells}</tr>")
    if not rows:
        body.append(f'<tr><td class="l" colspan="{len(header)}">none</td></tr>')
    return (
        f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )
