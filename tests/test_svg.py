"""exporter/svg.py: a chart is a well-formed SVG whatever its series hold, an empty one, one point, all zeros, or a
reading that is no number (NaN, an infinity), which is left out rather than written into the drawing."""

import math
import xml.etree.ElementTree as ElementTree

import pytest

from exporter.svg import Axis, Marker, Reference, Series, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def _chart(points: tuple[tuple[float, float], ...], log2: bool = False, reference: float = 1.0) -> ElementTree.Element:
    text = line_chart(
        "a <title> & more",
        Axis("x", lambda value: f"{value:g}", log2=log2),
        Axis("y", lambda value: f"{value:g}"),
        [Series("s", points, "#000000")],
        [Reference("r", reference, "#111111")],
        Marker("m", 2.0, "#222222"),
    )
    assert "nan" not in text and "inf" not in text
    return ElementTree.fromstring(text)


@pytest.mark.parametrize("log2", [False, True])
@pytest.mark.parametrize(
    "points",
    [
        (),
        ((2.0, 3.0),),
        ((0.0, 0.0), (1.0, 0.0)),
        ((1.0, math.nan), (2.0, 3.0), (4.0, 5.0)),
        ((math.nan, 1.0), (2.0, 3.0)),
        ((1.0, math.inf), (2.0, 3.0)),
        ((-math.inf, 1.0), (2.0, 3.0)),
        ((1.0, 1.7e308), (2.0, 3.0)),  # a number an engine's page may hold, whose headroom would be infinite
    ],
)
def test_any_series_gives_a_well_formed_chart(points: tuple[tuple[float, float], ...], log2: bool) -> None:
    svg = _chart(points, log2)
    assert svg.tag == f"{SVG}svg"
    assert svg.findtext(f"{SVG}text") == "a <title> & more"


def test_only_the_points_that_are_numbers_are_drawn() -> None:
    svg = _chart(((1.0, math.nan), (2.0, 3.0), (4.0, 5.0), (8.0, math.inf)))
    (line,) = svg.iter(f"{SVG}polyline")
    assert len(line.attrib["points"].split()) == 2


def test_a_reference_that_is_no_number_is_left_out() -> None:
    svg = _chart(((1.0, 1.0), (2.0, 3.0)), reference=math.nan)
    assert not [line for line in svg.iter(f"{SVG}line") if line.attrib.get("class") == "reference"]


@pytest.mark.parametrize(
    ("levels", "ticks"),
    [
        ((15.0, 16.0, 20.0), [15.0, 16.0, 17.0, 18.0, 19.0, 20.0]),  # a search that started at the pool
        ((1.0, 15.0, 16.0, 20.0), [1.0, 2.0, 4.0, 8.0, 16.0]),  # one from 1: powers of two
    ],
)
def test_a_log2_axis_ticks_where_its_points_lie(levels: tuple[float, ...], ticks: list[float]) -> None:
    points = tuple((level, 1.0) for level in levels)
    axis = Axis("x", lambda value: f"{value:g}", log2=True)
    chart = ElementTree.fromstring(line_chart("t", axis, Axis("y", str), [Series("s", points, "#000000")]))
    x_ticks = [
        float(t.text or "")
        for t in chart.iter(f"{SVG}text")
        if t.get("class") == "tick" and t.get("text-anchor") == "middle"
    ]
    assert x_ticks == ticks
