"""The capacity model against real vLLM startup logs (bench/data): a regression guard on its accuracy.

The thresholds are the README's reported figures with a little slack: a change that makes the model worse
against reality fails here, whatever the unit tests say.
"""

import pytest

from bench import model_accuracy


def _rows():
    import yaml

    entries = yaml.safe_load(model_accuracy.DATA.read_text())
    scores = [model_accuracy.score(e) for e in entries]
    return {label: (count, median, worst) for label, count, median, worst, _ in model_accuracy.summary(scores)}


def test_kv_block_math_reproduces_every_logged_allocation_within_half_a_percent():
    count, _, worst = _rows()["KV tokens from logged KV memory"]
    assert count >= 20
    assert worst <= 0.005


def test_end_to_end_prediction_beats_the_back_of_envelope_baseline():
    rows = _rows()
    _, model_median, model_worst = rows["KV tokens end to end (model)"]
    _, baseline_median, _ = rows["KV tokens end to end (baseline)"]
    assert model_median <= 0.02
    assert model_worst <= 0.12
    assert model_median < baseline_median / 5


def test_weights_are_within_two_percent_for_most_logs():
    count, median, _ = _rows()["weights per GPU"]
    assert count >= 25
    assert median <= 0.01


def test_leave_one_source_out_figures_are_reproduced():
    import yaml

    entries = yaml.safe_load(model_accuracy.DATA.read_text())
    scored = model_accuracy.leave_one_source_out(entries)
    ((_, count, median, worst, _),) = model_accuracy.out_of_sample_summary(scored)
    assert count == 28
    # README: 4.6% median, 25.7% worst; the out-of-sample figure must not drift up unnoticed.
    assert median <= 0.05
    assert worst <= 0.27


def test_fit_on_all_logs_reproduces_the_shipped_constants():
    import yaml

    from exporter.capacity import assumptions as A

    fitted, _ = model_accuracy.fit_all(yaml.safe_load(model_accuracy.DATA.read_text()))
    assert fitted.non_torch_single_gpu_bytes == pytest.approx(A.NON_TORCH_BYTES_SINGLE_GPU, rel=0.02)
    assert fitted.non_torch_multi_gpu_bytes == pytest.approx(A.NON_TORCH_BYTES_MULTI_GPU, rel=0.02)
    assert fitted.cuda_graph_bytes == pytest.approx(A.CUDA_GRAPH_BYTES, rel=0.02)
    assert dict(fitted.activation_scale_by_version)[(0, 19)] == pytest.approx(1.0, abs=0.01)


def test_family_table_names_every_family_and_what_it_refuses():
    import yaml

    entries = yaml.safe_load(model_accuracy.DATA.read_text())
    rows = {r.family: r for r in model_accuracy.family_summary(entries, model_accuracy.leave_one_source_out(entries))}
    assert tuple(rows) == model_accuracy.FAMILIES
    assert sum(r.logs for f, r in rows.items() if f != "quantized") == len(entries)
    # docs/plan.md: the vision-language logs are the ones still refused most (8 of 11)
    assert rows["VLM"].refused <= 8
    assert rows["quantized"].coverage == 1.0
