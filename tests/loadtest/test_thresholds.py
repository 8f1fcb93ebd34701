"""Thresholds from the knee, thresholds.yaml, and --write into the user's config (comments kept, backup, atomic)."""

import errno
import re
from dataclasses import replace

import pytest

from exporter import files
from exporter.config import check_config, load_config
from exporter.generate.rules import artifacts
from exporter.loadtest.outputs import write_outputs
from exporter.loadtest.thresholds import ThresholdsError, derive_thresholds, write_thresholds
from tests.loadtest import built_steps

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


def test_kv_threshold_is_the_knee_usage_less_the_margin_clamped_to_half_and_0_99():
    knee = built_steps.step(12, passed=True, kv=0.86, waiting=1.3)
    assert derive_thresholds(knee, 0.05).kv_usage == 0.817
    assert derive_thresholds(replace(knee, kv_cache_usage_ratio=0.2), 0.05).kv_usage == 0.5
    assert derive_thresholds(replace(knee, kv_cache_usage_ratio=1.0), 0.0).kv_usage == 0.99


def test_queue_threshold_is_the_mean_waiting_at_the_knee_rounded_up():
    knee = built_steps.step(12, passed=True, kv=0.86, waiting=1.3)
    assert derive_thresholds(knee).queue == 2
    assert derive_thresholds(replace(knee, requests_waiting=0.0)).queue == 0
    assert derive_thresholds(replace(knee, requests_waiting=None)).queue is None


def test_no_knee_or_no_engine_readings_give_nothing_to_write():
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
    backup = write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert backup == tmp_path / "plimsoll.yaml.bak"
    assert backup.read_text() == CONFIG


def test_write_adds_a_saturation_block_where_the_config_has_none(tmp_path):
    path = tmp_path / "plimsoll.yaml"
    path.write_text("# minimal\nnvml: false\n")
    write_thresholds(path, {"saturation": {"kv_usage": 0.8, "queue": 0}})
    assert load_config(path).saturation_queue == 0
    assert path.read_text().startswith("# minimal\n")


def test_a_write_that_fails_leaves_the_config_whole_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "plimsoll.yaml"
    path.write_text(CONFIG)

    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(
        ThresholdsError, match=re.escape("cannot write the updated config (No space left on device); it is unchanged")
    ):
        write_thresholds(path, {"saturation": {"kv_usage": 0.8}})
    assert path.read_text() == CONFIG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plimsoll.yaml", "plimsoll.yaml.bak"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "the top level is not a mapping"),
        ("saturation: 0.9\n", "saturation is not a mapping"),
        ("saturation: {kv_usage: [\n", "not YAML that can be edited in place"),
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


def test_write_through_a_symlink_updates_the_file_it_points_to(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text(CONFIG)
    link = tmp_path / "plimsoll.yaml"
    link.symlink_to(real)
    write_thresholds(link, {"saturation": {"queue": 3}})
    assert link.is_symlink()
    assert load_config(real).saturation_queue == 3
