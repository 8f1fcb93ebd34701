"""Helpers shared by the integration tests and the demo: real parts started locally (a vLLM CPU engine)."""
