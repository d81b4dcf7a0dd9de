"""The section model of the published texts: a study's ``report.md`` and its page ``index.html``
are one list of :class:`Section` (a title, then blocks: sentences, tables, figures), built once from
the summary (:mod:`prereg.render.sections`) and written by one walk, :func:`write`, for either
output (:func:`to_md` joins report.md's). A block that one output leaves out says so (``only``); the
number formats and the cells that both show are made here, once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from prereg.descriptive import PairedInterval


def esc(x: object) -> str:
    """``x`` as text, HTML-escaped for element content and attribute values."""
    return escape(str(x), quote=True)


def num(x: float | None, fmt: str) -> str:
    """``x`` in ``fmt`` (a trailing ``%`` is printed after the number), ``n/a`` for ``None``."""
    return "n/a" if x is None else format(x, fmt.rstrip("%")) + "%" * fmt.endswith("%")


def level_pct(level: float) -> str:
    """An interval level as a percentage (``0.95`` gives ``"95%"``)."""
    return f"{level * 100:g}%"


def ends(iv: PairedInterval | None) -> tuple[float | None, float | None, float | None]:
    """An interval's estimate, low and high end (``None`` each without one)."""
    return (None, None, None) if iv is None else (iv.estimate, iv.low, iv.high)


def cells(
    iv: PairedInterval | None, fmt: str = ".2f", unit: str = "%", sep: str = " to ", whole: bool = True
) -> tuple[str, str]:
    """An interval's estimate and ``low{sep}high`` cells, ``unit`` after each; without an interval
    ``n/a`` for each cell (``whole``) or for each number, the unit kept (report.md's tables)."""
    if iv is None and whole:
        return "n/a", "n/a"
    e, lo, hi = ends(iv)
    return num(e, fmt) + unit, f"{num(lo, fmt)}{sep}{num(hi, fmt)}{unit}"


@dataclass
class Text:
    """Sentences: ``md`` (its lines) and ``html`` (its markup); ``None`` leaves an output without it."""

    md: str | None
    html: str | None = None

    def text(self, md: bool) -> str | None:
        """What report.md (``md``) or the page shows of it."""
        return self.md if md else self.html


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

    def text(self, md: bool) -> str | None:
        """report.md's table (``md``: the header row, its rule, a line per row) or the page's: its
        caption, column header cells, each row's first cell its row header (no rows: one "none"
        row), everything escaped here."""
        if self.only == ("html" if md else "md"):
            return None
        if md:
            rows = ["| " + " | ".join(r) + " |" for r in (self.header, *self.rows)]
            return "\n".join([rows[0], "|" + "---|" * len(self.header), *rows[1:]])
        head = "".join(
            f'<th scope="col"{" class=l" * (i == 0)}>{esc(h)}</th>' for i, h in enumerate(self.header)
        )
        body = [] if self.rows else [f'<tr><td class="l" colspan="{len(self.header)}">none</td></tr>']
        for r, kind in zip(self.rows, self.row_class or [""] * len(self.rows)):
            cls, cells = f' class="{kind}"' if kind else "", "".join(f"<td>{esc(c)}</td>" for c in r[1:])
            body.append(f'<tr{cls}><th scope="row">{esc(r[0])}</th>{cells}</tr>')
        return f"<table><caption>{esc(self.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


@dataclass
class Section:
    """A titled part of both texts (``only``: of one); ``anchor`` the page heading's id."""

    title: str | None
    blocks: list[Text | Table] = field(default_factory=list)
    level: int = 2
    only: str | None = None
    anchor: str | None = None


def write(sections: Sequence[Section], md: bool) -> list[str]:
    """One walk for both outputs: each section's heading (report.md's ``#``, ``md``, or the page's
    ``<hN>``), then its blocks as that output shows them; what it leaves out (``only``) skipped."""
    out: list[str] = []
    for s in (s for s in sections if s.only != ("html" if md else "md")):
        anchor = f" id={s.anchor}" if s.anchor else ""
        heading = "#" * s.level + f" {s.title}" if md else f"<h{s.level}{anchor}>{esc(s.title)}</h{s.level}>"
        out += [heading] if s.title is not None else []
        out += [x for b in s.blocks if (x := b.text(md)) is not None]
    return out


def to_md(sections: Sequence[Section]) -> str:
    """report.md: each section's heading, then its blocks, a blank line after each."""
    return "\n\n".join(write(sections, True)).rstrip() + "\n"
