"""The demand CSV: both time forms, the optional queue columns, and one clear error per bad row naming the file, the
line and the column."""

import pytest

from exporter.autoscale import demand
from exporter.autoscale.demand import DemandError, DemandPoint, parse_demand

PATH = "week.csv"


def test_seconds_with_the_queue_columns_of_which_the_summed_queue_is_replayed() -> None:
    text = "time,demand,queue_max,queue_sum\n0,10,0,0\n15,12.5,3,4\n"
    assert parse_demand(text, PATH) == (DemandPoint(0.0, 10.0, 0.0), DemandPoint(15.0, 12.5, 4.0))


def test_rfc3339_times_any_column_order_and_no_queue() -> None:
    text = "\ufeffdemand,time\r\n5,2026-03-01T12:00:00Z\r\n\r\n6,2026-03-01T14:00:15+02:00\r\n"
    points = parse_demand(text, PATH)
    assert [point.time - points[0].time for point in points] == [0.0, 15.0]
    assert points[0].time == 1772366400.0
    assert (points[1].demand, points[1].queue_sum) == (6.0, None)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", f"{PATH}: empty; the first line names the columns"),
        ("time,demand,load\n", f"{PATH}:1: column 'load' is not one of time, demand, queue_max, queue_sum"),
        ("time,demand,demand\n", f"{PATH}:1: column 'demand' appears twice"),
        ("time,queue_max\n", f"{PATH}:1: no 'demand' column"),
        ("time,demand\n0,1\n15,many\n", f"{PATH}:3: demand: 'many' is not a number"),
        ("time,demand\n0,1\n15,-2\n", f"{PATH}:3: demand: '-2' is not a number from 0 to 1e+12"),
        ("time,demand\n0,1\n15,nan\n", f"{PATH}:3: demand: 'nan' is not a number from 0 to 1e+12"),
        # Finite, but a demand times seconds past what a float holds: result.json would say Infinity.
        ("time,demand\n0,1e308\n15,1\n", f"{PATH}:2: demand: '1e308' is not a number from 0 to 1e+12"),
        ("time,demand,queue_sum\n0,1,1e13\n", f"{PATH}:2: queue_sum: '1e13' is not a number from 0 to 1e+12"),
        # Where adding a sync's 15 s no longer changes a float, stepping through the trace would never end.
        ("time,demand\n1e300,1\n", f"{PATH}:2: time: '1e300' is not a number from 0 to 2.53402e+11"),
        # Two rows a year apart are two rows, but two million syncs to step through.
        ("time,demand\n0,1\n31536000,1\n", f"{PATH}: spans 365.0 days, over the 105 days a replay steps through"),
        # Past the csv module's field limit: its own error, never a traceback.
        ("time,demand\n0," + "1" * 200_000 + "\n", f"{PATH}:2: not a CSV row of numbers (field larger than"),
        ("time,demand,queue_max\n0,1,2\n15,1,\n", f"{PATH}:3: queue_max: '' is not a number"),
        ("time,demand\n0,1\n15,1,7\n", f"{PATH}:3: 3 fields where the header names 2"),
        ("time,demand\nnoon,1\n", f"{PATH}:2: time: 'noon' is neither seconds nor an RFC 3339 timestamp"),
        ("time,demand\n2026-03-01T12:00:00,1\n", f"{PATH}:2: time: '2026-03-01T12:00:00' has no UTC offset"),
        ("time,demand\n0,1\n2026-03-01T12:00:00Z,1\n", f"{PATH}:3: time: seconds and RFC 3339 timestamps mixed"),
        ("time,demand\n0,1\n15,1\n15,2\n", f"{PATH}:4: time: not after the row before"),
        ("time,demand\n0,1\n", f"{PATH}: 1 row(s) of samples; a replay needs at least two"),
    ],
)
def test_each_bad_input_is_one_error_naming_file_line_and_column(text: str, error: str) -> None:
    with pytest.raises(DemandError) as raised:
        parse_demand(text, PATH)
    assert str(raised.value).startswith(error)


def test_bare_carriage_returns_end_lines() -> None:
    text = "time,demand\r0,5\r15,6\r"
    assert parse_demand(text, PATH) == (DemandPoint(0.0, 5.0), DemandPoint(15.0, 6.0))
    with pytest.raises(DemandError, match=rf"^{PATH}:3: demand: 'x' is not a number"):
        parse_demand("time,demand\r0,5\r15,x\r", PATH)


def test_a_quoted_field_spanning_lines_is_reported_at_its_own_line() -> None:
    with pytest.raises(DemandError, match=rf"^{PATH}:4: demand: 'x\\ny' is not a number"):
        parse_demand('time,demand\n0,1\n15,"x\ny"\n', PATH)


def test_a_long_cell_is_cut_in_the_message() -> None:
    with pytest.raises(DemandError) as raised:
        parse_demand("time,demand\n0," + "9x" * 500 + "\n", PATH)
    assert len(str(raised.value)) < 120


def test_rows_and_size_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demand, "MAX_DEMAND_ROWS", 3)
    parse_demand("time,demand\n0,1\n1,1\n2,1\n", PATH)
    with pytest.raises(DemandError, match=rf"^{PATH}:5: over 3 rows"):
        parse_demand("time,demand\n0,1\n1,1\n2,1\n3,1\n", PATH)
    monkeypatch.setattr(demand, "MAX_DEMAND_BYTES", 20)
    with pytest.raises(DemandError, match=rf"^{PATH}: over 0 MiB"):
        parse_demand("time,demand\n0,1\n1,1\n2,1\n", PATH)
