"""`plimsoll loadtest` against a hostile server and hostile input: what the server sends is shown, never
obeyed; every read is bounded and every count range-checked; credentials reach no output; a run stopped by SIGTERM
keeps what it measured; an overloaded server is waited for as it asks; a redirect elsewhere is refused; a server
that takes requests and never answers them ends the run, writing nothing.

The server is the fake OpenAI server (fake_openai.py) on loopback, told to misbehave.
"""

import asyncio
import gc
import itertools
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from exporter.cli import main
from exporter.loadtest.client import MAX_RETRY_AFTER_SECONDS, Endpoint, Limits, retry_after_seconds, send
from exporter.loadtest.judge import StepSummary
from exporter.loadtest.measure import SloSpec
from exporter.loadtest.runner import LoadtestError, RunSettings, open_run, run_step, served_models
from exporter.loadtest.sketch import DurationSummary
from exporter.loadtest.steps import Outcome, SearchSettings, run_steps
from exporter.loadtest.workload import WorkloadError, load_trace
from tests.loadtest.fake_openai import Behaviour, FakeOpenAI, Observed, serving
from tests.loadtest.test_cli import VLLM_PAGE, fake_server, loadtest_args
from tests.loadtest.test_runner import WORKLOAD

ONE_STEP = ("--concurrency", "1", "--warmup", "0s", "--step-duration", "500ms")


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PLIMSOLL_LOADTEST_SLO", "PLIMSOLL_LOADTEST_URL", "PLIMSOLL_API_KEY", "PLIMSOLL_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("model", ["[/]evil", "[bold red]evil", "\x1b]0;pwned\x07\x1b[2Jevil"])
def test_a_model_id_with_markup_or_terminal_escapes_is_shown_as_text_and_the_run_goes_on(
    model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server(Behaviour(models=(model,))) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *ONE_STEP, "--out", str(tmp_path)))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "\x1b" not in captured.err + captured.out
    assert "evil" in captured.err
    assert json.loads((tmp_path / "result.json").read_text())["model"] == model


def test_a_model_id_cannot_write_settings_into_thresholds_yaml(tmp_path: Path) -> None:
    model = "evil\nsaturation: {kv_usage: 0.01, queue: 999}\n#"
    with fake_server(Behaviour(models=(model,), metrics_page=VLLM_PAGE)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *ONE_STEP, "--out", str(tmp_path)))
    assert status == 0
    written = yaml.safe_load((tmp_path / "thresholds.yaml").read_text())
    assert written["saturation"]["kv_usage"] != 0.01
    assert written["saturation"]["queue"] != 999


def test_a_metrics_content_type_with_markup_is_a_note_and_the_knee_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behaviour = Behaviour(metrics_page=VLLM_PAGE, metrics_content_type="text/html[/]")
    with fake_server(behaviour) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *ONE_STEP, "--out", str(tmp_path)))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "answered text/html[/], not a metrics page" in captured.out
    assert "\x1b" not in captured.out + captured.err


@pytest.mark.parametrize("flag", ["--url", "--metrics-url"])
def test_credentials_in_a_url_are_refused_before_anything_is_sent_or_written(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with fake_server(Behaviour(metrics_page=VLLM_PAGE)) as fake:
        with_secret = fake.url.replace("http://", "http://user:s3cret@")
        url, metrics = (with_secret, None) if flag == "--url" else (fake.url, with_secret + "/metrics")
        flags = ("--metrics-url", metrics) if metrics else ()
        status = main(loadtest_args(url, "ttft=500ms", *ONE_STEP, *flags, "--out", str(out)))
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"plimsoll loadtest: {flag}: ")
    assert "--api-key-file" in err and "PLIMSOLL_API_KEY" in err
    assert "s3cret" not in err
    assert fake.observed.requests == 0 and fake.observed.metrics_reads == 0 and not fake.observed.authorization
    assert not out.exists()


@pytest.mark.parametrize("suffix", ["/?api_key=s3cret", "/v1#s3cret", "?"])
def test_a_query_string_or_fragment_in_url_is_refused_before_anything_is_sent_or_written(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with fake_server(Behaviour(metrics_page=VLLM_PAGE)) as fake:
        status = main(loadtest_args(fake.url + suffix, "ttft=500ms", *ONE_STEP, "--out", str(out)))
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("plimsoll loadtest: --url: ")
    assert "--api-key-file" in err and "PLIMSOLL_API_KEY" in err
    assert "s3cret" not in err and fake.url not in err
    assert fake.observed.requests == 0 and fake.observed.metrics_reads == 0
    assert not out.exists()


def test_a_server_that_echoes_the_api_key_does_not_get_it_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLIMSOLL_API_KEY", "sk-s3cret")
    with fake_server(Behaviour(api_key="sk-s3cret", error_status=400, echo_authorization=True)) as fake:
        status = main(loadtest_args(fake.url, "ttft=500ms", *ONE_STEP, "--out", str(tmp_path)))
    err = capsys.readouterr().err
    assert status == 1
    assert "the server says: Bearer <API key>" in err
    assert "sk-s3cret" not in err


def test_a_model_list_too_large_to_be_one_is_refused_without_reading_it_whole() -> None:
    async def go() -> str:
        async with serving(Behaviour(models_padding_bytes=64 << 20)) as fake, aiohttp.ClientSession() as session:
            with pytest.raises(LoadtestError) as refused:
                await served_models(session, fake.url)
            return str(refused.value)

    assert "/v1/models answered more than 8 MiB" in asyncio.run(go())


def _send_max_tokens_5(behaviour: Behaviour) -> tuple[str | None, int | None]:
    async def go() -> tuple[str | None, int | None]:
        async with serving(behaviour) as fake, aiohttp.ClientSession() as session:
            record, _ = await send(session, Endpoint.at(fake.url, "completions"), "fake-model", "hi", 5, Limits(10, 2))
            return record.error, record.output_tokens

    return asyncio.run(go())


@pytest.mark.parametrize("tokens", [10**400, 10**18, 11])
def test_a_token_count_far_beyond_max_tokens_is_a_bad_response_not_a_number(tokens: int) -> None:
    assert _send_max_tokens_5(Behaviour(completion_tokens=tokens)) == ("bad response: implausible usage", None)


def test_a_token_count_near_max_tokens_is_taken() -> None:
    assert _send_max_tokens_5(Behaviour(completion_tokens=6)) == (None, 6)


@pytest.mark.parametrize("line_end", [b"", b"\r"], ids=["never ended", "ended by a CR"])
def test_an_event_line_over_1_mib_is_a_bad_response_whether_or_not_it_ends(line_end: bytes) -> None:
    raw = b"data: " + b"x" * (1 << 20) + line_end
    behaviour = Behaviour(raw_stream=raw, raw_stream_held_open=True)
    assert _send_max_tokens_5(behaviour) == ("bad response: a line over 1 MiB", None)


def test_an_event_whose_data_lines_together_pass_1_mib_is_a_bad_response() -> None:
    # Each line is short; the event they make, never ended by a blank line, is not.
    raw = (b"data: " + b"x" * 1000 + b"\n") * 1100
    behaviour = Behaviour(raw_stream=raw, raw_stream_held_open=True)
    assert _send_max_tokens_5(behaviour) == ("bad response: an event over 1 MiB", None)


@pytest.mark.parametrize("line", [b"data:\n", b"data\n"], ids=["data:", "data"])
def test_an_event_of_empty_data_lines_is_bounded_by_the_line_feeds_that_join_them(line: bytes) -> None:
    # Each line adds no data but an LF to the event, and one more entry for the reader to hold.
    raw = line * ((1 << 20) + 2)
    behaviour = Behaviour(raw_stream=raw, raw_stream_held_open=True)
    assert _send_max_tokens_5(behaviour) == ("bad response: an event over 1 MiB", None)


def test_an_overloaded_answer_is_a_miss_and_its_retry_after_is_waited_before_the_next_request() -> None:
    async def go() -> tuple[list[str | None], list[float], float]:
        async with serving(Behaviour(error_every=2, retry_after="1")) as fake:
            settings = RunSettings(url=fake.url, workload=WORKLOAD, step_seconds=1.5, warmup_seconds=0.0)
            async with open_run(settings) as run:
                started = time.monotonic()
                step = await run_step(settings, 1, run)
                return [r.error for r in step.requests], fake.observed.arrivals, time.monotonic() - started

    errors, arrivals, took = asyncio.run(go())
    assert "http 503" in errors
    # The preflight's request, then: ok, 503, (a second's pause), ok, 503, (pause).
    assert len(arrivals) <= 5
    assert max(later - earlier for earlier, later in itertools.pairwise(arrivals)) >= 0.9
    # A pause the server asked for ends with the step: it never holds the step open.
    assert took < 1.5 + 0.5


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("86400", MAX_RETRY_AFTER_SECONDS),
        ("-3", None),
        ("soon", None),
        ("1e999", None),
        ("nan", None),
        ("Thu, 26 Nov 2026 13:00:00 GMT", None),  # an HTTP date is not waited for
    ],
)
def test_retry_after_is_read_in_seconds_and_cut_to_its_bound(header: str, seconds: float | None) -> None:
    assert retry_after_seconds(header) == seconds


def test_each_steps_errors_keep_their_reasons_in_result_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server(Behaviour(itl_seconds=0.001, error_every=2)) as fake:
        main(loadtest_args(fake.url, "ttft=500ms", *ONE_STEP, "--out", str(tmp_path), "--format", "json"))
    step = json.loads(capsys.readouterr().out)["steps"][0]
    assert step["errors"] > 0
    assert step["error_reasons"] == {"http 503": step["errors"]}


def _refused_run(redirecting: Callable[[str], Behaviour]) -> tuple[str, Observed]:
    """The refusal of a run against a server that redirects to another (whose base URL `redirecting` is given),
    and what that other server saw."""

    async def go() -> tuple[str, Observed]:
        async with serving(Behaviour()) as elsewhere:
            async with serving(redirecting(elsewhere.url)) as fake:
                settings = RunSettings(url=fake.url, workload=WORKLOAD, api_key="sk-s3cret")
                with pytest.raises(LoadtestError) as refused:
                    async with open_run(settings):
                        pass
            return str(refused.value), elsewhere.observed

    return asyncio.run(go())


def test_a_redirect_to_another_origin_is_refused_naming_where_it_pointed() -> None:
    message, elsewhere = _refused_run(lambda url: Behaviour(redirect_to=url + "/v1/completions"))
    assert "redirected to http://127.0.0.1:" in message and "/v1/completions" in message
    assert elsewhere.requests == 0


def test_a_model_list_or_health_check_redirected_elsewhere_is_refused_and_the_key_never_sent_there() -> None:
    message, elsewhere = _refused_run(lambda url: Behaviour(redirect_gets_to=url))
    assert "/v1/models redirected to http://127.0.0.1:" in message and "does not follow redirects" in message
    assert elsewhere.authorization == []  # neither GET was followed, so the key never left for the other origin


def test_a_model_list_redirect_that_repeats_the_api_key_does_not_get_it_shown() -> None:
    message, _ = _refused_run(lambda url: Behaviour(redirect_gets_to=url, echo_authorization=True))
    assert "/v1/models?Bearer+<API key> (loadtest does not follow redirects)" in message
    assert "s3cret" not in message


def test_a_dataset_number_too_long_to_read_names_the_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt": "hi"}\n{"prompt": "hi", "max_tokens": ' + "9" * 5001 + "}\n")
    with pytest.raises(WorkloadError, match=f"^{trace}:2: "):
        load_trace(trace, 4)


def test_a_long_answer_holds_a_summary_of_its_gaps_whose_size_does_not_grow_with_its_tokens() -> None:
    tokens = 20_000

    async def go() -> tuple[int, int, DurationSummary]:
        async with serving(Behaviour()) as fake, aiohttp.ClientSession() as session:
            endpoint = Endpoint.at(fake.url, "completions")
            step_gaps = DurationSummary()
            tracemalloc.start()
            try:
                record, _ = await send(
                    session, endpoint, "fake-model", "hi", tokens, Limits(60, 10), itl_gaps=step_gaps
                )
                gc.collect()
                held, _ = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return held, record.gap_count, step_gaps

    held, gaps, step_gaps = asyncio.run(go())
    assert gaps == step_gaps.count == tokens - 1
    # An array of the gaps alone took 4 bytes a token (80 kB here); the summary is a dict entry per 2% of their
    # range, so all that is left of the answer, record and step summary together, is far less.
    assert len(step_gaps.buckets) < 1_000
    assert held < 40_000


class _Quiet:
    def message(self, text: str) -> None: ...

    def step_started(self, load: str, seconds: float) -> None: ...

    def step_finished(self, step: StepSummary) -> None: ...


def test_a_run_keeps_each_requests_mean_gap_and_each_steps_gaps_as_one_summary() -> None:
    # A run holds every step's records to the end (--save-requests, the footprint): with every gap in them, its
    # memory would grow with all the tokens of all its steps.
    async def go() -> Outcome:
        async with serving(Behaviour(itl_seconds=0.005)) as fake:
            settings = RunSettings(
                url=fake.url, workload=WORKLOAD, step_seconds=0.5, warmup_seconds=0.0, allow_short_answers=True
            )
            slos = SloSpec(ttft_seconds=None, itl_seconds=0.5, objective=0.9)
            return await run_steps(settings, SearchSettings(slos, 4, 0.1, levels=(1, 2)), _Quiet())

    outcome = asyncio.run(go())
    records = [record for run in outcome.step_runs for record in run.requests]
    means = [record.mean_itl_seconds for record in records if record.completed]
    assert means and all(mean is not None and 0.004 <= mean < 0.5 for mean in means)
    for run in outcome.step_runs:
        assert run.itl_gaps.count == sum(record.gap_count for record in run.requests if record.completed)
    assert all(step.itl_p50_seconds is not None for step in outcome.search.steps)


class _HangsAfterTheFirstStep(_Quiet):
    """A progress display that makes the fake server hang once the first step is done: its engine stuck mid-run."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake

    def step_finished(self, step: StepSummary) -> None:
        self.fake.behaviour.hang_after_requests = self.fake.observed.requests


def test_a_server_that_hangs_mid_run_ends_it_instead_of_answering_with_the_last_passing_level() -> None:
    # Before, every request of the second step timed out, the step failed, and concurrency 1 was the answer.
    async def go() -> tuple[str, int]:
        async with serving(Behaviour()) as fake:
            settings = RunSettings(
                url=fake.url, workload=WORKLOAD, step_seconds=0.5, warmup_seconds=0.0, request_timeout_seconds=0.3
            )
            slos = SloSpec(ttft_seconds=0.25, itl_seconds=None, objective=0.9)
            with pytest.raises(LoadtestError) as gone:
                await run_steps(settings, SearchSettings(slos, 2, 0.1, levels=(1, 2)), _HangsAfterTheFirstStep(fake))
            return str(gone.value), fake.observed.hung

    message, hung = asyncio.run(go())
    assert message.startswith("the server stopped answering at concurrency 2: the last 2 requests")
    assert "(timeout)" in message
    assert 2 <= hung <= 2 * 2  # a timeout per slot, and at most one request more each


def test_a_server_that_takes_requests_and_never_answers_exits_1_writing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = tmp_path / "plimsoll.yaml", tmp_path / "out"
    original = "saturation:\n  kv_usage: 0.8\n"
    config.write_text(original)
    flags = ("--request-timeout", "300ms", "--config", str(config), "--write", "--out", str(out))
    # Its first request (the check at the start) is answered; then the engine is stuck.
    with fake_server(Behaviour(hang_after_requests=1, metrics_page=VLLM_PAGE)) as fake:
        status = main(loadtest_args(fake.url, "ttft=250ms", "--concurrency", "1,2", "--step-duration", "30s", *flags))
    err = capsys.readouterr().err
    assert status == 1
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "plimsoll loadtest: the server stopped answering at concurrency 1: the last request found nothing "
            "listening or got no token in time (timeout); nothing was written"
        )
    )
    assert config.read_text() == original and not (tmp_path / "plimsoll.yaml.bak").exists()
    assert not out.exists()
    assert fake.observed.hung <= 2


def test_a_model_id_too_long_to_be_one_is_refused_without_repeating_it() -> None:
    async def go() -> str:
        async with serving(Behaviour(models=("m" * 5000,))) as fake, aiohttp.ClientSession() as session:
            with pytest.raises(LoadtestError) as refused:
                await served_models(session, fake.url)
            return str(refused.value)

    message = asyncio.run(go())
    assert "lists a model id of 5000 characters" in message
    assert len(message) < 300
