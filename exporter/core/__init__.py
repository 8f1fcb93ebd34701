"""The pure core, no I/O: headroom of an instance, SLO counters and burn rates, the saturation trend, the scale-up
lag (scale_up), sizes and durations, and the words the status page and `plimsoll status` share (status_format).

Imports nothing of exporter outside core/: every other package may import it.
"""
