"""Writing our own files: one, or a set that must agree, whole or not at all, with any error naming the file the
user knows (never the temporary one beside it) and no temporary file left behind."""

import errno
import os
import stat
from pathlib import Path

import pytest

from exporter import files
from exporter.files import write_all_or_none, write_atomically


def _earlier_set(directory: Path) -> dict[str, str]:
    """What an earlier run left: every file of the set, each saying so."""
    contents = {name: f"earlier {name}\n" for name in ("result.json", "report.html", "thresholds.yaml")}
    for name, text in contents.items():
        (directory / name).write_text(text)
    return contents


def _contents(directory: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in directory.iterdir() if path.is_file()}


def test_a_set_is_written_and_a_path_mapped_to_none_is_removed(tmp_path: Path) -> None:
    _earlier_set(tmp_path)
    write_all_or_none(
        {tmp_path / "result.json": "{}\n", tmp_path / "report.html": "<p>\n", tmp_path / "thresholds.yaml": None}
    )
    assert _contents(tmp_path) == {"result.json": "{}\n", "report.html": "<p>\n"}  # nothing else beside them
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644  # readable by all, not mkstemp's 0600


def test_a_directory_in_the_way_of_a_later_file_leaves_the_whole_earlier_set(tmp_path: Path) -> None:
    earlier = _earlier_set(tmp_path)
    (tmp_path / "report.html").unlink()
    (tmp_path / "report.html").mkdir()
    del earlier["report.html"]
    with pytest.raises(IsADirectoryError) as raised:
        write_all_or_none(
            {tmp_path / "result.json": "{}\n", tmp_path / "report.html": "<p>\n", tmp_path / "thresholds.yaml": None}
        )
    assert raised.value.filename == str(tmp_path / "report.html")
    assert _contents(tmp_path) == earlier  # the result not replaced, the thresholds not removed, no temporary file


def test_a_directory_where_a_file_is_to_be_removed_leaves_the_whole_earlier_set(tmp_path: Path) -> None:
    earlier = _earlier_set(tmp_path)
    (tmp_path / "thresholds.yaml").unlink()
    (tmp_path / "thresholds.yaml").mkdir()
    del earlier["thresholds.yaml"]
    with pytest.raises(IsADirectoryError) as raised:
        write_all_or_none({tmp_path / "result.json": "{}\n", tmp_path / "thresholds.yaml": None})
    assert raised.value.filename == str(tmp_path / "thresholds.yaml")
    assert _contents(tmp_path) == earlier


def test_a_full_disk_while_a_later_file_is_written_leaves_the_whole_earlier_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = _earlier_set(tmp_path)
    flushed: list[int] = []
    real_fsync = os.fsync

    def fills_on_the_second(descriptor: int) -> None:
        flushed.append(descriptor)
        if len(flushed) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(descriptor)

    monkeypatch.setattr(files.os, "fsync", fills_on_the_second)
    with pytest.raises(OSError) as raised:
        write_all_or_none({tmp_path / "result.json": "{}\n", tmp_path / "report.html": "<p>\n"})
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tmp_path / "report.html"))
    assert _contents(tmp_path) == earlier


def test_a_single_file_that_cannot_be_written_is_named_not_its_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "plimsoll.yaml"
    target.write_text("earlier\n")

    def disk_full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(OSError) as raised:
        write_atomically(target, "new\n")
    assert raised.value.filename == str(target) and raised.value.filename2 is None
    assert _contents(tmp_path) == {"plimsoll.yaml": "earlier\n"}
