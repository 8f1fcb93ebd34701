"""`plimsoll generate`: Prometheus rules, Prometheus Operator monitors, scalers and Grafana dashboards from the config.

Each generator (rules, monitors, autoscaling, dashboards/) returns `Artifact`s, a path relative to the output
directory and its text; command.py owns the command's arguments and writes or checks the artifacts. May import
config/, core/, capacity/ and the shared top-level modules; never sources/, daemon/ or another command.
"""
