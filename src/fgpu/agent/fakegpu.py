"""Simulated GPUs whose workloads run against the fake CUDA driver (a stand-in for tests and
demos, ``native/fakecuda``).

:class:`FakeDriverBackend` is a :class:`~fgpu.agent.backend.SimulatedBackend` whose per-process
memory and utilization are not pretend reports but what the fake NVML measures: the fake
driver keeps every process's device memory and kernel time in one state file shared by the
machine, so the memory guard reads the same NVML calls it reads on a real GPU
(:class:`~fgpu.agent.nvml.NvmlBackend`, through nvidia-ml-py) and stops what the interposer
cannot see (a workload that turned the interposer off, for example).

The fake NVML is loaded into this process by its absolute path before nvidia-ml-py asks for
``libnvidia-ml.so.1``; the dynamic linker then answers that name with the library already
loaded. So this backend must be built before anything else in the process initialises NVML
(``fgpu serve --fake-driver`` builds it in its composition root).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fgpu.agent.backend import GpuProcess, ProcessUtilization, SimulatedBackend
from fgpu.agent.interposer.preload import FakeGpu, fake_gpus_spec

if TYPE_CHECKING:
    from fgpu.agent.nvml import NvmlBackend

log = logging.getLogger(__name__)


def state_file_mode() -> int:
    """Permissions of the fake driver's state file under ``fgpu serve --fake-driver``.

    The fake driver creates it 0600 (its creator's processes only). A service that is not
    root runs every workload as its own user, so 0600 is enough and stays. A root service runs
    each workload as its submitter, and every workload's process must write the file (it
    reserves device memory there), with no group that all submitters share: the file is
    widened to 0666 inside the 0711 segment folder (its name is not listed). Any local user
    who guesses the name can then change the pretend GPUs' counters: a demo stand-in's limit
    (the real driver has no such file); a corrupt counter is an error the fake reports
    (``CUDA_ERROR_ILLEGAL_STATE``, ``NVML_ERROR_UNKNOWN``), never a wrapped figure.
    """
    return 0o666 if os.geteuid() == 0 else 0o600


class FakeDriverBackend(SimulatedBackend):
    """See the module docstring. Build it with :meth:`wrap`."""

    _nvml: NvmlBackend | None = None

    @classmethod
    def wrap(
        cls, simulated: SimulatedBackend, driver_dir: Path, state_file: Path
    ) -> FakeDriverBackend:
        """The same GPUs as ``simulated``, measured through the fake NVML.

        Args:
            simulated: the ``--simulate-gpus`` backend (no MIG).
            driver_dir: folder of the fake ``libnvidia-ml.so.1``.
            state_file: the pretend GPUs' shared state (created on first use, see
                :func:`state_file_mode` for who may open it).

        Raises:
            ValueError: the fake NVML cannot be loaded or initialised.
        """
        backend = cls(simulated.spec)
        gpus = [FakeGpu(d.uuid, d.model, d.memory_mib) for d in backend.gpus()]
        state_file.parent.mkdir(parents=True, exist_ok=True)
        os.environ["FGPU_FAKE_GPU_STATE"] = str(state_file)
        os.environ["FGPU_FAKE_GPUS"] = fake_gpus_spec(gpus)
        library = driver_dir / "libnvidia-ml.so.1"
        try:
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            from fgpu.agent.nvml import NvmlBackend

            backend._nvml = NvmlBackend()
        except Exception as exc:
            raise ValueError(f"--fake-driver: cannot use the fake NVML {library}: {exc}") from exc
        with contextlib.suppress(OSError):
            state_file.chmod(state_file_mode())
        return backend

    def process_memory(self) -> list[GpuProcess]:
        """What the fake NVML reports per process, plus any :meth:`report_usage` figures."""
        found = list(super().process_memory())
        nvml = self._nvml
        if nvml is not None:
            found.extend(nvml.process_memory())
        return found

    def enable_accounting(self) -> dict[str, str]:
        """:meth:`NvmlBackend.enable_accounting` on the fake NVML (root only, as on a GPU)."""
        nvml = self._nvml
        return {} if nvml is None else nvml.enable_accounting()

    def process_peak_memory(self, processes: list[GpuProcess]) -> list[GpuProcess]:
        """:meth:`NvmlBackend.process_peak_memory`: the fake driver's per-process high-water
        mark of device memory, through its NVML accounting."""
        nvml = self._nvml
        return [] if nvml is None else nvml.process_peak_memory(processes)

    def process_utilization_since(self, since_us: int) -> list[ProcessUtilization]:
        """What the fake NVML reports (:meth:`NvmlBackend.process_utilization_since`): the
        fake driver's per-process kernel time, in NVML's shape."""
        nvml = self._nvml
        return [] if nvml is None else nvml.process_utilization_since(since_us)

    def close(self) -> None:
        nvml = self._nvml
        if nvml is not None:
            nvml.close()
            self._nvml = None


_DEVICE_TIME = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {}
for pid in map(int, sys.argv[3:]):
    ns = ctypes.c_ulonglong(0)
    rc = lib.fgpuFakeDeviceTime(sys.argv[2].encode(), pid, ctypes.byref(ns))
    out[pid] = ns.value if rc == 0 else None
print(json.dumps(out))
"""


def device_time(state_file: Path, uuid: str, pids: Sequence[int]) -> dict[int, int]:
    """Device time the fake driver counted for each pid on GPU ``uuid`` (ns): the ground truth
    that tests and ``bench/interposer.py`` compare shares with. Read in a fresh process (the
    fake libraries keep the first state file a process opens).

    Raises:
        RuntimeError: the fake driver does not know the GPU or a pid (named).
    """
    from fgpu.native import fake_driver_dir

    done = subprocess.run(
        [sys.executable, "-c", _DEVICE_TIME, str(fake_driver_dir() / "libcuda.so.1"), uuid]
        + [str(p) for p in pids],
        env={**os.environ, "FGPU_FAKE_GPU_STATE": str(state_file)},
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, int | None] = json.loads(done.stdout)
    missing = [pid for pid, ns in found.items() if ns is None]
    if missing:
        raise RuntimeError(f"the fake driver has no device time of pid(s) {missing} on {uuid}")
    return {int(pid): int(ns) for pid, ns in found.items() if ns is not None}


__all__ = ["FakeDriverBackend", "device_time", "state_file_mode"]
