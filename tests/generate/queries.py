"""Every PromQL expression the generated files hold, as data the tests run against promtool and a real Prometheus:
each rule's expression, and each dashboard panel's query as written and with Grafana's variables substituted."""

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from exporter.config import Config
from exporter.generate import dashboards, rules

# What `render` puts in place of each dashboard variable: every value, a rate window Prometheus accepts, and the
# dashboards' default time range.
RENDER_DEFAULTS: Mapping[str, str] = {
    "node": ".*",
    "model": ".*",
    "target": ".*",
    "__rate_interval": "5m",
    "__range": "6h",
}


def rule_expressions(config: Config) -> list[tuple[str, str, str]]:
    """(group, rule name, expression) for every recording and alerting rule."""
    return [
        (group["name"], rule.get("record") or rule["alert"], rule["expr"])
        for group in rules.groups(config)
        for rule in group["rules"]
    ]


def _panels(dashboard: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_queries(config: Config) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL) for every query of every panel, as written in the dashboards: with
    `$node`, `$model`, `$target` and `$__rate_interval` in them. Pass an expression through `render` to run it
    against Prometheus. The `ENGINE_HISTOGRAM_PANEL` queries read vLLM's series, not the daemon's."""
    found = []
    for item in dashboards.artifacts(config):
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
