"""`plimsoll autoscale`: what the generated scaler would have done on a recorded demand trace, against a static
fleet sized at the peak and an oracle.

The pure core, no I/O: `demand.py` (the demand CSV, parsed from text), `hpa.py` (the HorizontalPodAutoscaler's
decision as Kubernetes documents it), `fleet.py` (replicas over time and what they cost and missed), `replay.py`
(the scaler stepped through a trace) and `baselines.py`. May import `exporter/scaling.py` (the scaler spec it shares
with `generate/`), config/, core/ and the shared top-level modules; never sources/, daemon/ or another command.
"""
