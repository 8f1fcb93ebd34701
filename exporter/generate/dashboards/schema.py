"""grafanalib 0.7.1 gaps: the small subclasses that write Grafana's current schema for queries, gauges, bar gauges
and tables.

grafanalib 0.7.1 writes Grafana 6-era JSON for some panels (bar gauge options under `fieldOptions`, gauge reduce
options under `fieldConfig`, table mappings outside `fieldConfig`) and legacy query fields; these emit the current
schema instead, so Grafana runs no migration on the generated files (`schemaVersion` 39).
"""

from typing import Any

from grafanalib import core as g


class PromTarget(g.Target):
    """A Prometheus query in Grafana's current query model (grafanalib's adds legacy `step`, `intervalFactor`...)."""

    def to_json_data(self) -> dict[str, Any]:
        return {
            "datasource": self.datasource,
            "editorMode": "code",
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "legendFormat": self.legendFormat,
            "range": not self.instant,
            "refId": self.refId,
        }


def _gauge_field_config(panel: g.GaugePanel | g.BarGauge, **extra: Any) -> dict[str, Any]:
    """The fieldConfig current Grafana reads for gauges and bar gauges (grafanalib writes the Grafana 6 one)."""
    defaults = {
        "decimals": panel.decimals,
        "mappings": panel.valueMaps,
        "max": panel.max,
        "min": panel.min,
        "unit": panel.format,
        **extra,
    }
    return {"defaults": defaults, "overrides": []}


def _reduce_options(panel: g.GaugePanel | g.BarGauge) -> dict[str, Any]:
    return {"calcs": [panel.calc], "fields": "", "values": panel.allValues}


class Gauge(g.GaugePanel):
    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.panel_json(
            {
                "fieldConfig": _gauge_field_config(self),
                "options": {
                    "orientation": "auto",
                    "reduceOptions": _reduce_options(self),
                    "showThresholdLabels": self.thresholdLabels,
                    "showThresholdMarkers": self.thresholdMarkers,
                },
                "type": g.GAUGE_TYPE,
            }
        )
        return data


class BarGauge(g.BarGauge):
    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.panel_json(
            {
                "fieldConfig": _gauge_field_config(self, color={"mode": "thresholds"}),
                "options": {
                    "displayMode": self.displayMode,
                    "orientation": self.orientation,
                    "reduceOptions": _reduce_options(self),
                    "showUnfilled": True,
                    "valueMode": "color",
                },
                "type": g.BARGAUGE_TYPE,
            }
        )
        return data


class Table(g.Table):
    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.panel_json(
            {
                "fieldConfig": {
                    "defaults": {
                        "custom": {
                            "align": self.align,
                            "cellOptions": {"type": self.displayMode},
                            "filterable": self.filterable,
                        },
                        "mappings": self.mappings,
                        "unit": self.unit,
                    },
                    "overrides": self.overrides,
                },
                "options": {"showHeader": self.showHeader, "sortBy": self.sortBy},
                "type": g.TABLE_TYPE,
            }
        )
        return data
