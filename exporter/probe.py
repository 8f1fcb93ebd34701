"""`plimsoll probe`: one engine endpoint or saved page, as Plimsoll sees it; the command's arguments too."""

import argparse
import asyncio
import json
import sys
from typing import Any

from exporter.cli_args import EXIT_INTERRUPTED, EXIT_OK, Formatter, Subcommands, duration_arg
from exporter.config import ENGINE_NAMES, redact_url
from exporter.display import shown
from exporter.files import NotARegularFile, read_regular_file
from exporter.sources.engines import ADAPTERS, detect, keep_filter, read_page
from exporter.sources.engines.base import PageLimits, reading_dict
from exporter.sources.promtext import TooManySeries, parse

MAX_PAGE_BYTES = 32 * 1024 * 1024
_HEADLINE = (
    "kv_cache_usage_ratio",
    "kv_cache_capacity_tokens",
    "requests_running",
    "requests_waiting",
    "preemptions_total",
)


def _is_url(source: str) -> bool:
    return source.lower().startswith(("http://", "https://"))  # a scheme is case-insensitive: HTTP:// is one too


def _named(source: str) -> str:
    """The source fit to print: a URL's password (aiohttp logs in with it) is masked, in any scheme's."""
    return redact_url(source) if "://" in source else source


def _too_large(source: str) -> str:
    return f"{_named(source)} is over {MAX_PAGE_BYTES:,} bytes, more than any engine's page"


def _bounded(data: bytes, source: str) -> tuple[str | None, str | None]:
    if len(data) > MAX_PAGE_BYTES:
        return None, _too_large(source)
    return data.decode("utf-8", errors="replace"), None


def _source(text: str) -> str:
    if not text.strip():  # "" reads as no file named, in words that do not show it
        raise argparse.ArgumentTypeError("empty: give an engine's metrics URL, a saved page, or - for stdin")
    return text


def _read_file(source: str) -> tuple[str | None, str | None]:
    """A saved page, read to the cap; a device or a pipe, which may never end, is refused."""
    try:
        return _bounded(read_regular_file(source, MAX_PAGE_BYTES), source)
    except NotARegularFile:
        return None, f"cannot read {source}: not a regular file (save the page to a file, or give - for stdin)"
    except OSError as error:
        return None, f"cannot read {source}: {error.strerror}"


def _read_stdin() -> tuple[str | None, str | None]:
    if sys.stdin is None:  # started with stdin closed (`<&-`): Python gives no stream at all
        return None, "cannot read stdin: it is closed (pipe the page in, or give a URL or a file)"
    try:
        data = sys.stdin.buffer.read(MAX_PAGE_BYTES + 1)
    except OSError as error:
        return None, f"cannot read stdin: {error.strerror}"
    return _bounded(data or b"", "stdin")  # None: a non-blocking stdin with nothing written to it yet


async def _text(source: str, timeout: float) -> tuple[str | None, str | None]:
    if source == "-":
        return _read_stdin()
    if _is_url(source):
        import aiohttp  # loads only for a URL: every other command, `plimsoll plan` included, starts without it

        from exporter.sources.http import fetch

        async with aiohttp.ClientSession() as session:
            fetched = await fetch(session, source, timeout, MAX_PAGE_BYTES)
        if fetched.failure == "too_large":  # the daemon's words name its own setting, which probe does not read
            return None, _too_large(source)
        if fetched.detail == "HTTP 401":  # probe has no credential flags: the URL is where a login goes
            return None, "HTTP 401 Unauthorized (give the login in the URL: http://USER:PASSWORD@HOST:PORT/metrics)"
        return fetched.text, fetched.detail or fetched.failure
    if "://" in source:  # ftp://, unix://, a typo of http://: a URL probe cannot fetch, not a file's name
        return None, f"{_named(source)}: not an http:// or https:// URL (give an engine's metrics URL, a file, or -)"
    return _read_file(source)


async def probe(source: str, engine: str, timeout: float) -> dict[str, Any]:
    text, failure = await _text(source, timeout)
    result: dict[str, Any] = {
        "source": _named(source),
        "engine": None,
        "error": failure,
        "detection": [],
        "readings": [],
    }
    result.update(dict.fromkeys(_HEADLINE))
    if text is None:
        return result
    try:
        # The daemon's parse (the names an engine reads, at most max_series of them): probe shows the detection the
        # daemon makes, and a 32 MB page of other samples costs seconds, not the 1.2 GB that keeping them all took.
        _, scores = detect(parse(text, keep_filter(ADAPTERS), PageLimits().max_series))
    except TooManySeries:
        scores = []  # read_page below says so
    result["detection"] = [
        {"engine": name, "score": detection.score, "evidence": list(detection.evidence)} for name, detection in scores
    ]
    read = read_page(text, engine)
    result["engine"] = read.engine
    result["readings"] = [reading_dict(r) for r in read.readings]
    if read.failure is not None:
        # A page no engine claims keeps probe's long-standing message: the detection scores printed with it say why.
        unclaimed = engine == "auto" and read.failure in ("unknown_engine", "not_metrics")
        result["error"] = "no engine vocabulary recognised on this page" if unclaimed else read.detail
    elif read.readings:
        result.update({key: result["readings"][0][key] for key in _HEADLINE})
    return result


def probe_table(result: dict[str, Any]) -> str:
    lines = [f"source   {result['source']}", f"engine   {result['engine'] or 'unknown'}"]
    if result["error"]:
        lines.append(f"error    {result['error']}")
    for entry in result["detection"]:
        evidence = "; ".join(entry["evidence"])
        lines.append(f"  detect {entry['engine']:<10} {entry['score']:.2f}  {evidence}")
    for reading in result["readings"]:
        lines.append("")
        rank = f" (dp_rank {reading['dp_rank']})" if reading["dp_rank"] else ""
        lines.append(f"{reading['engine']}{rank} model {reading['model']}")
        for key, value in reading.items():
            if key not in ("engine", "dp_rank", "model"):
                lines.append(f"  {key:<26} {'-' if value is None else value}")
    # Every line may hold the page's words (labels, metric names, the error) or the source's name.
    return "\n".join(shown(line) for line in lines)


def add_probe(commands: Subcommands) -> None:
    p = commands.add_parser(
        "probe",
        help="what Plimsoll sees at one engine endpoint or saved page",
        formatter_class=Formatter,
        description="Fetches URL (or reads FILE, or - for stdin), detects the engine and prints the normalised "
        "reading. Exit 1 when nothing could be read (down, not a metrics page, unknown engine).",
    )
    p.add_argument("source", type=_source, metavar="URL|FILE")
    p.add_argument(
        "--engine", default="auto", choices=ENGINE_NAMES, help="force an engine vocabulary instead of detecting it"
    )
    p.add_argument("--timeout", type=duration_arg, default="5s", help="how long to wait for the page, e.g. 5s")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        result = asyncio.run(probe(args.source, args.engine, args.timeout))
    except KeyboardInterrupt:  # Ctrl-C while the endpoint is slow to answer: the user's choice, not a crash
        return EXIT_INTERRUPTED
    print(json.dumps(result, indent=2) if args.format == "json" else probe_table(result))
    return EXIT_OK if result["readings"] else 1
