"""The study page's plots: inline SVG with a title and a text description, no script or request."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prereg.render.model import esc

WIDTH, LEFT, RIGHT, ROW_H = 720, 190, 30, 30
#: A generous width per character of a 12 px sans-serif label (wider than any such font's average),
#: so the label column fits its longest label (the browser test measures the drawn labels).
CHAR_W = 7.4
#: A plot's rows (each a label and its values) and what it draws of a row's values at height ``y``,
#: given the plot's x scale.
Rows = Sequence[tuple[str, Sequence[float]]]
Mark = Callable[[Callable[[float], float], float, Sequence[float]], str]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    raw = (hi - lo) / n
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, t = [], -(-lo // step) * step
    while t <= hi + 1e-12:
        out.append(round(t, 10))
        t += step
    return out


def label_width(labels: list[str]) -> int:
    """The label column's width: the default, or wide enough for the longest label."""
    return max(LEFT, int(CHAR_W * max((len(t) for t in labels), default=0)) + 20)


def _plot(ident: str, title: str, desc: str, rows: Rows, top: int, mark: Mark) -> str:
    """An SVG plot: its opening, title and description, grid ticks and a dashed zero line over the
    rows' values, then each row's label and ``mark``'s drawing of its values; the label column as
    wide as its longest label needs (the plot's width grows with it)."""
    height = top + ROW_H * len(rows) + 30
    values = [v for _, vals in rows for v in vals]
    lo, hi = min([*values, 0.0]), max([*values, 0.0])
    pad = (hi - lo) * 0.08 or 1.0
    lo, hi = lo - pad, hi + pad
    left = label_width([label for label, _ in rows])
    width = WIDTH - LEFT + left

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - RIGHT)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-labelledby="{ident}-t {ident}-d" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-size="12">',
        f'<title id="{ident}-t">{esc(title)}</title>',
        f'<desc id="{ident}-d">{esc(desc)}</desc>',
    ]
    for t in _ticks(lo, hi):
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{top - 8}" x2="{x(t):.1f}" y2="{height - 24}" stroke="#e4e4e4"/>'
            f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">{t:g}%</text>'
        )
    parts.append(
        f'<line x1="{x(0):.1f}" y1="{top - 12}" x2="{x(0):.1f}" y2="{height - 24}" stroke="#555" '
        'stroke-dasharray="4 3"/>'
    )
    for i, (label, vals) in enumerate(rows):
        y = top + ROW_H * i + ROW_H / 2
        name = f'<text x="{left - 10}" y="{y + 4:.1f}" text-anchor="end">{esc(label)}</text>'
        parts.append(name + mark(x, y, vals))
    return "".join(parts) + "</svg>"


def forest_svg(
    ident: str,
    title: str,
    rows: list[tuple[str, float | None, float | None, float | None]],
    points: bool = False,
) -> str:
    """Estimates with intervals, a line at zero: ``rows`` (label, estimate, low, high); a None drops a row.
    Reductions in percent (positive: faster), or ``points`` (positive: slower); blue an interval
    wholly on the faster side, red wholly on the slower side."""
    shown = [(t, (e, lo, hi)) for t, e, lo, hi in rows if e is not None and lo is not None and hi is not None]
    if points:
        desc = "; ".join(f"{t}: {e:+.2f} points ({lo:+.2f} to {hi:+.2f})" for t, (e, lo, hi) in shown)
    else:
        desc = "; ".join(f"{t}: {e:.2f}% ({lo:.2f} to {hi:.2f}%)" for t, (e, lo, hi) in shown)
    sign = -1.0 if points else 1.0  # which side is faster

    def mark(x: Callable[[float], float], y: float, v: Sequence[float]) -> str:
        lo, hi = sorted((sign * v[1], sign * v[2]))
        color = "#1f5fa8" if lo > 0 else ("#b3361f" if hi < 0 else "#555")
        return (
            f'<line x1="{x(v[1]):.1f}" y1="{y:.1f}" x2="{x(v[2]):.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-width="2"/><circle cx="{x(v[0]):.1f}" cy="{y:.1f}" r="4.5" fill="{color}"/>'
        )

    return _plot(ident, title, desc, shown, 34, mark) if shown else ""


def pairs_svg(ident: str, title: str, rows: list[tuple[str, list[float]]], points: bool = False) -> str:
    """Every pair's time reduction (%), or change in ``points`` (positive: slower), one row per
    configuration; adverse pairs (the candidate slower) in red squares."""
    rows = [(label, vals) for label, vals in rows if vals]
    sign = -1.0 if points else 1.0  # a faster pair's side
    adverse, total = sum(sign * v < 0 for _, vals in rows for v in vals), sum(len(vals) for _, vals in rows)
    desc = f"{total} pairs, {adverse} adverse (candidate slower); every value is in the table below."

    def mark(x: Callable[[float], float], y: float, vals: Sequence[float]) -> str:
        return "".join(
            f'<rect x="{x(v) - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="#b3361f" fill-opacity=".75"/>'
            if sign * v < 0
            else f'<circle cx="{x(v):.1f}" cy="{y:.1f}" r="4" fill="#1f5fa8" fill-opacity=".6"/>'
            for v in vals
        )

    return _plot(ident, title, desc, rows, 20, mark) if rows else ""
