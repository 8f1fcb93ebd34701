"""`plimsoll plan`: command.py (its flags and handler) and output.py (the answer as text or JSON). The deployment
flags it shares with `loadtest` are exporter/deployment_flags.py.

May import core/, capacity/, config/ and the shared top-level modules; never sources/, daemon/ or another command.
"""
