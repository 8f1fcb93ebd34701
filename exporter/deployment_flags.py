"""The deployment flags `plan` and `loadtest` share: the deployment the capacity model plans, and the GPU.

Every flag also answers to vLLM's and SGLang's spelling of it (`--tensor-parallel-size`, `-tp`, `--tp-size`,
`--mem-fraction-static`, ...), and `--from` reads a whole engine command line into the same flags.
"""

import argparse
import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn

from exporter import display
from exporter.capacity import quantization
from exporter.capacity.activation import MM_ENCODER_TP_MODES
from exporter.capacity.architecture import MAX_POSITIONS
from exporter.capacity.deployment import Deployment
from exporter.capacity.gpus import GpuSpec
from exporter.capacity.plan import (
    MAX_GPU_MEMORY_BYTES,
    MAX_GPU_TIB,
    MAX_PARALLEL,
    MAX_SEQUENCES,
    PlanError,
)
from exporter.catalog import CatalogError, find_gpu
from exporter.cli_args import (
    context_length_arg,
    engine_int,
    gpu_memory_arg,
    memory_size_arg,
    positive_int,
    ratio_arg,
    version_arg,
)
from exporter.engine_command_line import SETTINGS, EngineCommandLine, parse_engine_command_line

# Unset flags stay None (not the engine's default) so that a flag given beside --from can be told from one not
# given; deployment_from_args fills the defaults.
_DEFAULT_ENGINE = "vllm"
_ALIASES = {s.flag: s.spellings() for s in SETTINGS}


_MAX_TOKENS = MAX_POSITIONS  # context lengths, batched tokens and block sizes: no model is longer


def at_most(convert: Callable[[str], int | None], most: int, accepted: str = "") -> Callable[[str], int | None]:
    """`convert` (an argparse type), refusing a value above `most` with the range it accepts ("1 to `most`" unless
    `accepted` words it); "auto" (None) passes."""
    accepted = accepted or f"1 to {most:,}"

    @functools.wraps(convert)  # argparse names the type in its message for a value it cannot read
    def bounded(text: str) -> int | None:
        refusal = argparse.ArgumentTypeError(f"{display.shown(text)} is out of range: Plimsoll accepts {accepted}")
        try:
            value = convert(text)
        except OverflowError:  # "999...9.5K": more digits than a float holds, so above any bound
            raise refusal from None
        if value is not None and value > most:
            raise refusal
        return value

    return bounded


tokens_arg = at_most(positive_int, _MAX_TOKENS)
_parallel_arg = at_most(positive_int, MAX_PARALLEL)
_gpu_memory_arg = at_most(gpu_memory_arg, MAX_GPU_MEMORY_BYTES, f"1 GiB to {MAX_GPU_TIB} TiB (e.g. 80GiB)")
_pool_size_arg = at_most(memory_size_arg, MAX_GPU_MEMORY_BYTES, f"up to {MAX_GPU_TIB} TiB, one GPU's memory at most")


def _layer_partition_arg(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if len(parts) > MAX_PARALLEL:
        raise argparse.ArgumentTypeError(f"at most {MAX_PARALLEL} stages")
    try:
        return tuple(positive_int(part.strip()) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{display.shown(text)}: expected layer counts such as 24,24,23,23") from None


_MAX_MM_ITEMS = 1_000_000  # items of one modality in one prompt; vLLM's default is 999
_MAX_MM_TEXT = 1000  # characters of a --limit-mm-per-prompt value


def _mm_limits_arg(text: str) -> tuple[tuple[str, int], ...]:
    """vLLM's --limit-mm-per-prompt: JSON ('{"image": 0, "video": 1}', a count or {"count": N} per modality) or
    its older spelling image=0,video=1."""
    example = 'expected a JSON object such as {"image": 0} or image=2,video=0'
    if len(text) > _MAX_MM_TEXT:
        raise argparse.ArgumentTypeError(f"longer than {_MAX_MM_TEXT} characters; {example}")
    try:
        parsed = json.loads(text) if text.lstrip().startswith("{") else dict(p.split("=", 1) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{display.shown(text)}: {example}") from None
    limits = []
    for modality, value in parsed.items():
        count = value.get("count") if isinstance(value, dict) else value
        number = count if isinstance(count, int) and not isinstance(count, bool) else None
        if isinstance(count, str) and count.strip().isdecimal():
            number = int(count)
        if number is None or not 0 <= number <= _MAX_MM_ITEMS or not str(modality).strip().isidentifier():
            raise argparse.ArgumentTypeError(
                f"{display.shown(str(modality))}: {display.shown(str(value))} is not a count from 0 to "
                f"{_MAX_MM_ITEMS:,}; {example}"
            )
        limits.append((str(modality).strip(), number))
    return tuple(sorted(limits))


class _Switch(argparse.Action):
    """A switch and its `--no-` spellings (EngineSpellings.negations): the last one given wins, as in vLLM; None
    when none is given, so that a switch beside --from can be told from one not given."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def _deployment_arguments(p: argparse._ActionsContainer) -> None:
    def add(flag: str, **kwargs: Any) -> None:
        p.add_argument(flag, *_ALIASES.get(flag, ()), **kwargs)

    add("--gpu-memory", type=_gpu_memory_arg, help="GPU memory instead of, or for, a preset (80GiB, 79.19GiB, 80Gi)")
    add("--tp", type=_parallel_arg, help="tensor-parallel size (default 1)")
    add("--pp", type=_parallel_arg, help="pipeline-parallel size (default 1)")
    add(
        "--pp-layer-partition",
        type=_layer_partition_arg,
        help="layers per pipeline stage, e.g. 24,24,23,23: vLLM's VLLM_PP_LAYER_PARTITION (default: vLLM's split)",
    )
    add("--dp", type=_parallel_arg, help="data-parallel size: engines per replica (default 1)")
    add("--enable-expert-parallel", action=_Switch, help="MoE experts split over DP x TP GPUs")
    add("--ep-size", type=_parallel_arg, help="SGLang's expert-parallel size: above 1, as --enable-expert-parallel")
    add("--engine", choices=["vllm", "sglang"], help=f"default {_DEFAULT_ENGINE}")
    add(
        "--gpu-memory-utilization",
        type=ratio_arg,
        help="vLLM's gpu_memory_utilization or SGLang's mem_fraction_static (default: the engine's)",
    )
    add(
        "--max-model-len",
        type=at_most(context_length_arg, _MAX_TOKENS),
        help="context length, e.g. 32768 or 32K (default: the model's)",
    )
    add("--max-num-batched-tokens", type=at_most(engine_int, _MAX_TOKENS), help="default: vLLM's for this GPU")
    add("--max-num-seqs", type=at_most(positive_int, MAX_SEQUENCES), help="default: vLLM's for this GPU")
    add("--dtype", help="weights dtype: auto, bfloat16, float16, float32 (default auto)")
    add("--kv-cache-dtype", help="auto (the weights' dtype) or fp8 (default auto)")
    add("--block-size", type=tokens_arg, help="KV block size in tokens (default: vLLM's)")
    add(
        "--kv-cache-memory",
        type=_pool_size_arg,
        help="KV pool size per GPU (8GiB, 8Gi, 8GB), as vLLM's flag: skips profiling",
    )
    add(
        "--kv-cache-memory-bytes",
        dest="kv_cache_memory",
        type=at_most(engine_int, MAX_GPU_MEMORY_BYTES, f"up to {MAX_GPU_TIB}T ({MAX_GPU_TIB} TiB)"),
        help="vLLM's own flag, in vLLM's units (8G = 8 GiB, 8g = 8e9): the same as --kv-cache-memory",
    )
    add(
        "--limit-mm-per-prompt",
        type=_mm_limits_arg,
        help='multimodal items per prompt, as vLLM\'s flag: \'{"image": 0}\' (with "video": 0 for a model that '
        "reads video) serves the model language-only, without its vision tower or the encoder's profiling run",
    )
    add(
        "--language-model-only",
        action=_Switch,
        help="vLLM's: every modality's limit 0, as --limit-mm-per-prompt '{\"image\": 0, \"video\": 0}' (no "
        "vision tower, no encoder profiling), whatever --limit-mm-per-prompt says",
    )
    add(
        "--mm-encoder-tp-mode",
        choices=MM_ENCODER_TP_MODES,
        help="vLLM's: weights splits the vision tower over TP (default), data keeps a copy per GPU",
    )
    add("--quantization", help="online quantization of a 16-bit checkpoint: fp8 or bitsandbytes")
    add("--enforce-eager", action=_Switch, help="no CUDA graphs")
    add(
        "--async-scheduling",
        action=_Switch,
        help="vLLM's, on by default: PP + 1 batches in flight, PP with --no-async-scheduling; from v0.26 a "
        "sliding-window layer keeps one batch of tokens beyond its window for each",
    )
    add(
        "--vllm-version",
        type=version_arg,
        help="model an older vLLM (e.g. 0.10): defaults, CUDA-graph budgeting and token counting changed",
    )


class _EngineFlagParser(argparse.ArgumentParser):
    """Reads --from's flags with the same types as the flags themselves; a bad value raises instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentTypeError(message)


def _engine_flag_parser() -> _EngineFlagParser:
    parser = _EngineFlagParser(prog="--from", add_help=False, argument_default=argparse.SUPPRESS)
    _deployment_arguments(parser)
    return parser


def _flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _read_engine_flags(command: EngineCommandLine) -> dict[str, tuple[Any, str]]:
    """Each setting --from gives, converted as its Plimsoll flag converts it, with its spelling in the command."""
    parser = _engine_flag_parser()
    read: dict[str, tuple[Any, str]] = {
        "model": (command.model, f"model {command.model}"),
        "engine": (command.engine, command.engine),
    }
    for spelling, raw in command.settings:
        given = [spelling] if raw is None else [f"{spelling}={raw}"]
        shown = spelling if raw is None else f"{spelling} {raw}"
        try:
            values = vars(parser.parse_args(given))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{shown}: {error}") from None
        read.update((dest, (value, shown)) for dest, value in values.items())
    return read


def _conflict(dest: str, value: Any, shown: str) -> str:
    given = "--model" if dest == "model" else _flag_name(dest)
    if isinstance(value, bool):  # a switch says nothing but its spelling
        switch = given if value else "--no-" + given.removeprefix("--")
        return f"--from says {shown} but {switch} is given too: give it once"
    return f"--from says {shown} but {given} says {value}: give it once"


class _FromEngineCommandLine(argparse.Action):
    """--from "vllm serve MODEL ...": fills the model, the engine and the flags as if they had been typed."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:  # else the second reads as contradicting a typed flag
            parser.error("--from: given twice: give the one launch command the engine runs")
        try:
            command = parse_engine_command_line(str(values))
            settings = _read_engine_flags(command)
        except (ValueError, argparse.ArgumentTypeError) as error:
            parser.error(display.shown(f"--from: {error}"))
        for dest, (value, shown) in settings.items():
            current = getattr(namespace, dest, None)
            if current is not None and current != value:
                parser.error(display.shown(_conflict(dest, current, shown)))
            setattr(namespace, dest, value)
        setattr(namespace, self.dest, settings)
        if command.ignored:
            print(
                f"{parser.prog}: --from: no effect on GPU memory, ignored: {' '.join(command.ignored)}", file=sys.stderr
            )


def add_deployment_flags(p: argparse._ActionsContainer) -> None:
    """The deployment the capacity model plans: `plan`'s flags, which `loadtest` shares for its comparison."""
    _deployment_arguments(p)
    p.add_argument(
        "--from",
        dest="engine_command_line",
        action=_FromEngineCommandLine,
        metavar="COMMAND",
        help='the engine\'s launch command, quoted: "vllm serve MODEL --tensor-parallel-size 2 ..." or '
        '"python -m sglang.launch_server --model-path MODEL --tp 2 ..." (sets --model, --engine and the flags)',
    )


def _check_agrees_with_engine_command_line(args: argparse.Namespace) -> None:
    """A flag given after --from that contradicts it (one given before is caught while parsing)."""
    for dest, (value, shown) in (getattr(args, "engine_command_line", None) or {}).items():
        current = getattr(args, dest, None)
        if current != value:
            raise PlanError(display.shown(_conflict(dest, current, shown)))


DEFAULT_GPU = "H100-80GB"


def gpu_for(args: argparse.Namespace) -> GpuSpec:
    """--gpu's preset, with --gpu-memory's total where given; --gpu-memory alone, or beside a name no preset has
    (a card newer than the list), is a GPU known by its memory."""
    if args.gpu_memory is not None and args.gpu in (None, "any"):
        return GpuSpec(name=f"{args.gpu_memory / 1024**3:.2f}GiB GPU", memory_bytes=args.gpu_memory)
    try:
        preset = find_gpu(args.gpu or DEFAULT_GPU)
    except CatalogError as error:
        if args.gpu_memory is None:
            raise CatalogError(
                f"{error} For a GPU not in the list, give its memory with --gpu-memory beside --gpu "
                "(e.g. 95.0GiB, the total torch.cuda.mem_get_info reports)."
            ) from None
        return GpuSpec(name=_gpu_name(args.gpu), memory_bytes=args.gpu_memory, evidence="--gpu-memory")
    if args.gpu_memory is None:
        return preset
    # The name and what it implies (vLLM's smaller A100 defaults) stay; only the total changes.
    return replace(preset, memory_bytes=args.gpu_memory, evidence="--gpu-memory")


# Longer than any name nvidia-smi prints; the name is printed in every answer, so a pasted log line is refused.
MAX_GPU_NAME = 80


def _gpu_name(name: str) -> str:
    if len(name) > MAX_GPU_NAME or not name.isprintable():
        raise PlanError(f"--gpu: a GPU name is at most {MAX_GPU_NAME} printable characters")
    return name


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _mm_limits(args: argparse.Namespace) -> tuple[tuple[str, int], ...]:
    """--limit-mm-per-prompt's limits; under --language-model-only every modality's is 0, as vLLM's
    MultiModalConfig.get_limit_per_prompt answers then whatever the limits say (vllm/config/multimodal.py)."""
    limits: tuple[tuple[str, int], ...] = args.limit_mm_per_prompt or ()
    if not args.language_model_only:
        return limits
    return tuple(sorted(dict.fromkeys([*dict(limits), "image", "video"], 0).items()))


def deployment_from_args(args: argparse.Namespace) -> Deployment:
    _check_agrees_with_engine_command_line(args)
    return Deployment(
        engine=_or(args.engine, _DEFAULT_ENGINE),
        tensor_parallel=_or(args.tp, 1),
        pipeline_parallel=_or(args.pp, len(args.pp_layer_partition) if args.pp_layer_partition else 1),
        data_parallel=_or(args.dp, 1),
        expert_parallel=_or(args.enable_expert_parallel, False) or _or(args.ep_size, 1) > 1,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        dtype=_or(args.dtype, "auto"),
        kv_cache_dtype=_or(args.kv_cache_dtype, "auto"),
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory,
        enforce_eager=_or(args.enforce_eager, False),
        async_scheduling=_or(args.async_scheduling, True),
        quantization=quantization.from_flag(args.quantization) if args.quantization else None,
        vllm_version=args.vllm_version,
        pp_layer_partition=args.pp_layer_partition,
        mm_limits=_mm_limits(args),
        mm_encoder_tp_mode=_or(args.mm_encoder_tp_mode, "weights"),
    )
