"""Config loading: every problem reported at once, each with the file, the field path and what is expected."""

import pytest

from exporter.config import DEFAULT_PORT, ConfigError, load_config, parse_config, parse_target_file

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
