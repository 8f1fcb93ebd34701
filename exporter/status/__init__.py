"""`plimsoll status`: command.py (its flags; the rest loads only when it runs), client.py (read a daemon's
/api/v1/state and print it), defaults.py. The rows' words are core/status_format.py, shared with the daemon's page.

May import core/, sources/ and the shared top-level modules; never daemon/ or another command.
"""
