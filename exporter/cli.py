"""The `plimsoll` command: builds the top parser, asks each command's package to add its subcommand and arguments,
and calls the chosen command's function.

Exit codes: 0 an answer (a plan that does not fit is an answer), 2 bad input (the message says which flag,
file or field, and what to do), 130 stopped by Ctrl-C; any other is a command's own (1 where `probe` or `status`
could read nothing, as their --help says).
"""

import argparse
import sys
from collections.abc import Callable, Sequence

from exporter import __version__, probe
from exporter.autoscale.command import add_autoscale
from exporter.capacity import quantization
from exporter.capacity.architecture import ModelConfigError
from exporter.capacity.kv import KvDtypeError
from exporter.capacity.plan import PlanError
from exporter.capacity.weights import DtypeError
from exporter.catalog import CatalogError
from exporter.cli_args import EXIT_INTERRUPTED, EXIT_OK, Parser, Subcommands
from exporter.config import ConfigError
from exporter.daemon.command import add_check_config, add_run
from exporter.display import shown
from exporter.generate.command import add_generate
from exporter.loadtest.arguments import add_loadtest
from exporter.plan.command import add_plan
from exporter.status.command import add_status

EXIT_USAGE = 2

_INPUT_ERRORS = (
    CatalogError,
    ConfigError,
    ModelConfigError,
    PlanError,
    DtypeError,
    KvDtypeError,
    quantization.QuantizationError,
    ValueError,
)

# In the order `plimsoll --help` lists them.
_SUBCOMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    add_run,
    probe.add_probe,
    add_check_config,
    add_plan,
    add_generate,
    add_loadtest,
    add_status,
    add_autoscale,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="plimsoll",
        description="Capacity observability for LLM serving: the load line for your inference fleet.",
    )
    parser.add_argument("--version", action="version", version=f"plimsoll {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
        return status
    except _INPUT_ERRORS as error:
        # An error may quote a file's or a server's text: each of its lines is shown, never acted on by the terminal.
        lines = "\n".join(shown(line) for line in str(error).splitlines())
        print(f"plimsoll {args.command}: {lines}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C in a long read or replay: each file is written whole (atomically) or not at all
        print(f"plimsoll {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `plimsoll plan ... | head` closed the pipe: not an error worth a traceback
        sys.stderr.close()
        return EXIT_OK
