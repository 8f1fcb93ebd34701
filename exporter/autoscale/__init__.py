"""`plimsoll autoscale replay`: what the generated scaler would have done on a recorded demand trace, against a
static fleet sized at the peak and an oracle.

The pure core: `demand.py` (the demand CSV, parsed from text), `hpa.py` (the HorizontalPodAutoscaler's decision as
Kubernetes documents it), `fleet.py` (replicas over time and what they cost and missed), `replay.py` (the scaler
stepped through a trace) and `baselines.py`. The I/O: `prometheus.py` (the trace from Prometheus' range queries),
`command.py` (its arguments, the files it reads and writes) and `outputs.py` (the table and result.json).

May import `exporter/scaling.py` (the scaler spec it shares with `generate/`), config/, core/, sources/ and the
shared top-level modules; never daemon/ or another command.
"""
