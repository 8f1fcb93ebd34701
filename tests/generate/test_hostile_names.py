"""Label values from the config (a model name above all) in every generated file: a name that is not a label value
is refused by every generator, and one that is (quotes, braces, backslashes, YAML and PromQL syntax, unicode) comes
back from each file exactly as written: in the YAML, and in the PromQL selectors, which real promtool evaluates."""

import dataclasses
import json
import re

import pytest
import yaml

from exporter.config import AutoscalingConfig, Config, ConfigError, ScaledWorkload
from exporter.generate import autoscaling, dashboards, rules
from exporter.generate.command import artifacts
from tests.generate.conftest import promtool_rule_tests

# Valid, and hostile to every syntax it passes through: YAML (": ", "#", "&", "*", "[", "'"), PromQL strings (a quote
# and a backslash) and the parentheses around them (an unbalanced ")"), Go templates ("{{"), and not ASCII.
HOSTILE_MODEL = 'acme/"Llama" {{3.1}} \\ it\'s #1: [ünïcødé 模型] & *ref :-)'


def _config(model: str) -> Config:
    workload = ScaledWorkload(
        model=model,
        kind="Deployment",
        name="vllm-hostile",
        namespace="inference",
        min_replicas=1,
        max_replicas=8,
        startup_seconds=300.0,
        knee_concurrency=24,
    )
    section = AutoscalingConfig(
        prometheus="http://prometheus-operated.monitoring:9090",
        margin=0.8,
        demand_window_seconds=600.0,
        overprovisioned_for_seconds=86400.0,
        workloads=(workload,),
    )
    return dataclasses.replace(Config(), autoscaling=section)


def _documents(path_suffix: str) -> list:
    (item,) = [item for item in artifacts(_config(HOSTILE_MODEL)) if item.path.endswith(path_suffix)]
    return list(yaml.safe_load_all(item.text))


def test_every_generated_yaml_file_parses_to_one_document_with_a_hostile_but_valid_model_name():
    for item in artifacts(_config(HOSTILE_MODEL)):
        if item.path.endswith(".yaml"):
            assert len(list(yaml.safe_load_all(item.text))) == 1, item.path


def test_the_hostile_model_name_comes_back_identical_from_the_rule_labels():
    (document,) = _documents(rules.RULES_PATH)
    labelled = [
        rule["labels"]["model"]
        for group in document["groups"]
        for rule in group["rules"]
        if "model" in rule.get("labels", {})
    ]
    assert labelled == [HOSTILE_MODEL]
    (resource,) = _documents(rules.PROMETHEUS_RULE_PATH)
    assert resource["spec"]["groups"] == document["groups"]


def test_the_hostile_model_name_reaches_each_scaler_query_as_one_promql_string(prometheus_tools, tmp_path):
    """promtool evaluates the rules and each KEDA and adapter query over the replicas of the hostile model (its name
    written by json.dumps, whose escapes PromQL reads): 30 running and 10 waiting is 40 requests at peak over 19.2
    per replica, so 3 replicas, and 10 waiting."""
    (rule_file,) = [item for item in rules.artifacts(_config(HOSTILE_MODEL)) if item.path == rules.RULES_PATH]
    (tmp_path / "rules.yaml").write_text(rule_file.text)
    (keda,) = _documents("vllm-hostile-scaledobject.yaml")
    (adapter,) = _documents(autoscaling.ADAPTER_RULES_PATH)
    demand, queue = (trigger["metadata"]["query"] for trigger in keda["spec"]["triggers"])
    assert [rule["metricsQuery"] for rule in adapter["externalRules"]] == [demand, queue]
    model = json.dumps(HOSTILE_MODEL)
    checks = [(demand, 40), (queue, 10), (f"sum({rules.NEEDED_RECORD}{{model={model}}})", 3)]
    unit = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'plimsoll_requests_{what}{{model={model}, target="a", instance="a:1"}}', "values": v}
                    for what, v in (("running", "30x10"), ("waiting", "10x10"))
                ],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": value}]}
                    for expr, value in checks
                ],
            }
        ],
    }
    promtool_rule_tests(prometheus_tools["promtool"], tmp_path, unit)


# Grafana's own pattern for a variable reference ($name, [[name:format]], ${name.path:format}), as its template
# service matches it (public/app/features/variables/utils.ts).
GRAFANA_VARIABLE = re.compile(r"\$(\w+)|\[\[([\s\S]+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def test_a_model_named_like_a_grafana_variable_or_markdown_is_shown_as_written_in_every_title_and_description():
    texts = []
    for item in dashboards.artifacts(_config("acme/$model-${target}-[[node]]`*x*")):
        dashboard = json.loads(item.text)
        panels = [*dashboard["panels"], *(inner for panel in dashboard["panels"] for inner in panel.get("panels", []))]
        texts += [text for panel in [dashboard, *panels] for text in (panel["title"], panel.get("description") or "")]
    assert not [text for text in texts if GRAFANA_VARIABLE.search(text)]
    # In a code span, fenced by more backticks than it holds, so Grafana's Markdown shows it as written.
    assert any("``acme/\uff04model-\uff04{target}-\uff3b[node]]`*x*`` 5 min" in text for text in texts)


NOT_LABEL_VALUES = {
    "carriage return": "tiny\rkind: ConfigMap",
    "next line": "tiny\x85kind: ConfigMap",
    "nul": "tiny\x00",
    "line separator": "tiny\u2028kind: ConfigMap",
    "delete": "tiny\x7f",
    "adapter template": "<<.Series>>",
    "too long": "m" * 257,
    "empty": "",
}


@pytest.mark.parametrize("model", NOT_LABEL_VALUES.values(), ids=NOT_LABEL_VALUES.keys())
@pytest.mark.parametrize("generator", [rules.artifacts, autoscaling.artifacts], ids=["rules", "autoscaling"])
def test_each_generator_refuses_a_model_that_is_not_a_label_value_naming_the_field(generator, model):
    with pytest.raises(ConfigError) as raised:
        generator(_config(model))
    (problem,) = raised.value.problems
    assert problem.startswith("autoscaling.workloads[0].model: ")
    assert "a label value is printable text" in problem
