"""Where the Alibaba GPU trace comes from, and the check that the files found are it.

The fill experiment's default inputs are two CSVs of the public ``alibaba/clusterdata``
repository, folder ``cluster-trace-gpu-v2023/csv``, at commit :data:`TRACE_COMMIT`. They are
not copied into fgpu (README, "The fill experiment"): a user clones that repository, or
downloads the folder, and points ``$FGPU_TRACE_DIR`` at it. When ``fgpu sim fill`` takes a
file from there (no ``--nodes``/``--pods`` given), :func:`check_published` compares its
SHA-256 with the published file's, so that the published figures are never compared with
other data by mistake. Files passed with ``--nodes``/``--pods`` are not checked: any CSV of
the same layout is welcome there.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

TRACE_REPOSITORY = "https://github.com/alibaba/clusterdata"
TRACE_FOLDER = "cluster-trace-gpu-v2023/csv"
TRACE_COMMIT = "7a6c496e4f4b6ce6150be8f881cb051bf2abff42"
"""The commit the checksums were taken at (the v2023 files last changed on 2023-08-24)."""

PUBLISHED_SHA256: dict[str, str] = {
    "openb_node_list_gpu_node.csv": (
        "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5"
    ),
    "openb_pod_list_default.csv": (
        "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8"
    ),
}
"""File name -> SHA-256 (hex) of the two files the FGD paper's headline experiment reads."""


class TraceChecksumError(ValueError):
    """A trace file found by default differs from the published one."""


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, hex (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_published(path: Path) -> None:
    """Refuse ``path`` when it is one of :data:`PUBLISHED_SHA256` by name and its bytes
    differ; other names pass unchecked.

    Raises:
        TraceChecksumError: naming the file, both checksums and where the published file is.
    """
    expected = PUBLISHED_SHA256.get(path.name)
    if expected is None:
        return
    found = sha256_of(path)
    if found != expected:
        raise TraceChecksumError(
            f"{path}: SHA-256 {found} is not that of the published {path.name} ({expected}, "
            f"{TRACE_REPOSITORY} folder {TRACE_FOLDER} at commit {TRACE_COMMIT}); fetch that "
            "file again, or pass your file explicitly to use it anyway"
        )


__all__ = [
    "PUBLISHED_SHA256",
    "TRACE_COMMIT",
    "TRACE_FOLDER",
    "TRACE_REPOSITORY",
    "TraceChecksumError",
    "check_published",
    "sha256_of",
]
