"""Pure capacity math: model architectures, GPU specs, weights, KV cache, activations, the memory plan of one
deployment, fleets and ranges. No I/O: presets and config.json files are read by exporter/catalog.py.

May import core/ and exporter/display.py; never config/, sources/, daemon/ or a command.
"""
