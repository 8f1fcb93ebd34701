"""`plimsoll status [URL]`: its flags. The work is in exporter/status/client.py, loaded only when the command
runs (rich, aiohttp and the daemon's fetch cost every other command nothing)."""

import argparse

from exporter.cli_args import Formatter, Subcommands, duration_arg
from exporter.status.defaults import DEFAULT_URL, PASSWORD_ENV


def _status(args: argparse.Namespace) -> int:
    from exporter.status.client import run_status

    return run_status(args)


def add_status(commands: Subcommands) -> None:
    p = commands.add_parser(
        "status",
        help="a running daemon's status page in the terminal",
        formatter_class=Formatter,
        description="Prints the rows of a daemon's status page (one per engine instance, then its GPUs) from its "
        f"/api/v1/state. Exit 1 when the daemon cannot be read. For a daemon behind --web-config: --ca-file, and "
        f"--basic-auth-user with the password in {PASSWORD_ENV} or --password-file.",
    )
    p.add_argument("url", nargs="?", default=DEFAULT_URL, metavar="URL", help=f"the daemon (default {DEFAULT_URL})")
    p.add_argument("--watch", action="store_true", help="refresh in place every --interval until Ctrl-C")
    p.add_argument("--interval", type=duration_arg, default="2s", help="refresh period with --watch, e.g. 2s")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.add_argument("--timeout", type=duration_arg, default="5s", help="how long to wait for the daemon")
    p.add_argument("--ca-file", metavar="FILE", help="CA certificate(s) that signed the daemon's TLS certificate")
    p.add_argument("--basic-auth-user", metavar="USER", help="user for the daemon's basic auth")
    p.add_argument("--password-file", metavar="FILE", help=f"a file holding the password (else {PASSWORD_ENV})")
    p.set_defaults(handler=_status)
