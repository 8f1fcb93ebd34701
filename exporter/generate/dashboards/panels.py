"""What every dashboard is built from: the data source, the label matchers, threshold steps read from the config,
panel builders (time series, stat, bar gauge, queries), the grid layout, the variables and the dashboard frame.

Every threshold helper here reads the value its alert reads (`rules` derives the horizon and gate), so a line
sits exactly where its alert fires.
"""

import re
from collections.abc import Iterable, Sequence
from typing import Any

import attr
from grafanalib import core as g

from exporter.config import Config
from exporter.generate.dashboards.schema import BarGauge, PromTarget
from exporter.generate.rules import saturation_gate_ratio, saturation_horizon_seconds

SCHEMA_VERSION = 39  # Grafana 10.3+/11: no migration runs on load
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["plimsoll"]

# Label matchers for the three kinds of series (docs/metrics.md): engine series carry target, engine, model and
# dp_rank; target health series carry target; GPU and daemon series carry neither. Prometheus adds `instance`.
ENGINE = 'instance=~"$node", target=~"$target", model=~"$model"'
TARGET = 'instance=~"$node", target=~"$target"'
NODE = 'instance=~"$node"'
# The per-model recording rules carry only `model` (and `source` where a capacity is behind them).
MODEL = 'model=~"$model"'
# The labels that tell engine instances apart across a fleet of daemons (target names may repeat across nodes).
INSTANCE_KEY = "instance, target, model, dp_rank"

SLO_TITLES = {"ttft": "TTFT", "itl": "ITL", "e2e": "End-to-end"}
SLO_MEANING = {
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "e2e": "end-to-end request latency",
}

# Value mappings: the daemon reports +Inf for "no saturation in sight"; Grafana shows the JSON number as Infinity.
NEVER = g.StatValueMappings(
    g.StatValueMappingItem("never", "+Inf", "green", 0),
    g.StatValueMappingItem("never", "Infinity", "green", 1),
)

# Where Grafana's variable syntax starts ($name, ${name}, [[name]]): it expands these in titles, descriptions and
# queries, and has no escape for them.
_GRAFANA_VARIABLE = re.compile(r"\$(?=[\w{])|\[(?=\[)")
_LOOK_ALIKE = {"$": "\uff04", "[": "\uff3b"}  # FULLWIDTH DOLLAR SIGN, FULLWIDTH LEFT SQUARE BRACKET
_PERCENT_ENCODED = {"$": "%24", "[": "%5B"}  # what a web server reads as the character itself

# A panel with its width and height on Grafana's 24-column grid, as `place` lays it out.
Cell = tuple[g.Panel, int, int]


# --- building blocks ------------------------------------------------------------------------------------------------


def steps(*levels: tuple[str, float | None]) -> list[dict[str, Any]]:
    """Threshold steps, lowest first; the first one is the base (value null)."""
    return [
        {"color": color, "value": None if i == 0 or value is None else float(value)}
        for i, (color, value) in enumerate(levels)
    ]


def num(value: float) -> str:
    """A number as PromQL reads it: 0.99, 14.4, 900."""
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def seconds_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3600:g} h"


def percent_text(ratio: float) -> str:
    # Twelve digits, not six: an objective of seven nines is 99.99999%, never 100%.
    return f"{ratio * 100:.12g}%"


def shown_in_grafana(text: str) -> str:
    """Text from the config (a model name, the exporter's job regex) for a panel description, which Grafana renders
    as Markdown after expanding variables in it: a code span, so that Markdown leaves it as written (".*plimsoll.*"
    would lose its stars to italics), with the "$" or "[" that would start a variable as its full-width look-alike."""
    literal = _GRAFANA_VARIABLE.sub(lambda match: _LOOK_ALIKE[match.group()], text)
    fence = "`" * (max(map(len, re.findall("`+", literal)), default=0) + 1)  # longer than any run of ` in the text
    pad = " " if literal.startswith("`") or literal.endswith("`") else ""
    return f"{fence}{pad}{literal}{pad}{fence}"


def _literal_url(url: str) -> str:
    """A URL from the config for a dashboard link, where Grafana expands variables too: each "$" or "[" that would
    start one percent-encoded (a look-alike, as shown_in_grafana writes, would lead to another page)."""
    return _GRAFANA_VARIABLE.sub(lambda match: _PERCENT_ENCODED[match.group()], url)


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False) -> PromTarget:
    return PromTarget(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format=g.TABLE_TARGET_FORMAT if table else g.TIME_SERIES_TARGET_FORMAT,
        datasource=DATASOURCE,
    )


def refs(queries: Sequence[tuple[str, str]], *, instant: bool = False, table: bool = False) -> list[PromTarget]:
    """(expr, legend) pairs as queries A, B, C..."""
    return [
        query(expr, legend, chr(ord("A") + i), instant=instant, table=table) for i, (expr, legend) in enumerate(queries)
    ]


def timeseries(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    thresholds: list[dict[str, Any]] | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    stacked: bool = False,
    log: int | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> g.TimeSeries:
    return g.TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=refs(queries),
        unit=unit,
        thresholds=thresholds or steps(("green", None)),
        thresholdsStyleMode="line" if thresholds else "off",
        valueMin=minimum,
        valueMax=maximum,
        fillOpacity=30 if stacked else 0,
        stacking={"group": "A", "mode": "normal"} if stacked else {"group": "A", "mode": "none"},
        scaleDistributionType="log" if log else "linear",
        scaleDistributionLog=log or 2,
        overrides=overrides or [],
        legendDisplayMode="list",
        tooltipMode="multi",
        tooltipSort="desc",
        maxDataPoints=None,
    )


def stat(
    title: str,
    description: str,
    expr: str,
    unit: str,
    thresholds: list[dict[str, Any]],
    *,
    mappings: list[Any] | None = None,
    legend: str = "",
    no_value: str = "no data",
) -> g.Stat:
    return g.Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[query(expr, legend)],
        format=unit,
        thresholds=thresholds,
        mappings=mappings or [],
        reduceCalc="lastNotNull",
        graphMode="area",
        colorMode="value",
        noValue=no_value,
        maxDataPoints=None,
    )


def bargauge(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    thresholds: list[dict[str, Any]],
    *,
    maximum: float | None = None,
) -> BarGauge:
    return BarGauge(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=refs(queries, instant=True),
        format=unit,
        thresholds=thresholds,
        calc="lastNotNull",
        displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT,
        orientation=g.ORIENTATION_HORIZONTAL,
        min=0,
        max=maximum,
        maxDataPoints=None,
    )


def eta_thresholds(config: Config) -> list[dict[str, Any]]:
    """Red inside the "saturation ahead" alert's horizon, orange within twice it."""
    horizon = saturation_horizon_seconds(config)
    return steps(("red", None), ("orange", horizon), ("green", 2 * horizon))


def horizon_text(config: Config) -> str:
    hold = config.alerting.saturation_ahead_for_seconds
    return (
        f"{seconds_text(saturation_horizon_seconds(config))} (the lead time, "
        f"{seconds_text(config.lead_time_seconds)}, plus the alert's {seconds_text(hold)} hold)"
    )


def usage_thresholds(config: Config) -> list[dict[str, Any]]:
    """Orange above the gate where a rising trend may page, red at the saturation threshold."""
    return steps(("green", None), ("orange", saturation_gate_ratio(config)), ("red", config.saturation_kv_usage))


def headroom_thresholds(config: Config) -> list[dict[str, Any]]:
    """Red under the floor of the fleet headroom alert."""
    return steps(("red", None), ("green", config.alerting.fleet_headroom_min_requests))


def place(sections: Iterable[tuple[str | None, Sequence[Cell]]]) -> list[g.Panel]:
    """Lay panels out left to right on Grafana's 24-column grid, a row header before each titled section."""
    placed: list[g.Panel] = []
    y = 0
    for title, items in sections:
        if not items:
            continue
        if title:
            placed.append(g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=24, x=0, y=y)))
            y += 1
        x = row_height = 0
        for panel, width, height in items:
            if x + width > 24:
                y, x, row_height = y + row_height, 0, 0
            placed.append(attr.evolve(panel, gridPos=g.GridPos(h=height, w=width, x=x, y=y)))
            x, row_height = x + width, max(row_height, height)
        y += row_height
    return placed


def _variables() -> list[g.Template]:
    datasource = g.Template(
        name="datasource",
        label="Data source",
        type="datasource",
        query="prometheus",
        includeAll=False,
        multi=False,
        regex="",
    )
    everything = {"selected": True, "text": ["All"], "value": ["$__all"]}
    variables = [datasource]
    for name, label, query in (
        ("node", "Node", "label_values(plimsoll_build_info, instance)"),
        ("model", "Model", 'label_values(plimsoll_requests_running{instance=~"$node"}, model)'),
        ("target", "Target", 'label_values(plimsoll_target_up{instance=~"$node"}, target)'),
    ):
        variable = g.Template(
            name=name,
            label=label,
            query=query,
            dataSource=DATASOURCE,
            multi=True,
            includeAll=True,
            allValue=".*",
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
            sort=g.SORT_ALPHA_ASC,
            regex="",
        )
        variable._current = dict(everything)  # "All" selected until the user picks (grafanalib has no parameter)
        variables.append(variable)
    return variables


def dashboard(uid: str, title: str, description: str, panels: list[g.Panel], runbook_url: str) -> g.Dashboard:
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=TAGS,
        panels=panels,
        templating=g.Templating(list=_variables()),
        links=[
            g.DashboardLink(title="Plimsoll", tags=TAGS, asDropdown=True, includeVars=True, keepTime=True),
            g.DashboardLink(
                title="Runbook",
                type="link",
                uri=_literal_url(runbook_url),
                tooltip="What each Plimsoll alert means and what to do",
                targetBlank=True,
                keepTime=False,
            ),
        ],
        time=g.Time("now-6h", "now"),
        refresh="30s",
        timezone="browser",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
        editable=True,
    ).auto_panel_ids()
