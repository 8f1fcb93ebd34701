import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.units import counted, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 1024**3),
        ("80GB", 80 * 1000**3),
        ("81920MiB", 81920 * 1024**2),
        ("2097152", 2097152),
        ("1.5GiB", 3 * 1024**3 // 2),
        (" 4 gib ", 4 * 1024**3),
        ("80Gi", 80 * 1024**3),
        ("80G", 80 * 1000**3),
        ("80000M", 80 * 1000**3),
        ("80Mi", 80 * 1024**2),
        ("2Ti", 2 * 1024**4),
        ("512k", 512_000),
    ],
)
def test_sizes_in_the_usual_and_the_kubernetes_spellings(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "80 parsecs", "-1GiB", "1e999GiB", "nan"])
def test_bad_sizes_say_what_is_expected(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("text", ["1e308GiB", "1e300TiB", "1.7e308Ki"])
def test_a_size_whose_bytes_overflow_is_refused_as_too_large_not_a_traceback(text):
    with pytest.raises(ValueError, match="too large"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500ms", 0.5), ("5s", 5.0), ("15m", 900.0), ("1h30m", 5400.0), ("1d", 86400.0), (" 2s ", 2.0)],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5 minutes", "m5", "1h 30m", "-5s"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("value", "message"), [("30", "30 has no unit: write 30s"), (5, "5 has no unit: write 5s")])
def test_a_duration_without_a_unit_is_refused_with_the_fix(value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        parse_duration(value)


@pytest.mark.parametrize("value", [10**3999, "9" * 4000, 9e300], ids=["int", "text", "float"])
def test_a_long_number_without_a_unit_is_quoted_once_and_cut_short(value):
    with pytest.raises(ValueError, match="has no unit") as error:
        parse_duration(value)
    assert len(str(error.value)) < 200


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_duration_that_is_not_finite_is_refused_not_given_a_unit(value):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(value)


def test_a_duration_too_long_for_a_float_is_refused_not_returned_as_infinity():
    with pytest.raises(ValueError, match="too long a duration"):
        parse_duration("9" * 400 + "s")


def test_an_unknown_size_unit_is_quoted_cut_short():
    with pytest.raises(ValueError, match="unknown unit") as error:
        parse_size("5" + "x" * 100_000)
    assert len(str(error.value)) < 400


@pytest.mark.parametrize(
    ("value", "kind"), [(["5s"], "a list"), ({"s": 5}, "a map"), (True, "a boolean"), (None, "nothing")]
)
def test_a_duration_that_is_not_a_scalar_names_what_it_got(value, kind):
    with pytest.raises(ValueError, match=f"^expected a duration such as 5s, got {kind}$"):
        parse_duration(value)
    with pytest.raises(ValueError, match=f"^expected a size such as 80GiB, got {kind}$"):
        parse_size(value)


@given(st.integers(0, 2**50))
def test_plain_bytes_round_trip(n):
    assert parse_size(str(n)) == n


def test_a_count_of_one_takes_the_singular():
    said = [counted(n, "static target") for n in (0, 1, 2)]
    assert said == ["0 static targets", "1 static target", "2 static targets"]
