"""How ``fgpu serve`` decides on the interposer and the fake driver (issue 12).

- :class:`InterposerMode` and :func:`interposer_segments`: whether workloads get libfgpu
  (on real GPUs by default; on simulated GPUs only with the fake driver), and where their
  segments live;
- :class:`FakeDriver` and :func:`fake_driver_for`: simulated GPUs served to workloads by the
  fake CUDA driver (a stand-in for tests and demos, ``native/fakecuda``).
"""

from __future__ import annotations

import enum
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fgpu.agent.backend import GpuBackend
from fgpu.agent.interposer.preload import (
    FakeGpu,
    SegmentDir,
    default_segment_root,
    fake_gpus_spec,
)
from fgpu.agent.interposer.segment import SegmentError

if TYPE_CHECKING:
    from fgpu.server.enforcement import EnforcementConfig

log = logging.getLogger("fgpu.server")


class InterposerMode(enum.StrEnum):
    """When workloads get the interposer."""

    AUTO = "auto"
    """On real GPUs (NVML) and with the fake driver; off for plain simulated GPUs."""
    ON = "on"
    """Always (on simulated GPUs without the fake driver it has nothing to hook)."""
    OFF = "off"
    """Never: the freezer and the NVML guard only."""


@dataclass(frozen=True, slots=True)
class FakeDriver:
    """Simulated GPUs served to workloads by the fake CUDA driver (a stand-in for tests and
    demos: ``native/fakecuda``).

    Attributes:
        driver_dir: the folder of the fake ``libcuda.so.1`` and ``libnvidia-ml.so.1``.
        state_file: the pretend GPUs' shared state.
        gpus: the pretend GPUs (the simulated backend's).
    """

    driver_dir: Path
    state_file: Path
    gpus: tuple[FakeGpu, ...]


def interposer_segments(
    config: EnforcementConfig,
    backend: GpuBackend,
    state_dir: Path,
    fake_driver: FakeDriver | None,
) -> tuple[SegmentDir | None, str]:
    """The segment folder when workloads get the interposer (:class:`InterposerMode`), else
    None, with the reason. Without a built ``libfgpu.so`` (no C compiler at install) the
    interposer is off and a warning says so.

    Raises:
        ValueError: the segment folder cannot be made ours (the message names it).
    """
    mode = config.interposer
    if mode is InterposerMode.OFF:
        return None, "off: --interposer off"
    if mode is InterposerMode.AUTO and backend.kind != "nvml" and fake_driver is None:
        return None, "off: simulated GPUs have no CUDA driver to hook (try --fake-driver)"
    from fgpu.native import lib_dir

    library = lib_dir() / "libfgpu.so"
    if not library.is_file():
        log.warning("interposer off: %s is missing (built by pip install with cc)", library)
        return None, f"off: {library} is missing (pip install builds it with cc)"
    folder = SegmentDir(default_segment_root(state_dir))
    try:
        folder.ensure()
    except SegmentError as exc:
        raise ValueError(
            f"the interposer's segments: {exc} (or run with --interposer off)"
        ) from None
    return folder, "on"


def fake_driver_for(backend: GpuBackend, state_dir: Path) -> FakeDriver:
    """The fake CUDA driver serving ``backend``'s simulated GPUs to workloads.

    Raises:
        ValueError: the backend is not simulated, or has GPUs in MIG mode (the fake driver
            has no MIG).
    """
    if backend.kind != "simulated":
        raise ValueError("--fake-driver: needs --simulate-gpus (real GPUs have a real driver)")
    devices = backend.gpus()
    if any(d.mig_enabled for d in devices):
        raise ValueError("--fake-driver: the fake CUDA driver has no MIG; drop ':mig'")
    from fgpu.native import fake_driver_dir

    root = default_segment_root(state_dir)
    gpus = tuple(FakeGpu(d.uuid, d.model, d.memory_mib) for d in devices)
    # named after the GPUs: a restart with the same GPUs finds its workloads' memory there,
    # other GPUs get a state of their own (the fake driver takes an existing file as it is)
    tag = hashlib.sha256(fake_gpus_spec(gpus).encode()).hexdigest()[:8]
    return FakeDriver(
        driver_dir=fake_driver_dir(),
        state_file=root / f"fake-gpus-{tag}.state",
        gpus=gpus,
    )


__all__ = ["FakeDriver", "InterposerMode", "fake_driver_for", "interposer_segments"]
