"""Grafana dashboards, built with grafanalib from the config's SLOs, saturation threshold and lead time.

Every threshold line that mirrors an alert reads the value the alert reads: the config's `alerting:` section
(drift ratio, fleet headroom floor, VRAM growth limit, the saturation gate, hold and trend window, the exporter's
job, the runbook) and the horizon and gate that `rules` derives from it, so a line sits exactly where its alert
fires.

Three dashboards, each answering one kind of question:

- `plimsoll-fleet`: how much room is left per model across every node, what saturates first, which SLOs burn,
  where the capacity model is off, and whether the daemons see their targets and GPUs;
- `plimsoll-instance`: one node or target up close: KV usage against the saturation threshold and capacity,
  queue and preemptions, the latency SLIs against their objectives, request footprint, GPU memory used against
  what the capacity model explains;
- `plimsoll-capacity-plan`: the capacity model's breakdown per target (weights, KV bytes per token, activation,
  overhead, KV capacity engine vs model), for the people who size the fleet.

Queries use the daemon's own series (docs/metrics.md) and Prometheus' `up` of its scrape jobs, so the dashboards
work the moment Prometheus scrapes a daemon. Two exceptions, each saying so: the daemon exports SLI counters, not
latency histograms, so latency quantiles come from vLLM's own `vllm:*_bucket` series (`ENGINE_HISTOGRAM_PANEL`);
and the fleet dashboard's "Replicas and cost" row, there only where the config has an `autoscaling:` section or
prices, reads the replica and cost recording rules by name, so it shows exactly what the scalers, the
over-provisioning ticket and the cost records compute. Those records are per model: only the Model variable
applies to them.

Every query filters on the dashboard variables with regex matchers (`instance=~"$node"`, `target=~"$target"`,
`model=~"$model"`; "All" is `.*`) and rates over `$__rate_interval`, but for the scale-up lag, rare enough to be
counted over the whole time range (`$__range`).

grafanalib 0.7.1 writes Grafana 6-era JSON for some panels (bar gauge options under `fieldOptions`, gauge reduce
options under `fieldConfig`, table mappings outside `fieldConfig`) and legacy query fields; the small subclasses
in `schema` emit the current schema instead, so Grafana runs no migration on these files (`schemaVersion` 39).

The package, one module per concern:

- `fleet`, `instance`, `capacity_plan`: one dashboard each, one function per row;
- `panels`: the shared vocabulary (data source, label matchers, SLO names), panel builders, thresholds read from
  the config, the grid layout, the variables and the dashboard frame;
- `expressions`: PromQL the dashboards build from parts (SLIs, burn rates, the capacity model's parts);
- `schema`: the grafanalib subclasses above;
- `output`: the files (`artifacts`).
"""

from exporter.generate.dashboards.instance import ENGINE_HISTOGRAM_PANEL, VLLM_HISTOGRAMS
from exporter.generate.dashboards.output import artifacts
from exporter.generate.dashboards.panels import DATASOURCE, ENGINE

__all__ = ["DATASOURCE", "ENGINE", "ENGINE_HISTOGRAM_PANEL", "VLLM_HISTOGRAMS", "artifacts"]
