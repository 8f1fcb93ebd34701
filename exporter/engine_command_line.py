"""An engine's own launch command, as users paste it (`vllm serve MODEL --tensor-parallel-size 2 ...`,
`python -m sglang.launch_server --model-path MODEL ...`), split into the engine, the model, the flags that decide
GPU memory (in the engine's spelling) and the flags that do not.

Pure: text in, values out. Converting each flag's value is left to the deployment flags of `plimsoll plan`, which
accept every engine spelling listed here, so a value means the same whether pasted or typed.
"""

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePath


class EngineCommandLineError(ValueError):
    """A command line that is not an engine launch, or carries a flag Plimsoll cannot account for."""


@dataclass(frozen=True)
class EngineSpellings:
    """One deployment setting: Plimsoll's flag and how vLLM and SGLang spell it (vllm/engine/arg_utils.py,
    sglang/srt/server_args.py). A switch takes no value."""

    flag: str
    vllm: tuple[str, ...]
    sglang: tuple[str, ...]
    switch: bool = False

    def negations(self) -> tuple[str, ...]:
        """A switch's `--no-` spellings: vLLM declares its boolean flags with argparse's BooleanOptionalAction
        (`_compute_kwargs` in vllm/engine/arg_utils.py), so each long spelling has one and the last of the pair
        given wins. SGLang's switches are store_true, without one."""
        if not self.switch:
            return ()
        return tuple("--no-" + s.removeprefix("--") for s in self.vllm if s.startswith("--"))

    def spellings(self) -> tuple[str, ...]:
        """The engine spellings that are not Plimsoll's own flag: its aliases on the command line."""
        return tuple(dict.fromkeys(s for s in (*self.vllm, *self.negations(), *self.sglang) if s != self.flag))


SETTINGS: tuple[EngineSpellings, ...] = (
    EngineSpellings("--tp", ("--tensor-parallel-size", "-tp"), ("--tp-size", "--tensor-parallel-size", "--tp")),
    EngineSpellings("--pp", ("--pipeline-parallel-size", "-pp"), ("--pp-size", "--pipeline-parallel-size", "--pp")),
    EngineSpellings("--dp", ("--data-parallel-size", "-dp"), ("--dp-size", "--data-parallel-size", "--dp")),
    # SGLang sizes expert parallelism; vLLM switches it on over all DP x TP GPUs.
    EngineSpellings("--ep-size", (), ("--ep-size", "--expert-parallel-size", "--ep")),
    EngineSpellings("--enable-expert-parallel", ("--enable-expert-parallel", "-ep"), (), switch=True),
    EngineSpellings("--gpu-memory-utilization", ("--gpu-memory-utilization",), ("--mem-fraction-static",)),
    EngineSpellings("--max-model-len", ("--max-model-len",), ("--context-length",)),
    EngineSpellings("--max-num-seqs", ("--max-num-seqs",), ("--max-running-requests",)),
    EngineSpellings("--max-num-batched-tokens", ("--max-num-batched-tokens",), ()),
    EngineSpellings("--dtype", ("--dtype",), ("--dtype",)),
    EngineSpellings("--kv-cache-dtype", ("--kv-cache-dtype",), ("--kv-cache-dtype",)),
    EngineSpellings("--block-size", ("--block-size",), ("--page-size",)),
    # vLLM's own flag, read with vLLM's own units (8G is 8 GiB there): Plimsoll's --kv-cache-memory is separate.
    EngineSpellings("--kv-cache-memory-bytes", ("--kv-cache-memory-bytes",), ()),
    EngineSpellings("--quantization", ("--quantization", "-q"), ("--quantization",)),
    EngineSpellings("--limit-mm-per-prompt", ("--limit-mm-per-prompt",), ()),
    EngineSpellings("--language-model-only", ("--language-model-only",), (), switch=True),
    EngineSpellings("--mm-encoder-tp-mode", ("--mm-encoder-tp-mode",), ()),
    EngineSpellings("--enforce-eager", ("--enforce-eager",), ("--disable-cuda-graph",), switch=True),
    EngineSpellings("--async-scheduling", ("--async-scheduling",), (), switch=True),
)

# Flags that change nothing Plimsoll models: serving, logging, parsing, scheduling order, prefix caching.
_IGNORED_WITH_VALUE = frozenset(
    {
        "--host", "--port", "--api-key", "--chat-template", "--tokenizer", "--tokenizer-mode", "--tokenizer-path",
        "--revision", "--code-revision", "--tokenizer-revision", "--download-dir", "--load-format", "--seed",
        "--random-seed", "--uvicorn-log-level", "--log-level", "--tool-call-parser", "--reasoning-parser",
        "--root-path", "--ssl-keyfile", "--ssl-certfile", "--allowed-origins", "--generation-config",
        "--max-log-len", "--response-role", "--scheduling-policy", "--schedule-policy", "--otlp-traces-endpoint",
        "--distributed-executor-backend", "--attention-backend", "--grammar-backend", "--schedule-conservativeness",
        "--watchdog-timeout", "--override-generation-config", "--chat-template-content-format",
    }
)  # fmt: skip
_IGNORED_SWITCHES = frozenset(
    {
        "--trust-remote-code", "--disable-log-requests", "--enable-log-requests", "--disable-log-stats",
        "--enable-auto-tool-choice", "--enable-prefix-caching", "--enable-chunked-prefill", "--disable-radix-cache",
        "--enable-metrics", "--log-requests", "--disable-overlap-schedule", "--enable-mixed-chunk",
        "--enable-p2p-check", "--disable-fastapi-docs", "--disable-uvicorn-access-log", "--enable-cache-report",
    }
)  # fmt: skip
# Takes every following word up to the next flag (vLLM's nargs="+").
_IGNORED_MANY = frozenset({"--served-model-name"})
_MODEL_FLAGS = {"vllm": ("--model",), "sglang": ("--model-path", "--model")}
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
# vLLM's environment variables that decide memory, and the Plimsoll flag each one sets.
_ENV_SETTINGS = {"VLLM_PP_LAYER_PARTITION": "--pp-layer-partition"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_MODULES = {
    "vllm.entrypoints.openai.api_server": "vllm",
    "sglang.launch_server": "sglang",
}
_NEGATIVE_NUMBER = re.compile(r"-\d+")
_LAUNCHERS = (
    "`vllm serve MODEL ...`, `python -m vllm.entrypoints.openai.api_server --model MODEL ...`, "
    "`python -m sglang.launch_server --model-path MODEL ...` or `sglang serve --model-path MODEL ...`"
)


@dataclass(frozen=True)
class EngineCommandLine:
    engine: str
    model: str
    # Memory-deciding flags as written (engine spelling, value; None for a switch), in order, after the environment
    # variables that decide memory, as the Plimsoll flag each sets (_ENV_SETTINGS). A vLLM flag written with
    # underscores is kept in its dashed spelling, the one vLLM reads it as.
    settings: tuple[tuple[str, str | None], ...]
    ignored: tuple[str, ...]  # flags that change nothing Plimsoll models, spelt as in `settings`


def _flags_of(engine: str) -> dict[str, EngineSpellings]:
    return {spelling: s for s in SETTINGS for spelling in ((*s.vllm, *s.negations()) if engine == "vllm" else s.sglang)}


def _launcher(words: list[str]) -> tuple[str, list[str], str | None]:
    """The engine, the words after the launch itself, and a positional model (`vllm serve MODEL`)."""
    program = PurePath(words[0]).name if words else ""
    if program in {"vllm", "sglang"} and words[1:2] == ["serve"]:
        rest = words[2:]
        if program == "vllm" and rest and not rest[0].startswith("-"):
            return "vllm", rest[1:], rest[0]
        return program, rest, None
    if _PYTHON.fullmatch(program) and words[1:2] == ["-m"] and len(words) > 2 and words[2] in _MODULES:
        return _MODULES[words[2]], words[3:], None
    shown = " ".join(words[:3]) or "nothing"
    raise EngineCommandLineError(f"expected {_LAUNCHERS}; got {shown!r}")


def parse_engine_command_line(text: str) -> EngineCommandLine:
    """Read one launch command. Environment assignments before it (`CUDA_VISIBLE_DEVICES=0,1 vllm serve ...`) and
    backslash line continuations are allowed; VLLM_PP_LAYER_PARTITION among them is read as --pp-layer-partition."""
    try:
        # A script saved with Windows line ends continues its lines with a backslash before "\r\n".
        words = shlex.split(text.replace("\r\n", "\n").replace("\\\n", " "))
    except ValueError as error:
        raise EngineCommandLineError(f"cannot split the command line: {error}") from None
    environment: list[tuple[str, str]] = []
    while words and (words[0] == "env" or _ENV_ASSIGNMENT.fullmatch(words[0])):
        name, _, value = words[0].partition("=")
        if name in _ENV_SETTINGS:
            environment.append((_ENV_SETTINGS[name], value))
        words = words[1:]
    engine, rest, model = _launcher(words)
    known = _flags_of(engine)
    settings: list[tuple[str, str | None]] = list(environment) if engine == "vllm" else []
    ignored: list[str] = []
    i = 0

    def value_of(flag: str, inline: str | None) -> str:
        nonlocal i
        if inline is not None:
            return inline
        if i + 1 >= len(rest) or (rest[i + 1].startswith("-") and not _NEGATIVE_NUMBER.fullmatch(rest[i + 1])):
            raise EngineCommandLineError(f"{flag} needs a value")
        i += 1
        return rest[i]

    while i < len(rest):
        word = rest[i]
        if not word.startswith("-"):
            where = "first or in --model" if engine == "vllm" else "in --model-path"  # `sglang serve` has no MODEL
            raise EngineCommandLineError(f"unexpected {word!r}: expected a flag (the model goes {where})")
        flag, equals, inline_text = word.partition("=")
        if engine == "vllm":
            flag = _vllm_spelling(flag)
        inline = inline_text if equals else None
        if flag in _MODEL_FLAGS[engine]:
            given = value_of(flag, inline)
            if model is not None and model != given:
                raise EngineCommandLineError(f"two models: {model!r} and {flag} {given!r}")
            model = given
        elif flag in known and known[flag].switch:
            if inline is not None:  # as the engine's argparse refuses it: `--enforce-eager=false` is no "off"
                raise EngineCommandLineError(f"{flag} takes no value (the switch alone turns it on): {word!r}")
            settings.append((flag, None))
        elif flag in known:
            settings.append((flag, value_of(flag, inline)))
        elif flag in _IGNORED_WITH_VALUE:
            value_of(flag, inline)
            ignored.append(flag)
        elif flag in _IGNORED_MANY:
            value_of(flag, inline)
            # `--served-model-name=a b`: the engine's argparse takes `a` alone, and refuses `b` as a stray word.
            while inline is None and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
                i += 1
            ignored.append(flag)
        elif flag in _IGNORED_SWITCHES or (engine == "vllm" and _is_negated_switch(flag)):
            ignored.append(flag)
        elif flag == "--hf-overrides" and engine == "vllm":
            # It rewrites the model's config (layers, heads, context, rope scaling...) before vLLM sizes anything.
            raise EngineCommandLineError(
                "--hf-overrides changes the model's config.json, which --from does not apply: write the overrides "
                "into a copy of config.json, give its folder with --model, and leave --hf-overrides out of --from"
            )
        else:
            raise EngineCommandLineError(
                f"{flag} is not a {engine} flag Plimsoll knows: if it does not change GPU memory, leave it out of "
                "--from; if it does, Plimsoll cannot model it yet"
            )
        i += 1
    if model is None:
        model_flag = _MODEL_FLAGS[engine][0]
        raise EngineCommandLineError(f"no model: expected `vllm serve MODEL` or {model_flag} MODEL")
    return EngineCommandLine(engine=engine, model=model, settings=tuple(settings), ignored=tuple(ignored))


def _vllm_spelling(flag: str) -> str:
    """vLLM's FlexibleArgumentParser reads `--max_model_len` as `--max-model-len`: a long flag's underscores, up to a
    `.`, are dashes (vllm/utils/argparse_utils.py)."""
    if not flag.startswith("--"):
        return flag
    name, dot, key = flag.removeprefix("--").partition(".")
    return "--" + name.replace("_", "-") + dot + key


def _is_negated_switch(flag: str) -> bool:
    """vLLM's `--no-enable-prefix-caching`: a switch that changes nothing Plimsoll models, turned off. A memory
    switch's negation is a setting (EngineSpellings.negations), as the last of the pair decides. SGLang's switches
    are store_true and have no `--no-` form."""
    return flag.startswith("--no-") and "--" + flag.removeprefix("--no-") in _IGNORED_SWITCHES
