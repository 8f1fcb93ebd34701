"""Files from outside and our own: reading one without hanging on a FIFO or reading a device without end, and
writing one, or a set that must agree, so that no reader ever sees it half-written, even across a crash or a full
disk."""

import errno
import os
import ssl
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path


class NotARegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory: reading it could wait or run forever."""


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the file at `path` (one more than `limit` tells the caller it is over).

    Opened without blocking, since opening a FIFO that has no writer waits for one, and checked on the open
    descriptor, so nothing can be put in its place between the check and the read. Raises OSError, and
    NotARegularFile for anything but a regular file."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
        return handle.read(limit + 1)


def read_capped(path: str, limit: int, name: str, too_large: str) -> bytes:
    """The bytes of the file that `name` (a flag or a field) gives as `path`: a ValueError naming both where it
    cannot be read, or where it holds more than `limit` bytes (`too_large` says what that means or what to do)."""
    try:
        data = read_regular_file(path, limit)
    except OSError as error:
        raise ValueError(f"{name} {path}: cannot read it ({error.strerror})") from None
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
        raise ValueError(f"{name} {path}: over {size}; {too_large}")
    return data


def read_secret(path: str, limit: int, name: str) -> str:
    """The password or token in the file that `name` (a flag or a field) gives as `path`, surrounding whitespace
    stripped (an editor ends the file with a line break): a ValueError naming both, never the secret, where
    read_capped refuses it, or where it is not UTF-8 or holds a line break or control character within, which
    would end or corrupt the Authorization header it is sent in. Empty is the caller's to refuse."""
    try:
        secret = read_capped(path, limit, name, "not a password or a token").decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{name} {path}: not UTF-8 text") from None
    if not secret.isprintable():
        raise ValueError(f"{name} {path}: holds a line break or a control character: one line, the secret alone")
    return secret


# A CA bundle: the system's whole bundle is a few hundred kilobytes.
MAX_CA_BYTES = 4 << 20


def ca_context(path: str, name: str) -> ssl.SSLContext:
    """A TLS context trusting the CA bundle that `name` (a flag) gives as `path`, read here, bounded, rather than by
    OpenSSL, which would wait forever on a FIFO with no writer: a ValueError naming both where read_capped refuses
    it or where it holds no PEM certificate."""
    data = read_capped(path, MAX_CA_BYTES, name, "not a CA bundle")
    no_certificate = ValueError(f"{name} {path}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    # A bundle's comments may name an issuer in UTF-8; the certificates themselves are ASCII.
    text = data.decode("ascii", errors="ignore")
    if not text.strip():  # empty cadata reads as none given: the system's CAs, not the file's
        raise no_certificate
    try:
        return ssl.create_default_context(cadata=text)
    except ssl.SSLError:
        raise no_certificate from None


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to a temporary file beside `path`, flush it to disk, then rename it over `path`.

    The rename is atomic within one file system, so `path` holds either its old content or all of the new;
    fsync before it keeps a power loss from leaving an empty file under the new name.
    """
    write_all_or_none({path: text}, mode)


def write_all_or_none(files: Mapping[Path, str | None], mode: int = 0o644) -> None:
    """Write a set of files that must agree (a result and the report drawn from it), each path's text, and remove
    each path mapped to None (an earlier run's file would read as part of this set).

    Every text is written to a temporary file beside its path, its missing folders made, and flushed to disk before
    any path changes, so a full disk or a refused permission leaves the whole earlier set; only then are the paths
    removed and the temporary files renamed over theirs. On any failure the temporary files are removed, then the
    folders made that are still empty (a run that failed writes nothing back), and the OSError names the path it
    was for, never a temporary file's name.
    """
    temporaries: dict[Path, str] = {}
    made: list[Path] = []
    try:
        for path, text in files.items():
            if text is not None:
                made += _made_folders(path.parent)  # an OSError names the folder it could not make
            with _naming(path):
                _refuse_a_directory(path)
                if text is not None:
                    temporaries[path] = _flushed_beside(path, text, mode)
        for path, text in files.items():
            if text is None:
                with _naming(path):
                    path.unlink(missing_ok=True)
        for path, temporary in list(temporaries.items()):
            with _naming(path):
                os.replace(temporary, path)
            del temporaries[path]
    except BaseException:
        for temporary in temporaries.values():
            Path(temporary).unlink(missing_ok=True)
        for folder in reversed(made):  # innermost first
            with suppress(OSError):  # not empty: another writer put something in it since
                folder.rmdir()
        raise


def _made_folders(folder: Path) -> list[Path]:
    """Makes `folder` and each missing folder above it, outermost first, and returns those this call made: one
    that another writer makes meanwhile is theirs, never removed."""
    made = []
    for each in reversed([folder, *folder.parents]):
        if each.is_dir():
            continue
        try:
            each.mkdir()
        except FileExistsError:  # made meanwhile, or a file in the way (the write beside it says so)
            continue
        made.append(each)
    return made


def _refuse_a_directory(path: Path) -> None:
    # A file cannot be renamed over a directory: found before any path changes, not half-way through the set. A
    # symlink to one is replaced itself, so it is no obstacle.
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(errno.EISDIR, "a folder is in the way of the file", str(path))


def _flushed_beside(path: Path, text: str, mode: int) -> str:
    """The name of a new temporary file beside `path` holding `text`, on disk (fsync: a power loss after the
    rename must not leave an empty file under the new name)."""
    # The name kept in the prefix is cut short: mkstemp adds a dot and eight characters to it, and a file name near
    # the 255-byte limit would otherwise have no temporary to be written through.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)  # mkstemp makes 0600
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return temporary


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An OSError raised within names `path`: the one a failed write or rename raises names the temporary file,
    or nothing at all."""
    try:
        yield
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(path)) from error
