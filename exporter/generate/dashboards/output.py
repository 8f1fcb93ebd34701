"""The dashboards as files: `artifacts`, deterministic JSON."""

import json

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from exporter.config import Config
from exporter.generate.artifact import Artifact
from exporter.generate.dashboards.capacity_plan import capacity_plan
from exporter.generate.dashboards.fleet import fleet
from exporter.generate.dashboards.instance import instance

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
