"""Writing a file so that no reader ever sees it half-written, even across a crash or a full disk."""

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to a temporary file beside `path`, flush it to disk, then rename it over `path`.

    The rename is atomic within one file system, so `path` holds either its old content or all of the new;
    fsync before it keeps a power loss from leaving an empty file under the new name.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)  # mkstemp makes 0600
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
