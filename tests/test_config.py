"""Config loading: every problem reported at once, each with the file, the field path and what is expected."""

from dataclasses import replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.cli import main
from exporter.config import (
    DEFAULT_PORT,
    AutoscalingConfig,
    BasicAuth,
    Config,
    ConfigError,
    ScaledWorkload,
    check_config,
    load_config,
    load_yaml_documents,
    parse_config,
    parse_target_file,
    redact_url,
    restart_required,
)

GOOD = """
listen: "127.0.0.1:9999"
poll_interval: 2s
targets:
  - name: llama
    url: http://127.0.0.1:8000/metrics
    engine: vllm
    model: llama-3.1-8b
    gpus: [0, 1]
    deployment: {tensor_parallel: 2, gpu_memory_utilization: 0.9, max_model_len: 32768, kv_cache_memory: 2MiB}
slos:
  ttft: {threshold: 500ms, objective: 0.99}
  itl: {threshold: 50ms, objective: 0.999}
saturation: {kv_usage: 0.85, lead_time: 10m}
"""


def test_a_valid_config_becomes_frozen_objects():
    config = parse_config(GOOD, "config.yaml", environ={})
    (target,) = config.targets
    assert config.port == 9999 and config.poll_interval_seconds == 2.0
    assert target.gpus == ("0", "1")
    assert target.deployment.tensor_parallel == 2
    assert target.deployment.kv_cache_memory_bytes == 2 * 1024**2
    assert [(s.name, s.threshold_seconds, s.objective) for s in config.slos] == [
        ("ttft", 0.5, 0.99),
        ("itl", 0.05, 0.999),
    ]
    assert config.saturation_kv_usage == 0.85 and config.lead_time_seconds == 600
    with pytest.raises(AttributeError):
        config.listen = "x"  # type: ignore[misc]


def test_defaults_need_no_file():
    config = parse_config("{}", "empty.yaml", environ={})
    assert config.port == DEFAULT_PORT and config.poll_interval_seconds == 5.0 and config.targets == ()


@pytest.mark.parametrize("text", ["", "\n", "# every default\n", "---\n"])
def test_a_config_with_nothing_in_it_is_refused_as_every_default_is_asked_for_with_braces(text):
    assert check_config(text, "c.yaml", environ={}).problems == (
        "c.yaml: the config is empty (write {} for every default)",
    )


def test_every_problem_is_reported_with_file_and_field_path():
    text = """
targets:
  - url: "localhost:8000"
  - name: b
    url: http://x:1/metrics
    engine: vlm
slos:
  ttft: {threshold: 500ms, objective: 99}
saturation: {kv_usage: 1.5}
poll_interval: soon
"""
    with pytest.raises(ConfigError) as error:
        parse_config(text, "config.yaml", environ={})
    problems = error.value.problems
    assert "config.yaml: targets[0].url: 'localhost:8000' is not a URL (expected http://host:port/path)" in problems
    assert any(p.startswith("config.yaml: targets[1].engine: 'vlm' is not one of") for p in problems)
    assert "config.yaml: slos.ttft.objective: 99 is not a ratio between 0 and 1 (did you mean 0.99?)" in problems
    assert any(p.startswith("config.yaml: saturation.kv_usage:") for p in problems)
    assert any(p.startswith("config.yaml: poll_interval:") for p in problems)
    assert len(problems) == 5


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://x:1/metrics\x1b[2J", "'http://x:1/metrics\\x1b[2J' is not a URL: it holds a space or a control"),
        ("http://x:1/metrics\nhost", "'http://x:1/metrics\\nhost' is not a URL: it holds a space or a control"),
        ("http://a b:1/metrics", "'http://a b:1/metrics' is not a URL: it holds a space or a control"),
        ("http://a\u2028b:1/metrics", "'http://a\\u2028b:1/metrics' is not a URL: it holds a space or a control"),
        ("http://a<<b:1/metrics", "'http://a<<b:1/metrics' is not a URL (expected http://host:port/path)"),
        ('http://a"b:1/metrics', "'http://a\"b:1/metrics' is not a URL (expected http://host:port/path)"),
    ],
)
def test_a_url_whose_host_could_not_name_a_target_is_refused(url: str, problem: str):
    """A target without a name is named by its host:port: it must be a label value (no escape, no line break, no
    <<), as a name given is."""
    with pytest.raises(ConfigError) as error:
        parse_config(yaml.safe_dump({"targets": [{"url": url}]}), "c.yaml", environ={})
    (found,) = error.value.problems
    assert found.startswith(f"c.yaml: targets[0].url: {problem}"), found


def test_hosts_of_every_kind_name_their_target():
    urls = ["http://[fe80::1%25eth0]:8000/metrics", "http://bücher.example:8000/m", "http://my_host:80/m?x=1#f"]
    config = parse_config(yaml.safe_dump({"targets": [{"url": url} for url in urls]}), "c.yaml", environ={})
    assert [t.name for t in config.targets] == ["[fe80::1%25eth0]:8000", "bücher.example:8000", "my_host:80"]


def test_unknown_fields_are_named_with_the_expected_ones():
    with pytest.raises(ConfigError, match=r"config.yaml: targets\[0\].modle: unknown field"):
        parse_config("targets: [{url: 'http://a:1/metrics', modle: x}]", "config.yaml", environ={})


def test_duplicate_target_names_are_rejected():
    text = "targets: [{name: a, url: 'http://a:1/metrics'}, {name: a, url: 'http://b:1/metrics'}]"
    with pytest.raises(ConfigError, match=r"targets\[1\].name: 'a' is used by another target"):
        parse_config(text, "c.yaml", environ={})


def test_environment_variables_expand_and_missing_ones_are_errors():
    text = "targets: [{url: 'http://${HOST}:${PORT:-8000}/metrics'}]"
    config = parse_config(text, "c.yaml", environ={"HOST": "10.0.0.7"})
    assert config.targets[0].url == "http://10.0.0.7:8000/metrics"
    with pytest.raises(ConfigError, match="environment variable HOST is not set"):
        parse_config(text, "c.yaml", environ={})


def test_not_yaml_and_missing_file_say_so(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config("targets: [", "c.yaml", environ={})
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.yaml")


def test_file_sd_targets_follow_prometheus_format():
    text = '[{"targets": ["127.0.0.1:8000", "127.0.0.1:30000"], "labels": {"engine": "vllm", "model": "m"}}]'
    first, second = parse_target_file(text, "sd.json")
    assert first.url == "http://127.0.0.1:8000/metrics" and first.engine == "vllm" and first.model == "m"
    assert second.name == "127.0.0.1:30000"


def test_file_sd_errors_name_the_entry():
    with pytest.raises(ConfigError, match=r"sd.yaml: \[0\].targets: expected a list"):
        parse_target_file("- targets: 127.0.0.1:8000", "sd.yaml")


def test_the_design_sketch_with_kubernetes_discovery_off_is_valid():
    config = parse_config("discovery: {kubernetes: {enabled: false}, files: []}\n", "c.yaml", environ={})
    assert config.kubernetes is None


def test_kubernetes_discovery_takes_its_node_from_the_downward_api_variable():
    text = "discovery:\n  kubernetes: {enabled: true, namespaces: [inference], label_selector: app=vllm, refresh: 1m}\n"
    config = parse_config(text, "c.yaml", environ={"NODE_NAME": "gpu-node-7"})
    settings = config.kubernetes
    assert settings is not None
    assert (settings.node, settings.namespaces, settings.label_selector) == ("gpu-node-7", ("inference",), "app=vllm")
    assert settings.refresh_seconds == 60.0


def test_kubernetes_discovery_without_a_node_says_how_to_give_it_one():
    text = "discovery:\n  kubernetes: {enabled: true, namespaces: inference, watch: true}\n"
    with pytest.raises(ConfigError) as error:
        parse_config(text, "c.yaml", environ={})
    problems = error.value.problems
    assert any(p.startswith("c.yaml: discovery.kubernetes.node: not set") and "spec.nodeName" in p for p in problems)
    assert any(p.startswith("c.yaml: discovery.kubernetes.namespaces: expected a list") for p in problems)
    assert any(p.startswith("c.yaml: discovery.kubernetes.watch: unknown field") for p in problems)


def test_target_credentials_come_from_files_named_relative_to_the_config(tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "password").write_text("hunter2\n")
    (tmp_path / "secrets" / "token").write_text("t0ken\n")
    text = """
targets:
  - {name: a, url: 'http://127.0.0.1:1/metrics', basic_auth: {username: plimsoll, password_file: secrets/password}}
  - {name: b, url: 'http://127.0.0.1:2/metrics', bearer_token_file: secrets/token}
"""
    a, b = parse_config(text, str(tmp_path / "c.yaml"), environ={}).targets
    assert a.basic_auth == BasicAuth("plimsoll", str(tmp_path / "secrets" / "password"))
    assert b.bearer_token_file == str(tmp_path / "secrets" / "token") and b.basic_auth is None


def test_credential_problems_name_the_field_and_never_the_secret(tmp_path):
    (tmp_path / "token").write_text("t0ken\n")
    text = """
targets:
  - url: 'http://127.0.0.1:1/metrics'
    basic_auth: {username: plimsoll, password: hunter2}
  - url: 'http://127.0.0.1:2/metrics'
    basic_auth: {username: plimsoll, password_file: nowhere}
    bearer_token_file: token
"""
    with pytest.raises(ConfigError) as error:
        parse_config(text, str(tmp_path / "c.yaml"), environ={})
    problems = error.value.problems
    assert all("hunter2" not in p and "t0ken" not in p for p in problems)
    source = tmp_path / "c.yaml"
    assert any(p.startswith(f"{source}: targets[0].basic_auth.password: a password in the config") for p in problems)
    assert (
        f"{source}: targets[1].basic_auth.password_file: cannot read {tmp_path / 'nowhere'}: No such file or directory"
        in problems
    )
    assert any(
        p.startswith(f"{source}: targets[1].bearer_token_file: give basic_auth or bearer_token_file") for p in problems
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://admin:pw@10.0.0.7:8000/metrics", "http://***@10.0.0.7:8000/metrics"),
        ("https://token@host/metrics", "https://***@host/metrics"),
        ("http://admin:pa/ss@host:1/metrics", "http://***@host:1/metrics"),
        ("admin:pw@host:8000", "***@host:8000"),
        ("http://10.0.0.7:8000/metrics", "http://10.0.0.7:8000/metrics"),
    ],
)
def test_redact_url_masks_everything_that_could_be_a_credential(url, shown):
    assert redact_url(url) == shown


def test_a_target_named_by_default_is_its_host_and_port():
    (target,) = parse_config("targets: [{url: 'http://10.0.0.7:8000/metrics'}]", "c.yaml", environ={}).targets
    assert target.name == "10.0.0.7:8000"


def test_a_target_with_a_bad_url_still_has_its_other_fields_checked():
    text = (
        "targets: [{url: 'localhost:8000', engine: vlm, timeout: 3, poll_interval: [1s], gpus: [0],"
        " deployment: {tensor_parallel: 2}}]"
    )
    with pytest.raises(ConfigError) as error:
        parse_config(text, "c.yaml", environ={})
    fields = [p.split(": ")[1] for p in error.value.problems]
    assert fields == [
        "targets[0].url",
        "targets[0].gpus",
        "targets[0].engine",
        "targets[0].timeout",
        "targets[0].poll_interval",
    ]


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("tensor_parallel", "1025", "1 to 1,024"),
        ("pipeline_parallel", "100000", "1 to 1,024"),
        ("max_num_seqs", "1e12", "1 to 1,048,576"),
        ("max_model_len", "1e300", "1 to 1,073,741,824"),
        ("max_num_batched_tokens", "2147483648", "1 to 1,073,741,824"),
        ("block_size", "1e20", "1 to 1,073,741,824"),
        ("kv_cache_memory", "1e30GiB", "up to 4 TiB"),
    ],
)
def test_a_deployment_setting_past_any_real_deployment_is_refused_with_its_range(field, value, accepted):
    # The daemon plans each target from these, as `plimsoll plan` does from its flags, with the same bounds.
    text = f"targets: [{{url: 'http://a:1/metrics', deployment: {{{field}: {value}}}}}]"
    with pytest.raises(ConfigError) as error:
        parse_config(text, "c.yaml", environ={})
    (problem,) = error.value.problems
    assert problem.startswith(f"c.yaml: targets[0].deployment.{field}: ") and accepted in problem, problem


@pytest.mark.parametrize(
    ("entry", "field", "value"),
    [
        ("gpu_type: ''", "gpu_type", "''"),
        ("gpu_type: ' '", "gpu_type", "' '"),
        ("deployment: {kv_cache_memory: 0}", "deployment.kv_cache_memory", "0"),
        ("deployment: {kv_cache_memory: 0GiB}", "deployment.kv_cache_memory", "'0GiB'"),
    ],
)
def test_an_empty_gpu_type_or_a_zero_kv_cache_is_refused_not_read_as_unset(entry, field, value):
    # Unset is the key left out; the daemon and the planner would read an empty name or a 0 as unset, unsaid.
    text = f"targets: [{{url: 'http://a:1/metrics'}}, {{url: 'http://b:1/metrics', {entry}}}]"
    (problem,) = check_config(text, "c.yaml", environ={}).problems
    assert problem.startswith(f"c.yaml: targets[1].{field}: {value} "), problem
    assert "leave the key out" in problem, problem


def test_limits_per_target_poll_interval_and_web_config_are_read(tmp_path):
    (tmp_path / "web.yml").write_text("basic_auth_users: {}\n")
    text = """
max_series_per_target: 5000
max_instances_per_target: 8
max_concurrent_requests: 16
request_header_timeout: 2s
web_config: web.yml
targets: [{url: 'http://127.0.0.1:1/metrics', poll_interval: 15s, timeout: 500ms}]
"""
    config = parse_config(text, str(tmp_path / "c.yaml"), environ={})
    assert (config.max_series_per_target, config.max_instances_per_target, config.max_concurrent_requests) == (
        5000,
        8,
        16,
    )
    assert config.request_header_timeout_seconds == 2.0 and config.web_config == str(tmp_path / "web.yml")
    assert (config.targets[0].poll_interval_seconds, config.targets[0].timeout_seconds) == (15.0, 0.5)


def test_restart_required_names_the_fields_a_reload_cannot_apply():
    old = Config()
    new = replace(old, listen="127.0.0.1:1", nvml=False, poll_interval_seconds=1.0, max_concurrent_requests=2)
    assert restart_required(old, new) == ("listen", "nvml")
    assert restart_required(old, replace(old, request_header_timeout_seconds=1.0, web_config="w")) == (
        "web_config",
        "request_header_timeout",
    )
    assert restart_required(old, old) == ()


@pytest.mark.parametrize(("word", "value"), [("off", False), ("No", False), ("TRUE", True), ("yes", True)])
def test_quoted_boolean_words_mean_what_they_say(word, value):
    text = f"nvml: '{word}'\ndiscovery: {{scan_local_ports: '{word}', kubernetes: {{enabled: '{word}', node: n}}}}\n"
    text += f"targets: [{{url: 'http://a:1/metrics', deployment: {{enforce_eager: '{word}'}}}}]\n"
    config = parse_config(text, "c.yaml", environ={})
    assert config.nvml is value and config.scan_local_ports is value
    assert (config.kubernetes is not None) is value
    assert config.targets[0].deployment.enforce_eager is value


def test_a_disabled_kubernetes_section_is_still_checked():
    with pytest.raises(ConfigError, match=r"c.yaml: discovery.kubernetes.refresh: 30 has no unit: write 30s"):
        parse_config("discovery: {kubernetes: {enabled: false, refresh: 30}}\n", "c.yaml", environ={})


def test_an_unset_variable_is_reported_naming_the_field_that_uses_it():
    with pytest.raises(ConfigError) as error:
        parse_config("targets: [{url: 'http://${HOST}:8000/metrics'}]\n", "c.yaml", environ={})
    assert error.value.problems[0] == (
        "c.yaml: targets[0].url: environment variable HOST is not set (use ${HOST:-default} for a default)"
    )


def test_a_variable_holding_yaml_syntax_stays_one_value_and_cannot_add_keys():
    text = "nvml: ${NVML:-true}\ntargets: [{url: 'http://${HOST}:8000/metrics', name: '${NAME}'}]\n"
    injected = {"HOST": "10.0.0.7", "NAME": "a'\nweb_config: /etc/passwd\n#", "NVML": "false\nmax_response_size: 1"}
    report = check_config(text, "c.yaml", environ=injected)
    assert report.config.web_config is None and report.config.max_response_bytes == 8 * 1024 * 1024
    assert sorted(problem.split(": ")[1] for problem in report.problems) == ["nvml", "targets[0].name"]
    config = parse_config(text, "c.yaml", environ={"HOST": "10.0.0.7", "NAME": "a: b # c", "NVML": "off"})
    assert (config.targets[0].name, config.nvml) == ("a: b # c", False)


def test_a_variable_in_a_comment_is_only_a_comment():
    config = parse_config("# set ${UNSET} to override\ntimeout: ${TIMEOUT:-4s}  # or ${ALSO_UNSET}\n", "c", {})
    assert config.timeout_seconds == 4.0


def test_a_yaml_error_names_the_line_without_quoting_it():
    with pytest.raises(ConfigError) as error:
        parse_config("targets:\n  - url: http://a:hunter2@b:1/m: [\n", "c.yaml", environ={})
    (problem,) = error.value.problems
    assert problem.startswith("c.yaml: not valid YAML: line 2, column ") and "hunter2" not in problem


def test_anchors_that_share_a_block_between_targets_are_fine():
    text = """
targets:
  - {<<: &vllm {engine: vllm, deployment: {tensor_parallel: 2}}, name: a, url: 'http://a:1/metrics'}
  - {<<: *vllm, name: b, url: 'http://b:1/metrics'}
"""
    a, b = parse_config(text, "c.yaml", environ={}).targets
    assert (a.engine, b.engine, b.deployment.tensor_parallel) == ("vllm", "vllm", 2)


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("poll_interval: 5s\nnvml: false\npoll_interval: 1h\n", 3, "poll_interval"),
        ("targets:\n  - url: 'http://a:1/metrics'\n    name: a\n    'url': 'http://b:1/metrics'\n", 4, "url"),
        ("alerting: &a {runbook_url: x}\nslos: [*a, {name: b, name: c}]\n", 2, "name"),
    ],
)
def test_a_key_written_twice_in_one_map_is_refused_naming_its_line(text: str, line: int, key: str):
    """YAML keeps the last of two equal keys without a word: the first value would be dropped unseen."""
    with pytest.raises(ConfigError, match=rf"c\.yaml: not usable YAML: line {line}: the key '{key}' is written twice"):
        parse_config(text, "c.yaml", environ={})


def test_an_alias_inside_its_own_anchor_is_refused():
    with pytest.raises(
        ConfigError, match=r"c\.yaml: not usable YAML: an alias refers to the collection that contains it"
    ):
        parse_config("targets: &t [*t]\n", "c.yaml", environ={})


def test_yaml_nested_past_the_parser_s_depth_is_refused_not_a_traceback():
    with pytest.raises(ConfigError, match=r"c\.yaml: not usable YAML: nested too deeply"):
        parse_config("targets: " + "[" * 1000 + "]" * 1000, "c.yaml", environ={})


def _laughs(levels: int) -> str:
    """A billion-laughs document: each anchor a list of ten aliases of the one before."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 10)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_multi_document_stream_is_read_every_document_with_one_alias_budget_for_the_file():
    assert load_yaml_documents("a: 1\n---\n---\nb: &b [1]\nc: *b\n", "s.yaml") == [{"a": 1}, None, {"b": [1], "c": [1]}]
    one = _laughs(4)  # 11,110 values from 42 written: under the budget on its own
    load_yaml_documents(one, "s.yaml")
    with pytest.raises(ConfigError, match=r"s\.yaml: not usable YAML: aliases expand this document to"):
        load_yaml_documents("---\n".join([one] * 10), "s.yaml")
    with pytest.raises(ConfigError, match=r"s\.yaml: not usable YAML: aliases expand"):
        load_yaml_documents("kind: x\n---\n" + _laughs(9), "s.yaml")
    with pytest.raises(ConfigError, match=r"s\.yaml: not usable YAML: nested too deeply"):
        load_yaml_documents("a: 1\n---\n" + "[" * 50_000, "s.yaml")


def test_file_sd_a_bad_engine_label_marks_its_targets_with_the_reason():
    text = '[{"targets": ["127.0.0.1:8000"], "labels": {"engine": "vlm"}}, {"targets": ["127.0.0.1:8001"]}]'
    bad, good = parse_target_file(text, "sd.json")
    assert bad.problem is not None and bad.engine == "auto"
    assert bad.problem.startswith("sd.json: [0].labels.engine: 'vlm' is not one of auto, vllm, sglang")
    assert good.problem is None


@pytest.mark.parametrize("address", ["127.0", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", ":8000", "a/b:1"])
def test_file_sd_an_address_that_is_not_host_port_refuses_the_file(address):
    text = f'[{{"targets": ["127.0.0.1:8000", "{address}"]}}]'
    with pytest.raises(ConfigError, match=r"sd.json: \[0\].targets\[1\]: .* is not host:port"):
        parse_target_file(text, "sd.json")


def test_file_sd_a_name_twice_in_one_file_is_refused():
    text = '[{"targets": ["127.0.0.1:8000", "127.0.0.1:8001"], "labels": {"target": "llama"}}]'
    with pytest.raises(ConfigError, match=r"sd.json: \[0\].targets\[1\]: target name 'llama' is already used by"):
        parse_target_file(text, "sd.json")


# Values that have broken converters before: infinities, NaN, numbers past any int or float, number-like text.
_AWKWARD = st.sampled_from(
    [float("inf"), float("-inf"), float("nan"), 10**30, 10**400, -1, 0, "inf", "nan", "5", "0.5s", ""]
)
_ANY_VALUE = st.recursive(
    _AWKWARD | st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


def _fields(names: tuple[str, ...], **nested: st.SearchStrategy) -> st.SearchStrategy:
    return st.dictionaries(st.sampled_from(names), _ANY_VALUE, max_size=len(names)).flatmap(
        lambda plain: st.fixed_dictionaries({}, optional=nested).map(lambda extra: {**plain, **extra})
    )


_TARGET = _fields(
    ("name", "url", "engine", "model", "gpus", "gpu_type", "timeout", "poll_interval", "bearer_token_file"),
    deployment=_fields(("tensor_parallel", "gpu_memory_utilization", "kv_cache_memory", "enforce_eager", "dtype")),
    basic_auth=_fields(("username", "password_file")),
)
_DOCUMENT = _fields(
    ("listen", "poll_interval", "timeout", "max_response_size", "max_series_per_target", "web_config", "nvml"),
    targets=st.lists(_TARGET, max_size=2),
    slos=st.fixed_dictionaries({}, optional={"ttft": _fields(("threshold", "objective"))}),
    saturation=_fields(("kv_usage", "lead_time")),
    discovery=_fields(("files", "scan_local_ports"), kubernetes=_fields(("enabled", "node", "refresh", "api_url"))),
    autoscaling=_fields(
        ("prometheus", "margin", "demand_window", "overprovisioned_for", "workloads"),
        workloads=st.lists(
            _fields(
                ("model", "kind", "name", "namespace", "min_replicas", "max_replicas", "startup", "knee_concurrency")
            ),
            max_size=2,
        ),
    ),
    pricing=_fields(("gpu_hour",), gpu_hour=st.dictionaries(st.text(max_size=6), _ANY_VALUE, max_size=3)),
)


@settings(max_examples=100, deadline=None)
@given(_DOCUMENT)
def test_any_value_in_any_field_is_a_problem_never_an_exception(document):
    report = check_config(yaml.safe_dump(document), "c.yaml", environ={})
    assert all(problem.startswith("c.yaml: ") for problem in report.problems)


_GROUP = _fields(("targets",), labels=_fields(("engine", "model", "target", "__scheme__", "__metrics_path__")))


@settings(max_examples=100, deadline=None)
@given(st.lists(_GROUP, max_size=3) | _ANY_VALUE)
def test_any_file_sd_document_gives_targets_or_a_config_error_never_another_exception(document):
    try:
        targets = parse_target_file(yaml.safe_dump(document), "sd.yaml")
    except ConfigError as error:
        assert all(problem.startswith("sd.yaml: ") for problem in error.problems)
    else:
        assert all(target.url.startswith(("http://", "https://")) for target in targets)


ALERTING = """
alerting:
  runbook_url: https://wiki.example.com/plimsoll/runbook
  exporter_job: "monitoring/plimsoll-.*"
  rule_labels: {release: prom-stack, team: inference}
  fleet_headroom_min_requests: 25
  capacity_drift_ratio: 0.15
  vram_growth_per_hour: 512MiB
  saturation_gate_fraction: 0.5
  saturation_ahead_for: 2m
  saturation_trend_window: 1h
"""


def test_the_alerting_section_becomes_one_frozen_object_with_its_units_parsed():
    alerting = parse_config(ALERTING, "config.yaml", environ={}).alerting
    assert alerting.runbook_url == "https://wiki.example.com/plimsoll/runbook"
    assert alerting.exporter_job == "monitoring/plimsoll-.*"
    assert alerting.rule_labels == (("release", "prom-stack"), ("team", "inference"))
    assert alerting.fleet_headroom_min_requests == 25 and alerting.capacity_drift_ratio == 0.15
    assert alerting.vram_growth_bytes_per_hour == 512 * 1024**2
    assert alerting.saturation_gate_fraction == 0.5
    assert (alerting.saturation_ahead_for_seconds, alerting.saturation_trend_window_seconds) == (120, 3600)
    with pytest.raises(AttributeError):
        alerting.runbook_url = "x"  # type: ignore[misc]


def test_alerting_defaults_are_the_values_the_rules_had_as_constants():
    alerting = parse_config("{}", "empty.yaml", environ={}).alerting
    assert alerting.runbook_url == "https://github.com/plimsoll-dev/plimsoll/blob/main/rules/RUNBOOK.md"
    assert alerting.exporter_job == ".*plimsoll.*"
    assert alerting.rule_labels == (("release", "kube-prometheus-stack"),)
    assert alerting.fleet_headroom_min_requests == 10 and alerting.capacity_drift_ratio == 0.2
    assert alerting.vram_growth_bytes_per_hour == 2 * 1024**3 and alerting.saturation_gate_fraction == 0.6
    assert (alerting.saturation_ahead_for_seconds, alerting.saturation_trend_window_seconds) == (300, 1800)


def test_empty_rule_labels_leave_only_the_app_labels_for_a_prometheus_that_selects_every_rule():
    assert parse_config("alerting: {rule_labels: {}}", "c.yaml", environ={}).alerting.rule_labels == ()


def test_every_bad_alerting_value_is_reported_in_one_pass_naming_its_field():
    report = check_config(
        """
alerting:
  runbook_url: RUNBOOK.md
  exporter_job: "plimsoll("
  rule_labels: {release: 7}
  fleet_headroom_min_requests: -3
  capacity_drift_ratio: 2
  vram_growth_per_hour: 0
  saturation_gate_fraction: 1.5
  saturation_ahead_for: 5
  saturation_trend_window: soon
  runbook: x
""",
        "c.yaml",
        environ={},
    )
    by_field = {problem.split(": ")[1]: problem for problem in report.problems}
    assert set(by_field) == {
        "alerting.runbook",
        "alerting.runbook_url",
        "alerting.exporter_job",
        "alerting.rule_labels",
        "alerting.fleet_headroom_min_requests",
        "alerting.capacity_drift_ratio",
        "alerting.vram_growth_per_hour",
        "alerting.saturation_gate_fraction",
        "alerting.saturation_ahead_for",
        "alerting.saturation_trend_window",
    }
    assert "not an http(s) URL" in by_field["alerting.runbook_url"]
    assert "not a regex" in by_field["alerting.exporter_job"]
    assert "release: 7 is a number, not text (quote it)" in by_field["alerting.rule_labels"]
    assert "(0 or more)" in by_field["alerting.fleet_headroom_min_requests"]
    assert "2 is not a ratio between 0 and 1" in by_field["alerting.capacity_drift_ratio"]
    assert "more than zero" in by_field["alerting.vram_growth_per_hour"]
    assert "write 5s" in by_field["alerting.saturation_ahead_for"]
    assert "unknown field" in by_field["alerting.runbook"]
    assert report.config.alerting == parse_config("{}", "empty.yaml", environ={}).alerting  # bad fields: defaults


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("runbook_url", "https://example.com/RUNBOOK.md#top", "#fragment"),
        ("runbook_url", "https://example.com/{{ .Bad/RUNBOOK.md", "Prometheus would read it as a template"),
        ("runbook_url", '"https://example.com/\\nRUNBOOK.md"', "not an http(s) URL on one line"),
        ("exporter_job", '"plimsoll"', "without quotes or backslashes"),
        ("rule_labels", "[release]", "expected a map"),
        ("rule_labels", "{release: {name: x}}", "is a map, not text"),
        ("rule_labels", "{release: 'has space'}", "not a Kubernetes label value"),
        ("rule_labels", "{'bad key': x}", "not a Kubernetes label name"),
    ],
)
def test_alerting_values_a_generated_file_could_not_hold_are_refused(field, value, said):
    document = f"alerting:\n  {field}: {value}\n" if field != "exporter_job" else f"alerting:\n  {field}: '{value}'\n"
    (problem,) = check_config(document, "c.yaml", environ={}).problems
    assert problem.startswith(f"c.yaml: alerting.{field}: ") and said in problem, problem


AUTOSCALING = """
autoscaling:
  prometheus: http://prometheus-operated.monitoring:9090
  margin: 0.7
  demand_window: 15m
  overprovisioned_for: 12h
  workloads:
    - {model: meta-llama/Llama-3.1-8B-Instruct, kind: StatefulSet, name: vllm-llama-8b, namespace: inference,
       min_replicas: 2, max_replicas: 8, startup: 5m, knee_concurrency: 24}
    - {model: tiny-llama, name: vllm-tiny, namespace: demo, max_replicas: 3}
pricing:
  gpu_hour: {L40S: 0.99, H100-80GB: 2.49}
"""


def test_the_autoscaling_and_pricing_sections_become_frozen_objects_with_defaults_for_what_is_left_out():
    config = parse_config(AUTOSCALING, "config.yaml", environ={})
    assert config.autoscaling == AutoscalingConfig(
        prometheus="http://prometheus-operated.monitoring:9090",
        margin=0.7,
        demand_window_seconds=900.0,
        overprovisioned_for_seconds=43200.0,
        workloads=(
            ScaledWorkload(
                "meta-llama/Llama-3.1-8B-Instruct", "StatefulSet", "vllm-llama-8b", "inference", 2, 8, 300.0, 24
            ),
            ScaledWorkload("tiny-llama", "Deployment", "vllm-tiny", "demo", 1, 3, 300.0, None),
        ),
    )
    assert config.gpu_hour_prices == (("H100-80GB", 2.49), ("L40S", 0.99))
    hash(config)


def test_without_the_sections_there_is_no_autoscaling_and_no_price():
    config = parse_config("{}", "c.yaml", environ={})
    assert config.autoscaling is None and config.gpu_hour_prices == ()
    defaults = parse_config("autoscaling: {workloads: [{model: m, name: m, namespace: n, max_replicas: 1}]}", "c", {})
    assert defaults.autoscaling is not None
    assert (defaults.autoscaling.prometheus, defaults.autoscaling.margin) == (None, 0.8)
    assert (defaults.autoscaling.demand_window_seconds, defaults.autoscaling.overprovisioned_for_seconds) == (
        600,
        86400,
    )


def test_every_bad_autoscaling_and_pricing_value_is_reported_in_one_pass_naming_its_field():
    report = check_config(
        """
autoscaling:
  prometheus: prometheus:9090
  margin: 80
  demand_window: 4m
  overprovisioned_for: 5
  replicas: 3
  workloads:
    - {model: "a\\tb", kind: Pod, name: Bad_Name, namespace: inference, min_replicas: 3, max_replicas: 8,
       knee_concurrency: 0}
    - {model: m, name: x, namespace: ns, min_replicas: 3, max_replicas: 2, startup: 2m}
    - {model: other, name: x, namespace: ns, max_replicas: 2, startup: 5m}
    - {model: m, name: y, namespace: ns, max_replicas: 2, startup: 1m}
    - {model: z, namespace: NS}
pricing:
  gpu_hour: {H100-80GB: 2.49, L40S: -1, A10: cheap, H10O: 2.49, NVIDIA A2: 0.5}
  currency: EUR
""",
        "c.yaml",
        environ={},
    )
    by_field = {}
    for problem in report.problems:
        by_field.setdefault(problem.split(": ")[1], []).append(problem)
    assert set(by_field) == {
        "autoscaling.prometheus",
        "autoscaling.margin",
        "autoscaling.overprovisioned_for",
        "autoscaling.replicas",
        "autoscaling.workloads[0].model",
        "autoscaling.workloads[0].kind",
        "autoscaling.workloads[0].name",
        "autoscaling.workloads[0].knee_concurrency",
        "autoscaling.workloads[1].min_replicas",
        "autoscaling.workloads[2].name",
        "autoscaling.workloads[2].startup",
        "autoscaling.workloads[3].model",
        "autoscaling.workloads[4].name",
        "autoscaling.workloads[4].namespace",
        "autoscaling.workloads[4].max_replicas",
        "pricing.gpu_hour",
        "pricing.currency",
    }
    said = {field: " ".join(problems) for field, problems in by_field.items()}
    assert "did you mean 0.8?" in said["autoscaling.margin"]
    assert "without line breaks, tabs or other control characters" in said["autoscaling.workloads[0].model"]
    assert "not one of Deployment, StatefulSet" in said["autoscaling.workloads[0].kind"]
    assert "3 is above max_replicas 2" in said["autoscaling.workloads[1].min_replicas"]
    assert "Deployment ns/x is also autoscaling.workloads[1]" in said["autoscaling.workloads[2].name"]
    assert "longer than autoscaling.demand_window" in said["autoscaling.workloads[2].startup"]
    assert "'m' is also the model of autoscaling.workloads[1]" in said["autoscaling.workloads[3].model"]
    assert "missing" in said["autoscaling.workloads[4].name"]
    assert "not a Kubernetes namespace" in said["autoscaling.workloads[4].namespace"]
    assert "L40S: -1 is not a price" in said["pricing.gpu_hour"] and "A10: 'cheap'" in said["pricing.gpu_hour"]
    # A typo would leave that GPU unpriced without a word; an NVML product name outside the presets is fine.
    assert "H10O: neither a GPU preset" in said["pricing.gpu_hour"] and "A2:" not in said["pricing.gpu_hour"]


@pytest.mark.parametrize(("margin", "knee"), [(0.0004, 1), (0.0005, 1), (0.0001, 4)])
def test_a_knee_times_margin_the_scalers_would_write_as_zero_is_refused_naming_the_workload(margin, knee):
    # KEDA's threshold '0' and the HPA's '0m' are targets Kubernetes refuses: the config is where it can be fixed.
    text = (
        f"autoscaling:\n  margin: {margin}\n  workloads:\n"
        f"    - {{model: m, name: llm, namespace: ns, max_replicas: 2, knee_concurrency: {knee}}}\n"
    )
    (problem,) = check_config(text, "c.yaml", environ={}).problems
    assert problem.startswith("c.yaml: autoscaling.workloads[0].knee_concurrency: "), problem
    assert f"x autoscaling.margin {margin:g}" in problem and "Deployment ns/llm" in problem, problem


def test_the_smallest_knee_times_margin_the_scalers_write_as_non_zero_is_accepted():
    text = (
        "autoscaling:\n  margin: 0.0006\n  workloads:\n"
        "    - {model: m, name: llm, namespace: ns, max_replicas: 2, knee_concurrency: 1}\n"
    )
    assert check_config(text, "c.yaml", environ={}).problems == ()


@pytest.mark.parametrize("workloads", ["[]", "none-here", "{model: m}"])
def test_autoscaling_without_a_list_of_workloads_says_what_a_workload_needs(workloads):
    (problem,) = check_config(f"autoscaling:\n  workloads: {workloads}\n", "c.yaml", environ={}).problems
    assert problem.startswith("c.yaml: autoscaling.workloads: expected a list of at least one workload"), problem


@pytest.mark.parametrize("escape", [r"\n", r"\r", r"\N", r"\L", r"\0"])
def test_an_exporter_job_with_a_line_break_or_control_character_is_refused_before_it_ends_a_monitor_comment(escape):
    """The ServiceMonitor's and PodMonitor's comments quote the job regex: a line break in it would start settings."""
    document = f'alerting:\n  exporter_job: ".*plimsoll.*{escape}kind: ConfigMap"\n'
    (problem,) = check_config(document, "c.yaml", environ={}).problems
    assert problem.startswith("c.yaml: alerting.exporter_job: ") and "one line of printable text" in problem, problem


def test_a_file_sd_target_or_model_label_that_is_not_a_label_value_refuses_the_file_naming_the_label():
    text = '[{targets: ["10.0.0.7:8000"], labels: {target: "node-a\\rfoo", model: "<<.Series>>"}}]'
    with pytest.raises(ConfigError) as raised:
        parse_target_file(text, "targets.yaml")
    assert [problem.split(" is not")[0] for problem in raised.value.problems] == [
        "targets.yaml: [0].labels.target: 'node-a\\rfoo'",
        "targets.yaml: [0].labels.model: '<<.Series>>'",
    ]


def test_a_priced_gpu_name_that_is_not_a_label_value_is_refused_on_one_line():
    document = 'pricing:\n  gpu_hour: {"NVIDIA A40\\rkind: ConfigMap": 1.2}\n'
    (problem,) = check_config(document, "c.yaml", environ={}).problems
    assert problem.startswith("c.yaml: pricing.gpu_hour: 'NVIDIA A40\\rkind: ConfigMap' is not a usable label value")


def test_a_duration_past_a_year_is_refused_where_a_sleep_on_it_would_overflow():
    problems = check_config("poll_interval: 99999999999h\nslo_period: 366d\n", "c.yaml", environ={}).problems
    assert problems == ("c.yaml: poll_interval: '99999999999h' is out of range: Plimsoll accepts durations up to 366d",)


def test_replica_counts_past_what_kubernetes_takes_are_refused_not_written_into_a_scaler():
    """maxReplicas is an int32 in the HPA and ScaledObject APIs: a larger one generated a file the API refuses."""
    workload = "{model: m, name: m, namespace: n, max_replicas: 1e300, knee_concurrency: 2e6, gpus_per_replica: 2e6}"
    problems = check_config(f"autoscaling: {{workloads: [{workload}]}}", "c.yaml", environ={}).problems
    assert problems == (
        "c.yaml: autoscaling.workloads[0].max_replicas: '1e300' is out of range: Plimsoll accepts 1 to 2,147,483,647",
        "c.yaml: autoscaling.workloads[0].knee_concurrency: '2e6' is out of range: Plimsoll accepts 1 to 1,048,576",
        "c.yaml: autoscaling.workloads[0].gpus_per_replica: '2e6' is out of range: Plimsoll accepts 1 to 1,048,576",
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://ops:hunter2@wiki.example/RUNBOOK.md", "credentials in the runbook URL would show in every alert"),
        ("ftp://ops:hunter2@wiki.example/RUNBOOK.md", "'ftp://***@wiki.example/RUNBOOK.md' is not an http(s) URL"),
        ("https://ops:hunter2@[::1/RUNBOOK.md", "'https://***@[::1/RUNBOOK.md' is not an http(s) URL"),
    ],
)
def test_a_runbook_url_with_a_password_is_refused_without_repeating_it(url: str, problem: str):
    (found,) = check_config(yaml.safe_dump({"alerting": {"runbook_url": url}}), "c.yaml", environ={}).problems
    assert found.startswith(f"c.yaml: alerting.runbook_url: {problem}") and "hunter2" not in found, found


def test_a_gpu_hour_price_past_any_real_one_is_refused_as_a_typo_naming_the_field():
    """1e308 is finite: priced GPUs times hours overflowed to Infinity, which json.dumps writes into result.json."""
    document = "pricing:\n  gpu_hour: {H100-80GB: 1e308, L40S: 10001, NVIDIA A40: .inf, A10: 10000}\n"
    (problem,) = check_config(document, "c.yaml", environ={}).problems
    assert problem.startswith("c.yaml: pricing.gpu_hour: "), problem
    assert "H100-80GB: '1e308' is out of range: a price above 10,000 per GPU-hour is a typo" in problem
    assert "L40S: 10001 is out of range" in problem and "NVIDIA A40: inf is not a price per GPU-hour" in problem
    assert "A10:" not in problem


def test_a_request_count_or_memory_growth_past_any_real_one_is_refused():
    document = "saturation: {queue: 1e308}\nalerting: {fleet_headroom_min_requests: 2e6, vram_growth_per_hour: 1e300}\n"
    assert [problem.split(": ", 2)[1:] for problem in check_config(document, "c.yaml", environ={}).problems] == [
        ["saturation.queue", "'1e308' is out of range: Plimsoll accepts up to 1,000,000 requests"],
        ["alerting.fleet_headroom_min_requests", "'2e6' is out of range: Plimsoll accepts up to 1,000,000 requests"],
        ["alerting.vram_growth_per_hour", "'1e300' is out of range: Plimsoll accepts up to 4 TiB an hour"],
    ]


def test_a_long_unknown_key_or_value_is_cut_short_in_the_message():
    key, value = "k" * 10_000, "v" * 10_000
    target = {"url": "http://a:1/metrics", "name": "n", key: 1}
    document = yaml.safe_dump({key: 1, "targets": [target], "timeout": value})
    problems = check_config(document, "c.yaml", environ={}).problems
    assert len(problems) == 3 and all(len(problem) < 400 for problem in problems), problems
    assert problems[0].startswith(f"c.yaml: {'k' * 40}...: unknown field (expected one of: listen,")
    assert problems[1].startswith("c.yaml: timeout: 'vvv") and "is not a duration" in problems[1]
    assert problems[2].startswith(f"c.yaml: targets[0].{'k' * 40}...: unknown field")


def test_an_unset_variable_with_a_long_name_is_named_cut_short():
    (problem,) = check_config("timeout: ${" + "A" * 10_000 + "}\n", "c.yaml", environ={}).problems[:1]
    assert problem.startswith(f"c.yaml: timeout: environment variable {'A' * 40}... is not set") and len(problem) < 200


@pytest.mark.parametrize("size", ["0", "1", "'63KiB'"])
def test_a_response_cap_too_small_for_any_metrics_page_is_refused(size):
    (problem,) = check_config(f"max_response_size: {size}\n", "c.yaml", environ={}).problems
    assert problem.startswith(f"c.yaml: max_response_size: {size} is too small: a vLLM /metrics page"), problem
    assert parse_config("max_response_size: 64KiB\n", "c.yaml", environ={}).max_response_bytes == 64 * 1024


def test_a_response_cap_past_any_real_page_is_refused_as_a_typo():
    """The daemon buffers each page whole: 64GiB for 64MiB would let one scrape take gigabytes."""
    (problem,) = check_config("max_response_size: 64GiB\n", "c.yaml", environ={}).problems
    assert problem.startswith("c.yaml: max_response_size: '64GiB' is too large: "), problem
    assert "use at most 64MiB" in problem
    assert parse_config("max_response_size: 64MiB\n", "c.yaml", environ={}).max_response_bytes == 64 * 1024**2


SECRET = "hunter2-Sup3r-s3cret-t0ken"


def test_a_value_from_the_environment_is_named_by_its_variable_never_quoted(tmp_path):
    """A variable often holds a secret: put in the wrong field, it must not be printed in the error."""
    environ = {"TOKEN": SECRET, "LONG": SECRET * 10, "TAB": f"{SECRET}\tx", "QUOTES": f'it\'s {SECRET} "q"'}
    document = """
timeout: ${TOKEN}
nvml: ${LONG}
listen: ${QUOTES}
targets:
  - {name: '${TOKEN}', url: 'http://h:1/${TOKEN} x', bearer_token_file: '${TOKEN}', model: '${TAB}'}
  - {name: '${TOKEN}', url: 'http://h:2/metrics'}
pricing: {gpu_hour: {H100: '${TOKEN}'}}
"""
    problems = check_config(document, str(tmp_path / "c.yaml"), environ=environ).problems
    assert not [problem for problem in problems if "s3cret" in problem], problems
    said = {problem.split(": ")[1]: problem.split(": ", 2)[2] for problem in problems}
    assert said.pop("targets[0].model").startswith("the value of ${TAB} is not a usable label value")
    assert said == {
        "timeout": "the value of ${TOKEN} is not a duration (expected e.g. 500ms, 5s, 15m, 1h30m)",
        "nvml": "expected true or false (or on/off, yes/no), got '${LONG}...'",
        "listen": "the value of ${QUOTES} is not host:port (e.g. 0.0.0.0:19842)",
        "targets[0].url": "'http://h:1/${TOKEN} x' is not a URL: it holds a space or a control character (write a "
        "space as %20)",
        "targets[0].bearer_token_file": f"cannot read {tmp_path}/${{TOKEN}}: No such file or directory",
        "targets[1].name": "the value of ${TOKEN} is used by another target (names label every series: keep them "
        "unique)",
        "pricing.gpu_hour": "H100: the value of ${TOKEN} is not a price per GPU-hour",
    }


def test_a_value_too_short_to_be_a_secret_is_hidden_where_quoted_whole_not_in_the_words_of_the_message():
    (problem,) = check_config("targets: [{url: '${U}'}]\n", "c.yaml", environ={"U": "a"}).problems
    assert problem == "c.yaml: targets[0].url: the value of ${U} is not a URL (expected http://host:port/path)"


def test_a_variable_is_hidden_only_in_the_problems_of_its_own_field_or_list_entry():
    document = "targets: [{url: 'http://h:1/metrics', engine: '${ENGINE}'}, {url: 'http://h:2/metrics', engine: vlm}]"
    problems = check_config(document, "c.yaml", environ={"ENGINE": "vllm-x"}).problems
    assert [problem.split(" is not one of")[0] for problem in problems] == [
        "c.yaml: targets[0].engine: the value of ${ENGINE}",
        "c.yaml: targets[1].engine: 'vlm'",
    ]
    assert ", vllm, " in problems[1]


_PLACES = (
    "listen: '{v}'",
    "timeout: '{v}'",
    "max_response_size: '{v}'",
    "web_config: '{v}'",
    "nvml: '{v}'",
    "targets: [{{url: '{v}', bearer_token_file: '{v}'}}]",
    "targets: [{{url: 'http://h:1/m', name: '{v}', model: '{v}', gpus: '{v}', deployment: {{dtype: ['{v}']}}}}]",
    "pricing: {{gpu_hour: {{H100: '{v}'}}}}",
    "autoscaling: {{workloads: [{{model: m, name: '{v}', namespace: '{v}', max_replicas: '{v}'}}]}}",
)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=4, max_size=100), st.sampled_from(_PLACES), st.sampled_from(["${V}", "x${V}", "http://${V}/m"]))
def test_a_value_from_the_environment_never_reaches_a_problem_whatever_it_holds_and_wherever_it_goes(
    value, place, written
):
    forms = {form for form in (value, value.strip(), repr(value)[1:-1]) if len(form) >= 4}
    for problem in check_config(place.format(v=written), "c.yaml", environ={"V": value}).problems:
        assert not [form for form in forms if form in problem.split(": ", 2)[2]], problem


def test_a_duration_no_rule_could_say_is_refused_naming_its_field():
    """Prometheus durations count whole milliseconds: `generate` failed on 0.1ms without naming the field, and YAML's
    .nan read as "nan has no unit: write nans"."""
    document = "slo_period: 0.4ms\nslos: {ttft: {threshold: 0.1ms}}\ntimeout: .nan\n"
    assert [problem.split(": ", 2)[1:] for problem in check_config(document, "c.yaml", environ={}).problems] == [
        ["timeout", "nan is not a duration (expected e.g. 500ms, 5s, 15m, 1h30m)"],
        ["slos.ttft.threshold", "'0.1ms' is shorter than a millisecond, the shortest duration a rule can say"],
        ["slo_period", "'0.4ms' is shorter than a millisecond, the shortest duration a rule can say"],
    ]
    assert parse_config("timeout: 1ms\n", "c.yaml", environ={}).timeout_seconds == 0.001


@pytest.mark.parametrize("username", ["ops:admin", "ops\rx"])
def test_a_basic_auth_user_name_the_server_would_split_or_that_is_not_one_line_is_refused(tmp_path, username):
    """Basic auth is base64("user:password"): a ':' in the name moves the split, so the server sees another user."""
    (tmp_path / "password").write_text("pw\n")
    target = {"url": "http://a:1/metrics", "basic_auth": {"username": username, "password_file": "password"}}
    (problem,) = check_config(yaml.safe_dump({"targets": [target]}), str(tmp_path / "c.yaml"), environ={}).problems
    assert problem.split(": ", 2)[1] == "targets[0].basic_auth.username", problem
    assert problem.endswith("is not a user name (one line of text, without ':')"), problem


def test_a_file_path_with_a_control_character_or_past_any_real_length_is_named_on_one_short_line():
    """NUL gave os.stat's bare "embedded null byte"; a megabyte of path was repeated whole in the message."""
    document = yaml.safe_dump(
        {"web_config": "a\x00b", "targets": [{"url": "http://a:1/m", "bearer_token_file": "x" * 10**6}]}
    )
    problems = check_config(document, "c.yaml", environ={}).problems
    assert (
        problems[0] == "c.yaml: web_config: 'a\\x00b' is not the path of the web config: it holds a control character"
    )
    assert problems[1] == f"c.yaml: targets[0].bearer_token_file: cannot read {'x' * 200}...: File name too long"


@pytest.mark.parametrize(
    "field",
    ["max_response_size", "max_series_per_target", "saturation.queue", "saturation.kv_usage", "pricing.gpu_hour.H100"],
)
def test_an_integer_past_any_float_is_a_problem_not_a_traceback(field):
    """YAML reads 1 followed by 400 zeros as an int, and float() of it raised OverflowError, a traceback."""
    *parents, key = field.split(".")
    document: dict = {key: 10**400}
    for parent in reversed(parents):
        document = {parent: document}
    (problem,) = check_config(yaml.safe_dump(document), "c.yaml", environ={}).problems
    path = field if not field.startswith("pricing") else "pricing.gpu_hour"
    assert problem.startswith(f"c.yaml: {path}: ") and f"{'0' * 70}..." in problem and len(problem) < 200, problem


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ('discovery: {files: ""}', "discovery.files"),
        ('discovery: {files: [""]}', "discovery.files"),
        ('discovery: {files: ["a\\nb"]}', "discovery.files"),
        ("discovery: {kubernetes: {namespaces: false}}", "discovery.kubernetes.namespaces"),
        ('discovery: {kubernetes: {namespaces: [inference, "a/b?x"]}}', "discovery.kubernetes.namespaces"),
        ('discovery: {kubernetes: {namespaces: ["inference\\n"]}}', "discovery.kubernetes.namespaces"),
        (
            'autoscaling: {workloads: [{model: m, name: n, namespace: "ns\\n", max_replicas: 1}]}',
            "autoscaling.workloads[0].namespace",
        ),
        (
            'autoscaling: {workloads: [{model: m, name: "n\\n", namespace: ns, max_replicas: 1}]}',
            "autoscaling.workloads[0].name",
        ),
        ('alerting: {rule_labels: {release: "x\\n"}}', "alerting.rule_labels"),
    ],
)
def test_a_file_or_kubernetes_name_that_is_empty_not_a_list_or_ends_in_a_line_break_is_refused(document, field):
    """An empty text or a false read as no list at all ("every namespace"); a namespace goes into the API's path; and
    a regex's "$" let a trailing line break through into a manifest."""
    (problem,) = check_config(document, "c.yaml", environ={}).problems
    assert problem.startswith(f"c.yaml: {field}: "), problem


def test_check_config_names_the_variable_in_what_the_capacity_model_finds_too(tmp_path, monkeypatch, capsys):
    """check-config adds the capacity model's problems (an unknown model or GPU) after the file's: a secret put in
    gpu_type by mistake must not be printed there either."""
    config = tmp_path / "c.yaml"
    config.write_text("targets: [{url: 'http://127.0.0.1:1/metrics', model: llama-3.1-8b, gpu_type: '${TOKEN}'}]\n")
    monkeypatch.setenv("TOKEN", SECRET)
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: targets[0].gpu_type: unknown GPU the value of ${{TOKEN}}." in err and "s3cret" not in err, err


def test_periods_and_windows_too_short_for_the_rules_they_feed_are_refused_naming_the_field():
    """An SLO period shorter than the slowest burn-rate window (3d) leaves it no budget to measure, and a trend
    window under a minute holds too few of the monitors' 15s scrapes for predict_linear: rules that never fire."""
    document = "slo_period: 1d\nalerting: {saturation_trend_window: 30s}\n"
    assert [problem.split(": ", 2)[1:] for problem in check_config(document, "c.yaml", environ={}).problems] == [
        [
            "slo_period",
            "'1d' is shorter than 3d: the slowest burn-rate alert looks back 3d, so the period must hold it",
        ],
        [
            "alerting.saturation_trend_window",
            "'30s' is shorter than 1m: predict_linear needs several scrapes (every 15s) in its window",
        ],
    ]
    config = parse_config("slo_period: 3d\nalerting: {saturation_trend_window: 1m}\n", "c.yaml", environ={})
    assert (config.slo_period_seconds, config.alerting.saturation_trend_window_seconds) == (3 * 86400.0, 60.0)
