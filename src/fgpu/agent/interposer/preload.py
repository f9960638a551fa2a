"""Where interposer segments live, and the environment that loads libfgpu into a workload.

:class:`SegmentDir` owns one folder of segment files (one per workload, named after it). The
folder (:func:`default_segment_root`) is created mode 0711 (others may reach a file they know
the name of, but not list the folder); each file is mode 0600 and owned by the workload's
user, so a workload can map its own segment and nobody else's (a segment holds its gate and
its memory accounting).

:func:`preload_env` gives the variables that load the interposer: ``LD_PRELOAD`` (libfgpu
first, then what the workload had) and ``FGPU_SEG``. :func:`fake_driver_env` adds the fake
CUDA driver and NVML for simulated GPUs: ``LD_LIBRARY_PATH`` starts with the fake driver's
folder, and ``FGPU_FAKE_GPU_STATE``/``FGPU_FAKE_GPUS`` describe the machine's pretend GPUs
(``native/fakecuda``). A workload whose own environment says ``FGPU_INTERPOSER=off`` is
launched without the interposer (its memory is then watched by the NVML guard only).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fgpu.agent.interposer.segment import (
    FLAG_GATING,
    FLAG_MEMORY_CAP,
    Segment,
    SegmentError,
    control_path,
)

LIBRARY = "libfgpu.so"
"""The interposer's file name in the native library folder."""

OFF_VALUES = frozenset({"0", "off", "no", "false"})
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MIB = 1024 * 1024
RUN_DIR = Path("/run/fgpu")


def interposer_disabled(env: Mapping[str, str]) -> bool:
    """Whether a workload's own environment turns the interposer off (``FGPU_INTERPOSER``)."""
    return env.get("FGPU_INTERPOSER", "").strip().lower() in OFF_VALUES


def default_segment_root(state_dir: Path) -> Path:
    """Where one service's segments live, in a folder no other user can create first.

    As root: ``/run/fgpu/segments-<digest of the state folder>`` (``/run`` is root's and a
    memory file system), so two services on one machine never share it. Otherwise the state
    folder's ``segments`` (the service's own user runs every workload, and the folder is
    private to it).
    """
    if os.geteuid() == 0:
        digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
        return RUN_DIR / f"segments-{digest}"
    return state_dir / "segments"


@dataclass(frozen=True, slots=True)
class SegmentDir:
    """The folder of a service's (or agent's) segment files.

    Attributes:
        root: the folder; created on :meth:`ensure` (mode 0711).
    """

    root: Path

    def ensure(self) -> None:
        """Create the folder if missing and set its mode to 0711 (its parents: 0755 when made
        here).

        Raises:
            SegmentError: it cannot be created, or it (or a parent made for it) is not a
                folder of ours.
        """
        try:
            for folder in (self.root.parent, self.root):
                folder.mkdir(mode=0o755, exist_ok=True)
                info = folder.lstat()
                if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
                    raise SegmentError(f"{folder}: not a folder")
                if folder == self.root and info.st_uid != os.geteuid():
                    raise SegmentError(f"{folder}: not a folder owned by uid {os.geteuid()}")
            os.chmod(self.root, 0o711)
        except OSError as exc:
            raise SegmentError(f"cannot prepare {self.root}: {exc}") from exc

    def remove_if_unused(self) -> bool:
        """Delete the folder (and the fake driver's state in it) when no segment is left;
        True when it was removed."""
        try:
            entries = list(self.root.iterdir())
        except OSError:
            return False
        if any(e.suffix == ".seg" for e in entries):
            return False
        for entry in entries:
            with contextlib.suppress(OSError):
                entry.unlink()
        with contextlib.suppress(OSError):
            self.root.rmdir()
        return not self.root.exists()

    def path(self, workload_id: str) -> Path:
        """The segment file of ``workload_id``.

        Raises:
            ValueError: an id that is not a plain file name.
        """
        if not _SAFE.match(workload_id):
            raise ValueError(f"workload_id: {workload_id!r} is not a plain name")
        return self.root / f"{workload_id}.seg"

    def create(
        self,
        workload_id: str,
        uuids: Sequence[str],
        memory_mib: Sequence[int],
        *,
        max_inflight: int,
        uid: int | None,
        gid: int | None,
        gating: bool = True,
    ) -> Segment:
        """A fresh segment for a workload about to start (any old file is replaced).

        Args:
            workload_id: the workload.
            uuids: its GPUs, ``CUDA_VISIBLE_DEVICES`` order.
            memory_mib: its memory quota on each, MiB.
            max_inflight: launches each process may keep in flight (0: unbounded).
            uid, gid: the workload's user and group (owner of the file).
            gating: whether launches wait while the governor holds the workload.

        Raises:
            ValueError, SegmentError: see :meth:`Segment.create`.
        """
        self.ensure()
        flags = FLAG_MEMORY_CAP | (FLAG_GATING if gating else 0)
        return Segment.create(
            self.path(workload_id),
            workload_id,
            uuids,
            [m * MIB for m in memory_mib],
            flags=flags,
            max_inflight=max_inflight,
            uid=uid,
            gid=gid,
        )

    def open(self, workload_id: str) -> Segment | None:
        """The existing segment of a workload (after an agent restart), or None if it has none
        or it is not readable as one."""
        try:
            return Segment.open(self.path(workload_id))
        except (SegmentError, ValueError):
            return None

    def remove_stale(self, keep: set[str]) -> list[str]:
        """Delete segment files of workloads not in ``keep``; returns their ids."""
        removed: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.root.iterdir():
                if entry.suffix != ".seg" or entry.stem in keep:
                    continue
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed.append(entry.stem)
                with contextlib.suppress(OSError):
                    control_path(entry).unlink()
        return removed


def preload_env(lib_dir: Path, segment: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Variables that load the interposer into a workload (merge them over ``env``).

    ``LD_PRELOAD`` gets ``<lib_dir>/libfgpu.so`` first, then whatever ``env`` preloaded;
    ``FGPU_SEG`` names the segment.
    """
    ours = str(lib_dir / LIBRARY)
    rest = [p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if p and p != ours]
    return {"LD_PRELOAD": " ".join([ours, *rest]), "FGPU_SEG": str(segment)}


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """A pretend GPU of the fake driver.

    Attributes:
        uuid: its uuid (``GPU-...``).
        model: its catalog model (``A100-80GB``).
        memory_mib: its memory, MiB.
    """

    uuid: str
    model: str
    memory_mib: int


def fake_gpus_spec(gpus: Sequence[FakeGpu]) -> str:
    """``FGPU_FAKE_GPUS``: ``UUID=MODEL:MIB`` items joined by commas."""
    return ",".join(f"{g.uuid}={g.model}:{g.memory_mib}" for g in gpus)


def fake_driver_env(
    driver_dir: Path,
    state_file: Path,
    gpus: Sequence[FakeGpu],
    env: Mapping[str, str],
) -> dict[str, str]:
    """Variables that make a workload use the fake CUDA driver and NVML (simulated GPUs).

    Args:
        driver_dir: the folder holding the fake ``libcuda.so.1`` and ``libnvidia-ml.so.1``.
        state_file: the machine-wide state of the pretend GPUs (shared by all workloads).
        gpus: the pretend GPUs.
        env: the workload's own environment (its ``LD_LIBRARY_PATH`` is kept after ours).
    """
    rest = env.get("LD_LIBRARY_PATH", "")
    return {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(driver_dir), rest) if p),
        "FGPU_FAKE_GPU_STATE": str(state_file),
        "FGPU_FAKE_GPUS": fake_gpus_spec(gpus),
    }


__all__ = [
    "LIBRARY",
    "FakeGpu",
    "SegmentDir",
    "default_segment_root",
    "fake_driver_env",
    "fake_gpus_spec",
    "interposer_disabled",
    "preload_env",
]
