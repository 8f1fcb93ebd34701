"""`plimsoll run` and `plimsoll check-config`: command.py (their arguments), poll.py (the poll loop), snapshot.py,
scale_up.py (each autoscaled model's scale-up lag, fed from the targets' states), collector.py and views.py
(/metrics, /api/v1/state and the page), server.py and web_config.py (the port, TLS, auth).

May import core/, capacity/, config/, sources/ and the shared top-level modules (catalog, cost, target_model,
metrics_list, cli_args, display, files); never another command.
"""
