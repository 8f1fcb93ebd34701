"""`plimsoll loadtest`: its arguments. The work is in command.py, loaded only when the command runs (aiohttp and
the runner cost every other command nothing)."""

import argparse

from exporter.capacity.plan import plan
from exporter.catalog import load_model
from exporter.cli_args import Formatter, Subcommands, duration_arg, duration_or_zero_arg, env_twin, positive_int
from exporter.deployment_flags import add_deployment_flags, deployment_from_args, gpu_for


def add_loadtest(commands: Subcommands) -> None:
    p = commands.add_parser(
        "loadtest",
        help="find the saturation point and the SLO knee, and thresholds from the lower",
        formatter_class=Formatter,
        description="Drives an OpenAI-compatible server (streaming) with closed-loop concurrency rising from 1, or "
        "from where the engine's reported KV pool still holds every request, a quarter at a time past the "
        "saturation point, then bisection, and finds two "
        "answers: the saturation point (where the engine's own metrics show it cannot hold the load) and the SLO "
        "knee (the highest concurrency meeting the SLOs, judged by a sequential test). Writes result.json, "
        "report.html and thresholds.yaml under --out. Exit 0 with an answer, 1 when the run found none (what it "
        "measured is written) or could not run (the message says why; nothing is written), 2 for bad input, 130 "
        "after Ctrl-C (what was measured is written). API key: PLIMSOLL_API_KEY or --api-key-file.",
    )
    env_twin(p, "--url", "PLIMSOLL_LOADTEST_URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    env_twin(
        p,
        "--slo",
        "PLIMSOLL_LOADTEST_SLO",
        required=False,
        help="thresholds, each with a unit: ttft=500ms,itl=50ms (none: the saturation point alone)",
    )
    env_twin(
        p,
        "--objective",
        "PLIMSOLL_LOADTEST_OBJECTIVE",
        type=float,
        default=0.99,
        help="share of requests within the SLOs",
    )
    workload = p.add_argument_group("workload (token counts are the server's own usage)")
    for name, default in (("prompt", 512), ("output", 128)):
        workload.add_argument(f"--{name}-tokens", type=positive_int, default=default, help=f"mean {name} tokens")
        workload.add_argument(
            f"--{name}-tokens-spread", type=float, default=0.0, help="standard deviation (0: fixed length)"
        )
        workload.add_argument(f"--{name}-tokens-min", type=positive_int, default=1, help="shortest drawn")
        workload.add_argument(f"--{name}-tokens-max", type=positive_int, help="longest drawn")
    workload.add_argument(
        "--dataset", metavar="FILE.jsonl", help="requests to replay: {prompt|messages, max_tokens} a line"
    )
    workload.add_argument("--ignore-eos", action="store_true", help="ask the server to generate every max token")
    workload.add_argument(
        "--allow-short-answers",
        action="store_true",
        help="an answer shorter than its max tokens is good (default: an error, so a server that stops early "
        "cannot pass)",
    )
    workload.add_argument(
        "--unique-prompts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="open each prompt with a marker of the run and request, so no prefix is ever cached "
        "(--no-unique-prompts sends --dataset prompts as written)",
    )
    workload.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts and lengths")
    workload.add_argument(
        "--save-requests", metavar="FILE.csv|FILE.jsonl", help="write every measured request's record there"
    )
    server = p.add_argument_group("server")
    server.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    env_twin(p, "--served-model", "PLIMSOLL_LOADTEST_SERVED_MODEL", help="default: the first of /v1/models")
    env_twin(p, "--metrics-url", "PLIMSOLL_LOADTEST_METRICS_URL", help="default: the server's /metrics")
    server.add_argument("--api-key-file", metavar="FILE", help="a file holding the API key (bearer token)")
    search = p.add_argument_group("search")
    search.add_argument("--max-concurrency", type=positive_int, default=512, help="the highest concurrency tried")
    search.add_argument(
        "--concurrency", metavar="N,N,...", help="run exactly these concurrencies, in order, instead of searching"
    )
    search.add_argument(
        "--rate",
        metavar="R,R,...",
        help="open loop: requests/s arriving whatever the server's pace, each rate a step (at most "
        "--max-concurrency in flight)",
    )
    search.add_argument(
        "--arrivals", default="poisson", choices=["poisson", "constant"], help="open loop: gaps between arrivals"
    )
    search.add_argument("--tolerance", type=float, default=0.1, help="bisection stops within this share of the knee")
    search.add_argument("--step-duration", type=duration_arg, default="30s", help="measured part of each step")
    search.add_argument(
        "--warmup",
        type=duration_or_zero_arg,
        default="5s",
        help="discarded start of each step, at least one request's p99 lifetime at the level below (0s: that alone)",
    )
    search.add_argument("--max-duration", type=duration_arg, default="15m", help="the whole run's time limit")
    search.add_argument("--request-timeout", type=duration_arg, default="60s", help="one request's time limit")
    search.add_argument("--stall-timeout", type=duration_arg, default="15s", help="longest silence mid-stream")
    search.add_argument(
        "--ready-timeout",
        type=duration_or_zero_arg,
        default="30s",
        help="how long to wait for /health and /v1/models to answer before the first step",
    )
    model = p.add_argument_group("capacity model (compared with the knee)")
    model.add_argument("--model", help="preset name or Hugging Face config.json, as for plimsoll plan")
    model.add_argument("--gpu", help="GPU preset (default H100-80GB), with --model")
    add_deployment_flags(model)
    config = p.add_argument_group("config")
    env_twin(p, "--config", "PLIMSOLL_CONFIG", help="YAML config: its target's model, and where --write goes")
    config.add_argument("--target", help="the config's target under test (default: its only one)")
    config.add_argument("--write", action="store_true", help="update --config's saturation: in place (FILE.bak kept)")
    config.add_argument("--margin", type=float, default=0.05, help="KV threshold this share below the knee's usage")
    env_twin(p, "--out", "PLIMSOLL_LOADTEST_OUT", default="plimsoll-loadtest", help="directory for the outputs")
    p.add_argument("--format", default="table", choices=["table", "json"], help="table for people, json for scripts")
    p.set_defaults(handler=_loadtest)


def _loadtest(args: argparse.Namespace) -> int:
    from exporter.loadtest.command import run_loadtest, settings_from_args  # aiohttp and rich load only here

    flag_plan = plan(load_model(args.model), gpu_for(args), deployment_from_args(args)) if args.model else None
    return run_loadtest(settings_from_args(args, flag_plan))
