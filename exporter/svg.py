"""Line charts as inline SVG text, drawn in Python so the reports (loadtest's, autoscale replay's) need no script
and no network.

One chart shape serves every plot: lines with point markers over a linear or log2 x axis, labelled axes with units,
horizontal reference lines (an SLO, a threshold), one vertical marker (the knee) and shaded areas (demand above
capacity).
"""

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from html import escape

WIDTH, HEIGHT = 560, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 34, 48
_LEGEND_ROW = 16
_SHADE_MIN = 4
PLOT_WIDTH = WIDTH - _LEFT - _RIGHT  # pixels across the plot: finer detail than this cannot show

# The page around the charts, the same in both reports: the frame, the chart grid and the tables; each report adds
# its own rules after these.
PAGE_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1b1b; margin: 0;
       background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 40px; }
h1 { font-size: 22px; margin: 0 0 4px; }
.notes { background: #fff8e5; border: 1px solid #e6c96b; border-radius: 6px; padding: 8px 16px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 14px; }
.charts figure { margin: 0; background: #fff; border: 1px solid #d8dce2; border-radius: 6px; padding: 6px; }
svg.chart { display: block; max-width: 100%; height: auto; font-family: inherit; }
svg .title { font-size: 14px; font-weight: 600; fill: #1b1b1b; }
svg .tick, svg .legend { font-size: 11px; fill: #444; }
svg .label { font-size: 12px; fill: #1b1b1b; }
svg .grid { stroke: #e5e7eb; stroke-width: 1; }
svg .axis { stroke: #888; stroke-width: 1; }
svg .series { fill: none; stroke-width: 2; }
svg .series.thin { stroke-width: 1.25; }
svg .reference { stroke-width: 1.5; stroke-dasharray: 3 3; }
div.table { overflow-x: auto; }
table { border-collapse: collapse; background: #fff; width: 100%; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d8dce2; padding: 4px 8px; text-align: right; white-space: nowrap; }
th { background: #eef0f3; font-weight: 600; }
"""


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]  # (x, y), drawn in this order
    color: str
    dashed: bool = False
    dots: bool = True  # a marker on each point of a sparse line; off for a step line's corners
    thin: bool = False  # a line to compare against (a baseline), drawn lighter than the ones it is compared with


@dataclass(frozen=True)
class Reference:
    """A horizontal line at a y value (an objective, an SLO, a threshold)."""

    label: str
    value: float
    color: str


@dataclass(frozen=True)
class Axis:
    label: str  # with its unit, e.g. "TTFT (ms)"
    format_tick: Callable[[float], str]
    log2: bool = False
    minimum: float | None = None  # forced ends; else from the data and references
    maximum: float | None = None
    whole: bool = False  # counts of things (replicas): ticks on whole numbers only


@dataclass(frozen=True)
class Marker:
    """A vertical line at an x value (the knee)."""

    label: str
    value: float
    color: str


@dataclass(frozen=True)
class Shade:
    """Areas filled under the lines, each (x from, x to, y from, y to) in the data's units."""

    label: str
    boxes: tuple[tuple[float, float, float, float], ...]
    color: str


def line_chart(
    title: str,
    x: Axis,
    y: Axis,
    series: Sequence[Series],
    references: Sequence[Reference] = (),
    marker: Marker | None = None,
    shade: Shade | None = None,
) -> str:
    series = [replace(s, points=_drawable(s.points, x.log2)) for s in series]
    references = [reference for reference in references if math.isfinite(reference.value)]
    if marker is not None and not _drawable(((marker.value, 0.0),), x.log2):
        marker = None
    xs = [px for s in series for px, _ in s.points] + ([marker.value] if marker else [])
    ys = [py for s in series for _, py in s.points] + [r.value for r in references]
    x_low, x_high = _range(xs, x)
    y_low, y_high = _range(ys, y)
    legend_rows = math.ceil((len(series) + len(references) + (1 if marker else 0) + (1 if shade else 0)) / 3)
    height = HEIGHT + legend_rows * _LEGEND_ROW + 6
    plot_bottom = HEIGHT - _BOTTOM

    def sx(value: float) -> float:
        if x.log2:
            span = math.log2(x_high) - math.log2(x_low)
            return _LEFT + (math.log2(value) - math.log2(x_low)) / span * (WIDTH - _LEFT - _RIGHT)
        return _LEFT + (value - x_low) / (x_high - x_low) * (WIDTH - _LEFT - _RIGHT)

    def sy(value: float) -> float:
        return plot_bottom - (value - y_low) / (y_high - y_low) * (plot_bottom - _TOP)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" role="img" aria-label="{escape(title)}">',
        f'<text class="title" x="{_LEFT}" y="20">{escape(title)}</text>',
    ]
    for tick in _ticks(y_low, y_high, log2=False, whole=y.whole):
        ty = sy(tick)
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}"/>')
        parts.append(
            f'<text class="tick" x="{_LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end">{y.format_tick(tick)}</text>'
        )
    for tick in _ticks(x_low, x_high, log2=x.log2, whole=x.whole):
        tx = sx(tick)
        parts.append(f'<line class="axis" x1="{tx:.1f}" x2="{tx:.1f}" y1="{plot_bottom}" y2="{plot_bottom + 4}"/>')
        parts.append(
            f'<text class="tick" x="{tx:.1f}" y="{plot_bottom + 17}" text-anchor="middle">{x.format_tick(tick)}</text>'
        )
    parts.append(f'<line class="axis" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{plot_bottom}" y2="{plot_bottom}"/>')
    parts.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{plot_bottom}"/>')
    parts.append(
        f'<text class="label" x="{(_LEFT + WIDTH - _RIGHT) / 2}" y="{plot_bottom + 36}" '
        f'text-anchor="middle">{escape(x.label)}</text>'
    )
    middle = (_TOP + plot_bottom) / 2
    parts.append(
        f'<text class="label" x="14" y="{middle}" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle})">{escape(y.label)}</text>'
    )
    for reference in references:
        ry = sy(reference.value)
        parts.append(
            f'<line class="reference" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{ry:.1f}" y2="{ry:.1f}" '
            f'stroke="{reference.color}"/>'
        )
    if marker is not None:
        mx = sx(marker.value)
        parts.append(
            f'<line class="marker" x1="{mx:.1f}" x2="{mx:.1f}" y1="{_TOP}" y2="{plot_bottom}" stroke="{marker.color}"/>'
        )
    for s in series:
        if not s.points:
            continue
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        path = " ".join(f"{sx(px):.1f},{sy(py):.1f}" for px, py in s.points)
        kind = "series thin" if s.thin else "series"
        parts.append(f'<polyline class="{kind}" points="{path}" stroke="{s.color}"{dash}/>')
        if s.dots and len(s.points) <= 16:  # markers on sparse lines only: a time series would be a smear of dots
            parts.extend(f'<circle cx="{sx(px):.1f}" cy="{sy(py):.1f}" r="3" fill="{s.color}"/>' for px, py in s.points)
    if shade is not None and shade.boxes:
        # Over the lines, which would hide a narrow box; one path for all (a week's overflow is hundreds of boxes),
        # each at least _SHADE_MIN pixels wide: a minute of overflow in a week is a tenth of a pixel.
        boxes = " ".join(
            f"M{sx(x0):.1f},{sy(y0):.1f}H{max(sx(x1), sx(x0) + _SHADE_MIN):.1f}V{sy(y1):.1f}H{sx(x0):.1f}Z"
            for x0, x1, y0, y1 in shade.boxes
        )
        parts.append(f'<path class="shade" d="{boxes}" fill="{shade.color}" fill-opacity="0.5"/>')
    parts.extend(_legend(series, references, marker, shade, HEIGHT + 8))
    parts.append("</svg>")
    return "\n".join(parts)


def _drawable(points: Sequence[tuple[float, float]], log2: bool) -> tuple[tuple[float, float], ...]:
    """The points a chart can place: a NaN or an infinity (a reading an engine gave) has no place on an axis and
    would write "nan" into the SVG; on a log2 axis, neither has an x at or below 0 (it has no logarithm)."""
    return tuple((px, py) for px, py in points if math.isfinite(px) and math.isfinite(py) and (px > 0 or not log2))


def _legend(
    series: Sequence[Series], references: Sequence[Reference], marker: Marker | None, shade: Shade | None, top: float
) -> list[str]:
    # (label, colour, the line's dash pattern, or None for a filled box, the line's width)
    entries: list[tuple[str, str, str | None, float]] = [
        (s.label, s.color, "6 4" if s.dashed else "", 1.5 if s.thin else 2.5) for s in series
    ]
    entries += [(r.label, r.color, "3 3", 2.5) for r in references]
    if marker is not None:
        entries.append((marker.label, marker.color, "2 3", 2.5))
    if shade is not None:
        entries.append((shade.label, shade.color, None, 2.5))
    parts = []
    column_width = (WIDTH - _LEFT) / 3
    for index, (label, color, dash, stroke_width) in enumerate(entries):
        row, column = divmod(index, 3)
        left = _LEFT + column * column_width
        y = top + row * _LEGEND_ROW
        dash_attribute = f' stroke-dasharray="{dash}"' if dash else ""
        if dash is None:
            parts.append(f'<rect x="{left:.1f}" y="{y - 9}" width="18" height="10" fill="{color}" fill-opacity="0.5"/>')
        else:
            parts.append(
                f'<line x1="{left:.1f}" x2="{left + 18:.1f}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
                f'stroke-width="{stroke_width:g}"{dash_attribute}/>'
            )
        parts.append(f'<text class="legend" x="{left + 24:.1f}" y="{y}">{escape(label)}</text>')
    return parts


def _range(values: Sequence[float], axis: Axis) -> tuple[float, float]:
    low = axis.minimum if axis.minimum is not None else min(values, default=0.0)
    high = axis.maximum if axis.maximum is not None else max(values, default=1.0)
    if axis.log2:
        low, high = max(low, 1.0), max(high, 1.0)
        # One step (or every step at one concurrency) still gets an axis: half to double around it.
        return (low / 2, high * 2) if low == high else (low, high)
    if axis.minimum is None:
        low = min(low, 0.0)  # quantities here are non-negative: a zero baseline keeps charts honest
    if axis.maximum is None:
        # Headroom above the highest point, never past the largest float (an engine's page may hold 1.7e308, and an
        # infinite axis has no ticks); a flat zero still gets 0..1.
        high = min(high + (high - low) * 0.08, sys.float_info.max) or 1.0
    return low, high


def _ticks(low: float, high: float, *, log2: bool, whole: bool) -> list[float]:
    if log2:
        first, last = math.ceil(math.log2(low)), math.floor(math.log2(high))
        if last - first >= 2:
            return [2.0**power for power in range(first, last + 1)]
        # Under a factor of four (a load test's levels 15, 16 and 20) one power of two or none falls inside:
        # evenly spaced whole numbers say where the points lie.
        whole = True
    raw = (high - low) / 5
    if whole:
        raw = max(raw, 1.0)  # ticks closer than 1 apart cannot all fall on whole numbers
    magnitude = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if whole else (1, 2, 2.5, 5, 10)  # 2.5 apart would put ticks between whole numbers
    step = next(m * magnitude for m in steps if m * magnitude >= raw)
    start = math.ceil(low / step) * step
    count = int((high - start) / step + 1e-9) + 1
    return [start + i * step for i in range(count)]
