"""Engine launch commands as users paste them, split into engine, model, memory flags and ignored flags."""

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.cli import main
from exporter.engine_command_line import EngineCommandLineError, parse_engine_command_line


def test_vllm_serve_takes_the_model_first_and_keeps_memory_flags_as_written():
    command = parse_engine_command_line(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 --max-model-len=32768 --enforce-eager"
    )
    assert (command.engine, command.model) == ("vllm", "meta-llama/Llama-3.1-8B-Instruct")
    assert command.settings == (
        ("--tensor-parallel-size", "2"),
        ("--max-model-len", "32768"),
        ("--enforce-eager", None),
    )


def test_vllm_api_server_module_takes_the_model_from_its_flag():
    command = parse_engine_command_line("python3 -m vllm.entrypoints.openai.api_server --model org/m -tp 4 -pp 2")
    assert (command.engine, command.model) == ("vllm", "org/m")
    assert command.settings == (("-tp", "4"), ("-pp", "2"))


@pytest.mark.parametrize(
    "text",
    [
        "python -m sglang.launch_server --model-path org/m --tp-size 2 --mem-fraction-static 0.85",
        "sglang serve --model org/m --tp-size 2 --mem-fraction-static 0.85",
    ],
)
def test_sglang_launches_read_the_same(text):
    command = parse_engine_command_line(text)
    assert (command.engine, command.model) == ("sglang", "org/m")
    assert command.settings == (("--tp-size", "2"), ("--mem-fraction-static", "0.85"))


def test_serving_flags_are_ignored_and_listed_even_with_many_values():
    command = parse_engine_command_line(
        "vllm serve org/m --host 0.0.0.0 --port 8000 --served-model-name a b --trust-remote-code "
        "--no-enable-prefix-caching --dtype bfloat16"
    )
    assert command.ignored == ("--host", "--port", "--served-model-name", "--trust-remote-code",
                               "--no-enable-prefix-caching")  # fmt: skip
    assert command.settings == (("--dtype", "bfloat16"),)


def test_environment_assignments_and_line_continuations_are_accepted():
    command = parse_engine_command_line("CUDA_VISIBLE_DEVICES=0,1 vllm serve org/m \\\n  --tensor-parallel-size 2")
    assert command.settings == (("--tensor-parallel-size", "2"),)


def test_a_line_continuation_saved_with_windows_line_ends_is_a_continuation():
    command = parse_engine_command_line("vllm serve org/m \\\r\n  --tensor-parallel-size 2 \\\r\n  --enforce-eager\r\n")
    assert command.settings == (("--tensor-parallel-size", "2"), ("--enforce-eager", None))


def test_vllm_reads_underscores_in_a_flags_name_as_dashes_and_sglang_does_not():
    command = parse_engine_command_line(
        "vllm serve org/m --tensor_parallel_size 2 --max_model_len=8K --no-enforce_eager --served_model_name m"
    )
    assert command.settings == (
        ("--tensor-parallel-size", "2"),
        ("--max-model-len", "8K"),
        ("--no-enforce-eager", None),
    )
    assert command.ignored == ("--served-model-name",)
    with pytest.raises(EngineCommandLineError, match="--tp_size is not a sglang flag"):
        parse_engine_command_line("python -m sglang.launch_server --model-path org/m --tp_size 2")


def test_vllms_layer_partition_variable_is_read_as_the_plimsoll_flag():
    command = parse_engine_command_line("env VLLM_PP_LAYER_PARTITION=24,24,23,23 vllm serve org/m -pp 4")
    assert command.settings == (("--pp-layer-partition", "24,24,23,23"), ("-pp", "4"))


def test_an_unknown_flag_is_named():
    with pytest.raises(EngineCommandLineError, match="--speculative-config is not a vllm flag"):
        parse_engine_command_line("vllm serve org/m --speculative-config '{}'")


def test_another_engines_spelling_is_unknown_to_this_engine():
    with pytest.raises(EngineCommandLineError, match="--mem-fraction-static is not a vllm flag"):
        parse_engine_command_line("vllm serve org/m --mem-fraction-static 0.8")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("docker run vllm/vllm-openai", "expected `vllm serve MODEL ...`"),
        ("vllm serve --port 8000", "no model"),
        ("vllm serve org/m --tensor-parallel-size", "--tensor-parallel-size needs a value"),
        ("vllm serve org/m --model other/m", "two models"),
        ("vllm serve org/m stray", r"unexpected 'stray': expected a flag \(the model goes first or in --model\)"),
        ("sglang serve org/m --tp 2", r"unexpected 'org/m': expected a flag \(the model goes in --model-path\)"),
        ("vllm serve org/m --served-model-name=a stray", "unexpected 'stray'"),
        ("vllm serve 'org/m", "cannot split"),
        # A switch's value is never read, so `=false` would read as on.
        ("vllm serve org/m --enforce-eager=false", "--enforce-eager takes no value"),
        ("vllm serve org/m --no-enforce-eager=true", "--no-enforce-eager takes no value"),
        ("python -m sglang.launch_server --model-path org/m --disable-cuda-graph=0", "--disable-cuda-graph takes no"),
    ],
)
def test_what_is_not_a_launch_command_says_why(text, message):
    with pytest.raises(EngineCommandLineError, match=message):
        parse_engine_command_line(text)


def test_from_given_twice_is_refused_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--from", "vllm serve llama-3.1-8b -tp 2", "--from", "vllm serve llama-3.1-8b -tp 4"])
    assert exit_.value.code == 2
    assert "--from: given twice: give the one launch command the engine runs" in capsys.readouterr().err


def test_a_vllm_switch_and_its_negation_are_both_settings_in_order_as_the_last_one_decides():
    command = parse_engine_command_line("vllm serve org/m --language-model-only --no-language-model-only -ep")
    assert command.settings == (("--language-model-only", None), ("--no-language-model-only", None), ("-ep", None))
    assert command.ignored == ()
    assert parse_engine_command_line("vllm serve org/m --no-enable-prefix-caching").ignored == (
        "--no-enable-prefix-caching",
    )


def test_a_negative_value_is_a_value_not_a_flag():
    assert parse_engine_command_line("vllm serve org/m --max-model-len -1").settings == (("--max-model-len", "-1"),)


SETTING_WORDS = st.sampled_from(
    [("--tensor-parallel-size", "2"), ("-pp", "2"), ("--max-model-len", "32K"), ("--enforce-eager", None),
     ("--kv-cache-dtype", "fp8"), ("--gpu-memory-utilization", "0.85"), ("-ep", None), ("--no-enforce-eager", None)]
)  # fmt: skip
IGNORED_WORDS = st.sampled_from([("--port", "8000"), ("--trust-remote-code", None), ("--host", "0.0.0.0")])


@given(st.lists(st.one_of(SETTING_WORDS, IGNORED_WORDS), max_size=8), st.booleans())
def test_any_mix_of_flags_splits_into_settings_and_ignored_in_order(flags, inline):
    words = []
    for flag, value in flags:
        if value is None:
            words.append(flag)
        else:
            words += [f"{flag}={value}"] if inline else [flag, value]
    command = parse_engine_command_line(shlex.join(["vllm", "serve", "org/m", *words]))
    ignored = {"--port", "--trust-remote-code", "--host"}
    assert command.settings == tuple((f, v) for f, v in flags if f not in ignored)
    assert command.ignored == tuple(f for f, _ in flags if f in ignored)


def test_hf_overrides_is_refused_as_it_changes_the_models_config():
    with pytest.raises(EngineCommandLineError, match=r"--hf-overrides changes the model's config\.json"):
        parse_engine_command_line("vllm serve m --hf-overrides '{\"num_hidden_layers\": 4}'")


def test_sglang_refuses_a_no_form_of_its_switches_as_sglang_does():
    with pytest.raises(EngineCommandLineError, match="--no-enable-metrics is not a sglang flag"):
        parse_engine_command_line("python -m sglang.launch_server --model-path org/m --no-enable-metrics")
    vllm = parse_engine_command_line("vllm serve org/m --no-enable-prefix-caching")
    assert "--no-enable-prefix-caching" in vllm.ignored
