"""Server-rendered SVG charts: no script, no external asset, readable offline and by screen readers
(each chart has a title, a description and a table of the same numbers beside it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 180
LEFT, BOTTOM, TOP = 44, 22, 8
OUTCOME_COLOURS = {
    "ok": "#1a7f37",
    "failed": "#cf222e",
    "retry": "#9a6700",
    "error": "#8250df",
    "snoozed": "#0969da",
    "expired": "#57606a",
}
LINE_COLOURS = {"p50": "#0969da", "p95": "#9a6700"}


@dataclass(frozen=True)
class Series:
    name: str
    values: list[float | None]


def _scale(peak: float) -> float:
    """A round top for the y axis at or above ``peak`` (1, 2, 2.5 or 5 times a power of ten)."""
    magnitude = 10.0 ** math.floor(math.log10(max(peak, 1.0)))
    for step in (1, 2, 2.5, 5, 10):
        if magnitude * step >= peak:
            return magnitude * step
    return magnitude * 10


def _frame(title: str, description: str, top: float, unit: str, minutes: list[datetime]) -> list[str]:
    plot_h = HEIGHT - BOTTOM - TOP
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-labelledby="t-{id(minutes)}">',
        f'<title id="t-{id(minutes)}">{escape(title)}</title><desc>{escape(description)}</desc>',
    ]
    for fraction in (0, 0.5, 1):
        y = TOP + plot_h * (1 - fraction)
        label = f"{top * fraction:g}{unit}"
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
    if minutes:
        for index, anchor in ((0, "start"), (len(minutes) // 2, "middle"), (len(minutes) - 1, "end")):
            x = LEFT + (WIDTH - LEFT) * (index + 0.5) / len(minutes)
            label = minutes[index].strftime("%H:%M")
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}">{label}</text>')
    return parts


def stacked_bars(
    title: str,
    minutes: list[datetime],
    counts: list[dict[str, int]],
    order: tuple[str, ...],
    span: str = "the last hour",
) -> Markup:
    """Bars (one per minute, or per point of a longer ``span``) stacked by outcome, in ``order``."""
    peak = max((sum(c.values()) for c in counts), default=0)
    top = _scale(max(peak, 1))
    total = sum(sum(c.values()) for c in counts)
    parts = _frame(title, f"{total} deliveries in {span}", top, "", minutes)
    plot_h = HEIGHT - BOTTOM - TOP
    slot = (WIDTH - LEFT) / max(len(minutes), 1)
    for index, (minute, count) in enumerate(zip(minutes, counts, strict=True)):
        base: float = TOP + plot_h
        for outcome in order:
            colour = OUTCOME_COLOURS.get(outcome, "#57606a")
            n = count.get(outcome, 0)
            if not n:
                continue
            h = plot_h * n / top
            base -= h
            x = LEFT + slot * index + 1
            parts.append(
                f'<rect x="{x:.1f}" y="{base:.1f}" width="{max(slot - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{minute:%H:%M} {outcome}: {n}</title></rect>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def lines(title: str, minutes: list[datetime], series: list[Series], unit: str = " ms") -> Markup:
    """One polyline per series over the minutes; gaps where a minute has no value."""
    peak = max((v for s in series for v in s.values if v is not None), default=0.0)
    top = _scale(max(peak, 1.0))
    parts = _frame(title, f"highest {peak:.0f}{unit}", top, "", minutes)
    plot_h = HEIGHT - BOTTOM - TOP
    slot = (WIDTH - LEFT) / max(len(minutes), 1)
    for s in series:
        colour = LINE_COLOURS.get(s.name, "#000")
        points = []
        for index, value in enumerate(s.values):
            if value is None:
                continue
            x = LEFT + slot * (index + 0.5)
            y = TOP + plot_h * (1 - value / top)
            points.append(f"{x:.1f},{y:.1f}")
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{colour}"/>')
        if len(points) > 1:
            joined = " ".join(points)
            parts.append(f'<polyline points="{joined}" fill="none" stroke="{colour}" stroke-width="2"/>')
    parts.append("</svg>")
    return Markup("".join(parts))
