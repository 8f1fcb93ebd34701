"""A target's credential files, read at every poll by the poll loop: a file replaced by a FIFO, a device or a
huge file is the target's failure, named, and never a read that stalls the loop or fills its memory."""

import os
import threading
from pathlib import Path

from exporter.config import BasicAuth, Target
from exporter.sources.http import MAX_SECRET_BYTES, CredentialsError, credential_headers

READ_DEADLINE_SECONDS = 10.0


def _failure(target: Target, unblock: Path | None = None) -> str:
    """The CredentialsError's words; fails (and unblocks the reader) if the read does not end in time."""
    outcome: list[BaseException | dict[str, str]] = []

    def read() -> None:
        try:
            outcome.append(credential_headers(target))
        except Exception as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(READ_DEADLINE_SECONDS)
    if reader.is_alive() and unblock is not None:
        os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))  # a writer that closes: the blocked open returns
    assert not reader.is_alive() and outcome, f"reading the secret did not end within {READ_DEADLINE_SECONDS}s"
    (error,) = outcome
    assert isinstance(error, CredentialsError), error
    return str(error)


def test_a_password_file_replaced_by_a_fifo_is_refused_without_waiting(tmp_path: Path):
    fifo = tmp_path / "password"
    os.mkfifo(fifo)
    target = Target("t", "http://127.0.0.1:1/metrics", basic_auth=BasicAuth("ops", str(fifo)))
    assert _failure(target, unblock=fifo) == f"basic_auth.password_file {fifo}: cannot read it (not a regular file)"


def test_a_token_file_past_the_cap_is_refused_unread(tmp_path: Path):
    token = tmp_path / "token"
    with token.open("wb") as handle:
        handle.truncate(MAX_SECRET_BYTES + 1)  # sparse: no disk used
    failure = _failure(Target("t", "http://127.0.0.1:1/metrics", bearer_token_file=str(token)))
    assert failure.startswith(f"bearer_token_file {token}: over 64 KiB")


def test_a_secret_that_is_not_text_is_named_never_shown(tmp_path: Path):
    token = tmp_path / "token"
    token.write_bytes(b"s3cret\xff\n")
    failure = _failure(Target("t", "http://127.0.0.1:1/metrics", bearer_token_file=str(token)))
    assert failure == f"bearer_token_file {token}: not UTF-8 text" and "s3cret" not in failure


def test_an_empty_token_file_is_the_targets_failure_not_an_empty_bearer(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("  \n\t\n")
    failure = _failure(Target("t", "http://127.0.0.1:1/metrics", bearer_token_file=str(token)))
    assert failure == f"bearer_token_file {token}: empty (no token to send)"


def test_an_empty_password_file_is_the_targets_failure_not_an_empty_password(tmp_path: Path):
    password = tmp_path / "password"
    for content in ("", " \n"):
        password.write_text(content)
        failure = _failure(Target("t", "http://127.0.0.1:1/metrics", basic_auth=BasicAuth("ops", str(password))))
        assert failure == f"basic_auth.password_file {password}: empty (no password to send)"


def test_a_secret_holding_a_line_break_or_control_character_within_is_refused_never_sent(tmp_path: Path):
    # A line break would end the Authorization header and start another; the one a file ends with is no part of it.
    secret = tmp_path / "secret"
    for content in ("s3cret\nsecond line\n", "s3\x07cret", "s3cret\r\n\x00", "s3\tcret\n"):
        secret.write_text(content)
        token = Target("t", "http://127.0.0.1:1/metrics", bearer_token_file=str(secret))
        password = Target("t", "http://127.0.0.1:1/metrics", basic_auth=BasicAuth("ops", str(secret)))
        for target, field in ((token, "bearer_token_file"), (password, "basic_auth.password_file")):
            failure = _failure(target)
            assert failure == (
                f"{field} {secret}: holds a line break or a control character: one line, the secret alone"
            ), content
            assert "s3" not in failure.removeprefix(f"{field} {secret}")


def test_a_secret_file_ending_with_a_line_break_sends_the_secret_alone(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    headers = credential_headers(Target("t", "http://127.0.0.1:1/metrics", bearer_token_file=str(token)))
    assert headers == {"Authorization": "Bearer s3cret"}
