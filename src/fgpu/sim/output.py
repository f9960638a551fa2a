"""Writing a report's files all or none."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path


def write_files_atomically(
    out_dir: str | os.PathLike[str], writers: Sequence[tuple[str, Callable[[Path], None]]]
) -> None:
    """Run each ``(name, write)`` into a temporary file in ``out_dir``, then rename them all.

    A failure in any writer leaves none of the new files and no temporary file (earlier
    files of the same names stay until every writer succeeded; the renames themselves are
    not one atomic step). ``out_dir`` is created if missing.

    Raises:
        OSError: the folder or a file cannot be written; whatever a writer raises.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, write in writers:
            # Not mkstemp: its 0600 mode would survive the rename; plain open honours umask.
            tmp = out / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
            staged.append((tmp, out / name))
            write(tmp)
        for tmp, final in staged:
            os.replace(tmp, final)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
