"""The section model of the published texts and its two writers: a study's ``report.md`` and its
page ``index.html`` are one list of :class:`Section` (a title, then blocks: sentences, tables,
figures), built once from the summary (:mod:`prereg.render.sections`), written by :func:`to_md` and
:func:`to_html`. A block that one output leaves out says so (``only``); the number formats and the
cells that both show are made here, once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from prereg.descriptive import PairedInterval

__all__ = [
    "Section",
    "Table",
    "Text",
    "cells",
    "cols",
    "esc",
    "level_pct",
    "num",
    "para",
    "raw",
    "to_html",
    "to_md",
]


def esc(x: Any) -> str:
    """``x`` as text, HTML-escaped for element content and attribute values."""
    return escape(str(x), quote=True)


def num(x: float | None, fmt: str) -> str:
    """``x`` in ``fmt`` (a trailing ``%`` is printed after the number), ``n/a`` for ``None``."""
    return "n/a" if x is None else format(x, fmt.rstrip("%")) + "%" * fmt.endswith("%")


def level_pct(level: float) -> str:
    """An interval level as a percentage (``0.95`` gives ``"95%"``)."""
    return f"{level * 100:g}%"


def cells(
    iv: PairedInterval | None, fmt: str = ".2f", unit: str = "%", sep: str = " to ", whole: bool = True
) -> tuple[str, str]:
    """An interval's estimate and ``low{sep}high`` cells, ``unit`` after each; without an interval
    ``n/a`` for each cell (``whole``) or for each number, the unit kept (report.md's tables)."""
    if iv is None and whole:
        return "n/a", "n/a"
    e, lo, hi = (None, None, None) if iv is None else (iv.estimate, iv.low, iv.high)
    return num(e, fmt) + unit, f"{num(lo, fmt)}{sep}{num(hi, fmt)}{unit}"


@dataclass
class Text:
    """Sentences: ``md`` (its lines) and ``html`` (its markup); ``None`` leaves an output without it."""

    md: str | None
    html: str | None = None


def raw(markup: str) -> Text:
    """The page's markup alone (report.md leaves it out)."""
    return Text(None, markup)


def cols(header: str) -> list[str]:
    """A table's column headers, written as its header row reads: ``"A | B | C"``."""
    return header.split(" | ")


def para(text: str, only: str | None = None) -> Text:
    """One paragraph worded the same in both outputs (``only``: ``"md"`` or ``"html"``)."""
    return Text(None if only == "html" else text, None if only == "md" else f"<p>{esc(text)}</p>")


@dataclass
class Table:
    """A table: its caption (the page's), column headers and rows of plain text; a CSS class per
    row (the page's, e.g. ``adverse``)."""

    caption: str
    header: list[str]
    rows: list[list[str]]
    row_class: list[str] | None = None
    only: str | None = None


@dataclass
class Section:
    """A titled part of both texts (``only``: of one); ``anchor`` the page heading's id."""

    title: str | None
    blocks: list[Text | Table] = field(default_factory=list)
    level: int = 2
    only: str | None = None
    anchor: str | None = None


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table: the header row, its rule, and one line per row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def html_table(t: Table) -> str:
    """A table with its caption, column header cells and each row's first cell as its row header;
    no rows shows one "none" row. Everything is escaped here."""
    head = "".join(
        f'<th scope="col"{" class=l" if i == 0 else ""}>{esc(h)}</th>' for i, h in enumerate(t.header)
    )
    body = []
    for i, r in enumerate(t.rows):
        cls = f' class="{t.row_class[i]}"' if t.row_class and t.row_class[i] else ""
        body.append(
            f'<tr{cls}><th scope="row">{esc(r[0])}</th>'
            + "".join(f"<td>{esc(c)}</td>" for c in r[1:])
            + "</tr>"
        )
    if not t.rows:
        body.append(f'<tr><td class="l" colspan="{len(t.header)}">none</td></tr>')
    return f"<table><caption>{esc(t.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def to_md(sections: Sequence[Section]) -> str:
    """report.md: each section's ``#`` heading, then its blocks, a blank line after each."""
    out: list[str] = []
    for s in (s for s in sections if s.only != "html"):
        out += [] if s.title is None else ["#" * s.level + " " + s.title, ""]
        for b in s.blocks:
            if isinstance(b, Table) and b.only != "html":
                out += [*md_table(b.header, b.rows), ""]
            elif isinstance(b, Text) and b.md is not None:
                out += [b.md, ""]
    return "\n".join(out).rstrip() + "\n"


def to_html(sections: Sequence[Section]) -> list[str]:
    """The page's body: each section's heading, then its blocks' markup, one line each."""
    out: list[str] = []
    for s in (s for s in sections if s.only != "md"):
        anchor = f" id={s.anchor}" if s.anchor else ""
        out += [] if s.title is None else [f"<h{s.level}{anchor}>{esc(s.title)}</h{s.level}>"]
        for b in s.blocks:
            if isinstance(b, Table) and b.only != "md":
                out.append(html_table(b))
            elif isinstance(b, Text) and b.html is not None:
                out.append(b.html)
    return out
