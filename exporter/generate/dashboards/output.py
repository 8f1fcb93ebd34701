"""The dashboards as files, and their queries as data: `artifacts` (deterministic JSON), `queries` (every panel's
PromQL as written) and `render` (the variables substituted, so an expression runs against a plain Prometheus)."""

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from exporter.config import Config
from exporter.generate.artifact import Artifact
from exporter.generate.dashboards.capacity_plan import capacity_plan
from exporter.generate.dashboards.fleet import fleet
from exporter.generate.dashboards.instance import instance

# What `render` puts in place of each dashboard variable: every value, a rate window Prometheus accepts, and the
# dashboards' default time range.
RENDER_DEFAULTS: Mapping[str, str] = {
    "node": ".*",
    "model": ".*",
    "target": ".*",
    "__rate_interval": "5m",
    "__range": "6h",
}

DASHBOARDS = (
    ("dashboards/plimsoll-fleet.json", fleet),
    ("dashboards/plimsoll-instance.json", instance),
    ("dashboards/plimsoll-capacity-plan.json", capacity_plan),
)


def to_json(dashboard: g.Dashboard) -> str:
    """Deterministic JSON: sorted keys, fixed uid and panel ids, no timestamps."""
    return json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def artifacts(config: Config) -> list[Artifact]:
    return [Artifact(path, to_json(build(config))) for path, build in DASHBOARDS]


def _panels(dashboard: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(config: Config) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL) for every query of every panel, as written in the dashboards:
    with `$node`, `$model`, `$target` and `$__rate_interval` in them. Pass an expression through `render` to run
    it against Prometheus. The `ENGINE_HISTOGRAM_PANEL` queries read vLLM's series, not the daemon's."""
    found = []
    for item in artifacts(config):
        dashboard = json.loads(item.text)
        for panel in _panels(dashboard):
            for target in panel.get("targets", []):
                found.append((dashboard["title"], panel["title"], target["expr"]))
    return found


def render(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Substitute dashboard variables as Grafana would: `$model` etc. by `RENDER_DEFAULTS` (every value: `.*`, the
    regex Grafana sends for "All"), `$__rate_interval` by 5m, `$__range` by 6h; `variables` overrides any of them."""
    values = {**RENDER_DEFAULTS, **(variables or {})}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)
