"""Thresholds from the operating point (the lower of the SLO knee and the saturation point), thresholds.yaml, and
--write into the user's config (comments kept, backup, atomic), the operating point included as the autoscaling
workload's knee_concurrency."""

import errno
import re
from dataclasses import replace

import pytest

from exporter import files
from exporter.config import check_config, load_config, load_yaml
from exporter.generate.rules import artifacts
from exporter.loadtest import thresholds
from exporter.loadtest.outputs import write_outputs
from exporter.loadtest.thresholds import ReplicaKnee, ThresholdsError, derive_thresholds, write_thresholds
from tests.conftest import TESTS
from tests.loadtest import built_steps

EXAMPLE = TESTS.parent / "deploy" / "plimsoll.example.yaml"

CONFIG = """\
# Production fleet: edited by hand, keep these comments.
listen: "0.0.0.0:19842"
slos:
  ttft: {threshold: 500ms, objective: 0.99}   # the product's promise
saturation:
  kv_usage: 0.90      # until loadtest calibrates it
  lead_time: 20m
nvml: false
"""


def test_kv_threshold_is_the_operating_points_usage_less_the_margin_clamped_to_half_and_0_99():
    point = built_steps.step(12, passed=True, kv=0.86, waiting=1.3)
    assert derive_thresholds(point, 0.05).kv_usage == 0.817
    assert derive_thresholds(replace(point, kv_cache_usage_ratio=0.2), 0.05).kv_usage == 0.5
    assert derive_thresholds(replace(point, kv_cache_usage_ratio=1.0), 0.0).kv_usage == 0.99


def test_queue_threshold_is_the_mean_waiting_at_the_operating_point_rounded_up():
    point = built_steps.step(12, passed=True, kv=0.86, waiting=1.3)
    assert derive_thresholds(point).queue == 2
    assert derive_thresholds(replace(point, requests_waiting=0.0)).queue == 0
    assert derive_thresholds(replace(point, requests_waiting=None)).queue is None


def test_no_operating_point_or_no_engine_readings_give_nothing_to_write():
    assert derive_thresholds(None).fragment() is None
    silent = built_steps.step(4, passed=True, kv=None, waiting=None)
    assert derive_thresholds(silent).fragment() is None


def test_thresholds_yaml_passes_check_config_and_becomes_the_saturated_alert(tmp_path):
    written = write_outputs(tmp_path, built_steps.several_steps())
    assert written.thresholds is not None
    text = written.thresholds.read_text()
    assert text.startswith("# Written by `plimsoll loadtest`")
    config = load_config(written.thresholds)
    assert (config.saturation_kv_usage, config.saturation_queue, config.lead_time_seconds) == (0.817, 2, 900)
    rules = next(item.text for item in artifacts(config) if item.path.endswith("plimsoll.rules.yaml"))
    assert "plimsoll_kv_cache_usage_ratio >= 0.817" in rules
    assert "plimsoll_requests_waiting > 2" in rules
    assert "# SLO knee: concurrency 12.\n# Saturation point: concurrency 14 (kv_full, queue).\n" in text
    assert "# Operating point (the lower of the two): concurrency 12; KV usage there (p90) 0.860," in text
    assert "# Autoscaling: one replica holds 12 requests: knee_concurrency: 12 in the" in text


def test_thresholds_yaml_from_a_saturation_point_below_the_knee_is_calibrated_there(tmp_path):
    written = write_outputs(tmp_path, built_steps.saturated_below_knee())
    assert written.thresholds is not None
    text = written.thresholds.read_text()
    config = load_config(written.thresholds)
    # KV usage 0.6 at the saturation point (8) x 0.95; its 2 waiting. The knee (16) had 0.62 and 9.
    assert (config.saturation_kv_usage, config.saturation_queue) == (0.57, 2)
    assert "# Operating point (the lower of the two): concurrency 8;" in text
    assert "knee_concurrency: 8 in the autoscaling workload" in text


def test_check_config_refuses_a_negative_queue_naming_the_field():
    problems = check_config("saturation: {queue: -1}\n", "c.yaml").problems
    assert problems == ("c.yaml: saturation.queue: -1 is not a number of requests (0 or more)",)


def test_write_sets_the_measured_keys_and_keeps_comments_order_and_the_rest(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    write_thresholds(path, {"saturation": {"kv_usage": 0.817, "queue": 2}})
    text = path.read_text()
    assert "# Production fleet: edited by hand, keep these comments." in text
    assert "# the product's promise" in text
    assert re.search(r"kv_usage: 0\.817 +# until loadtest calibrates it", text)
    assert text.index("listen") < text.index("slos") < text.index("saturation") < text.index("nvml")
    config = load_config(path)
    assert (config.saturation_kv_usage, config.saturation_queue, config.lead_time_seconds) == (0.817, 2, 1200)


def test_write_keeps_the_previous_file_as_a_backup(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    backup = write_thresholds(path, {"saturation": {"kv_usage": 0.8}}).backup
    assert backup == tmp_path / "plimsoll.yaml.bak"
    assert backup.read_text() == CONFIG


def test_a_backup_path_that_is_a_symlink_is_replaced_not_written_through(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not yours to overwrite\n")
    (tmp_path / "plimsoll.yaml.bak").symlink_to(elsewhere)
    backup = write_thresholds(path, {"saturation": {"kv_usage": 0.8}}).backup
    assert backup is not None and not backup.is_symlink() and backup.read_text() == CONFIG
    assert elsewhere.read_text() == "not yours to overwrite\n"


def test_write_adds_a_saturation_block_where_the_config_has_none(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text("# minimal\nnvml: false\n")
    write_thresholds(path, {"saturation": {"kv_usage": 0.8, "queue": 0}})
    assert load_config(path).saturation_queue == 0
    assert path.read_text().startswith("# minimal\n")


def test_a_write_that_fails_leaves_the_config_and_its_previous_backup_whole_and_no_temporary_file(
    tmp_path, monkeypatch
):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    (tmp_path / "plimsoll.yaml.bak").write_text("the previous backup\n")

    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(
        ThresholdsError, match=re.escape("cannot write the updated config (No space left on device); it is unchanged")
    ):
        write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert path.read_text() == CONFIG
    assert (tmp_path / "plimsoll.yaml.bak").read_text() == "the previous backup\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plimsoll.yaml", "plimsoll.yaml.bak"]


_LAUGHS = "".join([f"x{n}: &x{n} [{', '.join([f'*x{n - 1}' if n else '1'] * 10)}]\n" for n in range(9)])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "the top level is not a mapping"),
        ("saturation: 0.9\n", "saturation is not a mapping"),
        ("saturation: {kv_usage: [\n", "not YAML that can be edited in place"),
        # An alias bomb (ruamel's round trip has no bound of its own), an alias into itself, runaway nesting, and
        # nesting the safe loader takes but ruamel's deeper recursion does not: each a message, not a traceback.
        (_LAUGHS, r"not YAML that can be edited in place \(not usable YAML: aliases expand this document"),
        ("slos: &s [*s]\n", r"in place \(not usable YAML: an alias refers to the collection that contains it\)"),
        ("slos: " + "[" * 5000 + "\n", r"not YAML that can be edited in place \(not usable YAML: nested too deeply\)"),
        ("slos: " + "[" * 300 + "]" * 300 + "\n", r"not YAML that can be edited in place \(nested too deeply\)"),
    ],
)
def test_write_refuses_a_file_it_cannot_edit_and_leaves_it_alone(tmp_path, text, message):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(text)
    with pytest.raises(ThresholdsError, match=message) as raised:
        write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert str(raised.value).startswith(str(path))
    assert path.read_text() == text
    assert not (tmp_path / "plimsoll.yaml.bak").exists()


def test_write_refuses_a_value_check_config_would_reject(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    with pytest.raises(ThresholdsError, match=r"saturation\.kv_usage: 1\.5 is not a ratio"):
        write_thresholds(path, {"saturation": {"kv_usage": 1.5}})
    assert path.read_text() == CONFIG


def test_write_refuses_a_read_only_config_which_the_atomic_rename_would_replace(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    path.chmod(0o444)
    with pytest.raises(ThresholdsError, match=re.escape(f"{path}: read-only, so not written; make it writable")):
        write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert path.read_text() == CONFIG and path.stat().st_mode & 0o777 == 0o444
    assert not (tmp_path / "plimsoll.yaml.bak").exists()


def test_write_refuses_a_config_changed_between_its_read_and_its_write(tmp_path, monkeypatch):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    edited = CONFIG.replace("nvml: false", "nvml: true")
    check = thresholds.check_config

    def edit_meanwhile(text, source):  # runs between the read and the write
        path.write_text(edited)
        return check(text, source)

    monkeypatch.setattr(thresholds, "check_config", edit_meanwhile)
    with pytest.raises(ThresholdsError, match=re.escape(f"{path}: changed while it was being updated, so not")):
        write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert path.read_text() == edited
    assert not (tmp_path / "plimsoll.yaml.bak").exists()


def test_write_through_a_symlink_updates_the_file_it_points_to(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text(CONFIG)
    link = tmp_path / "plimsoll.yaml"
    link.symlink_to(real)
    write_thresholds(link, {"saturation": {"queue": 3}})
    assert link.is_symlink()
    assert load_config(real).saturation_queue == 3


FLEET = """\
# Two models, scaled by hand until loadtest measures them.
saturation:
  kv_usage: 0.9
autoscaling:
  margin: 0.8
  workloads:
    - model: meta-llama/Llama-3.1-8B-Instruct   # the label its series carry
      kind: Deployment
      name: vllm-llama-8b
      namespace: inference
      max_replicas: 8   # the GPUs we have
    # The small one, for tests.
    - model: tiny-llama
      name: vllm-tiny
      namespace: inference
      max_replicas: 4
      knee_concurrency: 3   # a guess
# GPU prices, from the finance sheet.
nvml: false
"""


def _changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    """(old, new) for each line that differs, the files having the same number of lines or one more."""
    old, new = before.splitlines(), after.splitlines()
    return [(a, b) for a, b in zip(old + [""] * (len(new) - len(old)), new, strict=True) if a != b]


def test_write_gives_the_knee_to_the_workload_of_the_target_model_and_touches_nothing_else(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(FLEET)
    update = write_thresholds(path, None, ReplicaKnee(16, ("tiny-llama",)))
    assert update.knee_workload == "autoscaling.workloads[1] (vllm-tiny)"
    assert _changed_lines(FLEET, path.read_text()) == [
        ("      knee_concurrency: 3   # a guess", "      knee_concurrency: 16  # a guess")
    ]
    (llama, tiny) = load_config(path).autoscaling.workloads
    assert (tiny.knee_concurrency, llama.knee_concurrency, llama.max_replicas) == (16, None, 8)


def test_a_knee_new_to_a_workload_goes_last_in_it_above_the_comment_that_introduces_the_next(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(FLEET)
    write_thresholds(path, {"saturation": {"queue": 1}}, ReplicaKnee(24, ("meta-llama/Llama-3.1-8B-Instruct",)))
    lines = path.read_text().splitlines()
    cap = lines.index("      max_replicas: 8   # the GPUs we have")
    assert lines[cap + 1 : cap + 3] == ["      knee_concurrency: 24", "    # The small one, for tests."]
    assert lines[lines.index("  kv_usage: 0.9") + 1] == "  queue: 1"
    assert [line for line in lines if line.startswith("#")] == [
        "# Two models, scaled by hand until loadtest measures them.",
        "# GPU prices, from the finance sheet.",
    ]
    assert load_config(path).autoscaling.workloads[0].knee_concurrency == 24


def test_the_target_model_is_tried_before_the_served_model_name(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(FLEET)
    # A preset name no workload has, then the name the engine serves (and labels its series with).
    update = write_thresholds(path, None, ReplicaKnee(7, ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct")))
    assert update.knee_workload == "autoscaling.workloads[0] (vllm-llama-8b)"
    update = write_thresholds(path, None, ReplicaKnee(5, ("tiny-llama", "meta-llama/Llama-3.1-8B-Instruct")))
    assert update.knee_workload == "autoscaling.workloads[1] (vllm-tiny)"
    assert [w.knee_concurrency for w in load_config(path).autoscaling.workloads] == [7, 5]


def test_without_a_workload_of_the_model_only_saturation_is_written(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(FLEET)
    update = write_thresholds(path, {"saturation": {"kv_usage": 0.817}}, ReplicaKnee(16, ("Qwen/Qwen2.5-7B",)))
    assert update.knee_workload is None
    assert _changed_lines(FLEET, path.read_text()) == [("  kv_usage: 0.9", "  kv_usage: 0.817")]


def test_a_config_without_autoscaling_gets_none_and_is_left_alone_when_only_the_knee_was_measured(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)
    update = write_thresholds(path, {"saturation": {"queue": 2}}, ReplicaKnee(16, ("tiny-llama",)))
    assert update.knee_workload is None
    assert "autoscaling" not in path.read_text()
    assert load_config(path).autoscaling is None
    (tmp_path / "plimsoll.yaml.bak").unlink()
    untouched = write_thresholds(path, None, ReplicaKnee(16, ("tiny-llama",)))
    assert untouched.backup is None
    assert not (tmp_path / "plimsoll.yaml.bak").exists()


def test_write_into_the_example_config_changes_only_the_lines_it_sets(tmp_path):
    # Its sequences are indented under their key and some lines are over 80 columns: neither may be rewritten.
    path = tmp_path / "plimsoll.yaml"
    original = EXAMPLE.read_text()
    path.write_text(original)
    write_thresholds(path, None, ReplicaKnee(30, ("meta-llama/Llama-3.1-8B-Instruct",)))
    ((old, new),) = _changed_lines(original, path.read_text())
    assert old.replace("knee_concurrency: 24", "knee_concurrency: 30") == new


@pytest.mark.parametrize(
    "head",
    [
        "# our settings, none set yet\n",
        "# our settings\n---\n",
        "# our settings\n---\n# after the marker\nnvml: false\n",
    ],
)
def test_write_keeps_a_document_marker_and_the_comments_of_a_file_with_no_settings_yet(tmp_path, head):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(head)
    write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert path.read_text().startswith(head)
    assert load_config(path).saturation_kv_usage == 0.8


# What an engine under an attacker's control may give as its served model id (GET /v1/models): a line break and
# a setting, then a "#" to turn the rest of the header line into a comment.
INJECTING_MODEL = "tiny-llama\ntargets: [{url: http://attacker.example/metrics}]\n#"


def test_a_served_model_id_with_line_breaks_stays_inside_the_comments_of_thresholds_yaml(tmp_path):
    run = built_steps.several_steps()
    run = replace(run, settings=replace(run.settings, model=INJECTING_MODEL))
    written = write_outputs(tmp_path, run)
    assert written.thresholds is not None
    text = written.thresholds.read_text()
    assert all(line.startswith("#") for line in text.splitlines()[: text.splitlines().index("saturation:")])
    assert load_yaml(text, "thresholds.yaml") == {"saturation": {"kv_usage": 0.817, "queue": 2, "lead_time": "15m"}}
    assert load_config(written.thresholds).targets == ()


def test_write_refuses_a_model_that_is_not_a_label_value_and_leaves_the_config_alone(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(FLEET)
    with pytest.raises(ThresholdsError) as raised:
        write_thresholds(path, {"saturation": {"queue": 1}}, ReplicaKnee(16, ("tiny-llama", INJECTING_MODEL)))
    message = str(raised.value)
    assert message.startswith(f"{path}: not written: model 'tiny-llama\\ntargets: ")
    assert "a label value is printable text" in message and "\n" not in message
    assert path.read_text() == FLEET
    assert not (tmp_path / "plimsoll.yaml.bak").exists()


def test_an_anchored_mapping_keeps_the_file_s_indentation(tmp_path):
    # An anchor puts the mapping's own position after `&base` on the key's line: read from it, the file would be
    # rewritten at an 8-space indent.
    path = tmp_path / "plimsoll.yaml"
    original = "x-defaults: &base\n  lead_time: 20m\nsaturation:\n  <<: *base\n  queue: 4\nnvml: false\n"
    path.write_text(original)
    write_thresholds(path, {"saturation": {"queue": 2}})
    assert _changed_lines(original, path.read_text()) == [("  queue: 4", "  queue: 2")]


def test_a_config_with_windows_line_ends_keeps_them(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    original = CONFIG.replace("\n", "\r\n")
    path.write_bytes(original.encode())
    write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    updated = path.read_bytes().decode()
    assert updated == original.replace("kv_usage: 0.90      #", "kv_usage: 0.8       #")
