"""Plimsoll: the load line for LLM serving fleets."""

__version__ = "0.1.0"
