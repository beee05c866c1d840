"""Files that are whole or absent: the one way fedflex writes results, checkpoints and
partitions.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


@contextmanager
def atomic_write(path: "str | os.PathLike[str]") -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path`` for binary writing; on a clean exit it is
    synced and renamed over ``path`` (``os.replace``), so ``path`` holds either the whole
    new content or what it held before, even when the disk fills up or the process is
    stopped. On an error the temporary file is removed and the error goes on.

    The temporary name carries the process id (writers in other processes do not meet);
    it is not ``mkstemp``'s, so the file gets the usual permissions.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_write(target) as fh:
    ...     _ = fh.write(b"done")
    >>> target.read_bytes()
    b'done'
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
