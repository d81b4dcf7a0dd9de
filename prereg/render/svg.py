"""The study page's plots: inline SVG with a title and a text description, no script or request."""

from __future__ import annotations

from collections.abc import Callable

from prereg.render.model import esc as _e


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    raw = span / max(n, 1)
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = -(-lo // step) * step
    out, t = [], first
    while t <= hi + 1e-12:
        out.append(round(t, 10))
        t += step
    return out


def _axis(values: list[float]) -> tuple[float, float]:
    lo, hi = min([*values, 0.0]), max([*values, 0.0])
    pad = (hi - lo) * 0.08 or 1.0
    return lo - pad, hi + pad


WIDTH, LEFT, RIGHT, ROW_H = 720, 190, 30, 30
#: A generous width per character of a 12 px sans-serif label (wider than any such font's average),
#: so the label column fits its longest label (the browser test measures the drawn labels).
CHAR_W = 7.4


def label_width(labels: list[str]) -> int:
    """The label column's width: the default, or wide enough for the longest label."""
    return max(LEFT, int(CHAR_W * max((len(t) for t in labels), default=0)) + 20)


def _frame(
    ident: str, title: str, desc: str, values: list[float], labels: list[str], top: int, unit: str
) -> tuple[list[str], Callable[[float], float], int, int]:
    """An SVG plot's opening, title and description, grid ticks and dashed zero line over ``values``,
    a row per label, the label column as wide as its longest label needs (the plot's width grows
    with it); returns the parts, the x scale, the height and the label column's width."""
    height = top + ROW_H * len(labels) + 30
    lo, hi = _axis(values)
    left = label_width(labels)
    width = WIDTH - LEFT + left

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - RIGHT)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-labelledby="{ident}-t {ident}-d" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-size="12">',
        f'<title id="{ident}-t">{_e(title)}</title>',
        f'<desc id="{ident}-d">{_e(desc)}</desc>',
    ]
    for t in _ticks(lo, hi):
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{top - 8}" x2="{x(t):.1f}" y2="{height - 24}" stroke="#e4e4e4"/>'
            f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">{t:g}{unit}</text>'
        )
    parts.append(
        f'<line x1="{x(0):.1f}" y1="{top - 12}" x2="{x(0):.1f}" y2="{height - 24}" stroke="#555" '
        'stroke-dasharray="4 3"/>'
    )
    return parts, x, height, left


def forest_svg(
    ident: str, title: str, rows: list[tuple[str, float | None, float | None, float | None]], unit: str = "%"
) -> str:
    """Estimates with intervals, a line at zero: ``rows`` (label, estimate, low, high); a None drops a row."""
    shown = [(t, e, lo, hi) for t, e, lo, hi in rows if e is not None and lo is not None and hi is not None]
    if not shown:
        return ""
    top = 34
    desc = "; ".join(f"{r[0]}: {r[1]:.2f}{unit} ({r[2]:.2f} to {r[3]:.2f}{unit})" for r in shown)
    values = [v for r in shown for v in r[1:]]
    parts, x, _, left = _frame(ident, title, desc, values, [r[0] for r in shown], top, unit)
    for i, (label, est, low, high) in enumerate(shown):
        y = top + ROW_H * i + ROW_H / 2
        color = "#1f5fa8" if low > 0 else ("#b3361f" if high < 0 else "#555")
        parts.append(
            f'<text x="{left - 10}" y="{y + 4:.1f}" text-anchor="end">{_e(label)}</text>'
            f'<line x1="{x(low):.1f}" y1="{y:.1f}" x2="{x(high):.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-width="2"/><circle cx="{x(est):.1f}" cy="{y:.1f}" r="4.5" fill="{color}"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def pairs_svg(ident: str, title: str, rows: list[tuple[str, list[float]]]) -> str:
    """Every pair's time reduction (%), one row per configuration; adverse pairs (below 0) in red squares."""
    rows = [(label, vals) for label, vals in rows if vals]
    if not rows:
        return ""
    top = 20
    adverse = sum(v < 0 for _, vals in rows for v in vals)
    total = sum(len(vals) for _, vals in rows)
    desc = f"{total} pairs, {adverse} adverse (candidate slower); every value is in the table below."
    values = [v for _, vals in rows for v in vals]
    parts, x, _, left = _frame(ident, title, desc, values, [label for label, _ in rows], top, "%")
    for i, (label, vals) in enumerate(rows):
        y = top + ROW_H * i + ROW_H / 2
        parts.append(f'<text x="{left - 10}" y="{y + 4:.1f}" text-anchor="end">{_e(label)}</text>')
        for v in vals:
            if v < 0:
                parts.append(
                    f'<rect x="{x(v) - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="#b3361f" '
                    'fill-opacity=".75"/>'
                )
            else:
                parts.append(f'<circle cx="{x(v):.1f}" cy="{y:.1f}" r="4" fill="#1f5fa8" fill-opacity=".6"/>')
    parts.append("</svg>")
    return "".join(parts)
