"""What `plimsoll status` falls back on: the daemon's address and the environment variable holding its password.
Shared by the command's flags (exporter/status/command.py) and the client that uses them (exporter/status/client.py),
without either loading the other."""

DEFAULT_URL = "http://127.0.0.1:19842"
PASSWORD_ENV = "PLIMSOLL_STATUS_PASSWORD"
