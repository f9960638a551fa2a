"""The environment that tells a workload's framework (and MPS) its limits before launch.

:func:`launch_env` returns variables for the launcher to add to a workload's environment
(DESIGN.md section 7). Forms, and where they come from:

- **PyTorch, all releases since 1.8**: a ``sitecustomize`` shim (``fgpu/agent/torch_shim``)
  first on ``PYTHONPATH`` plus ``FGPU_TORCH_MEMORY_FRACTION``; the shim calls
  ``torch.cuda.set_per_process_memory_fraction(fraction, device)`` for each visible GPU when
  CUDA initialises, and only if the workload imports torch. Fraction = quota MiB / device
  MiB, rounded down to 6 decimals so it never exceeds the quota.
- **PyTorch with the allocator option** (opt-in, ``torch_alloc_conf=True``): recent PyTorch
  reads ``per_process_memory_fraction:<f>`` from ``PYTORCH_ALLOC_CONF`` (and from its older
  alias ``PYTORCH_CUDA_ALLOC_CONF``, which the CUDA allocator reads first when set): see
  ``c10/cuda/CUDAAllocatorConfig.h`` in PyTorch's sources (pytorch/pytorch PR 161035). Older
  releases reject unknown keys there ("Unrecognized key ... in CUDA allocator config"), which
  would stop the workload at CUDA start, so it is off by default; the option takes one
  fraction for all devices (the smallest is used).
- **MPS** (when an MPS control daemon serves the GPU): ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``"0=4096M,1=4096M"``: device ordinal as the client sees it, then the limit) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (compute share as a percent of the SMs), plus the
  daemon's pipe and log directories when not the defaults (NVIDIA MPS documentation,
  "Appendix: Environment Variables").

The ``FGPU_*`` variables of DESIGN.md section 7 (``CUDA_VISIBLE_DEVICES``,
``FGPU_GPU_MEMORY_MIB``...) are set by :class:`~fgpu.agent.launcher.Launcher` itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent / "torch_shim"
"""The directory that holds the ``sitecustomize`` shim."""

FRACTION_ENV = "FGPU_TORCH_MEMORY_FRACTION"
_DIGITS = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuGrant:
    """What a workload was granted on one GPU.

    Attributes:
        uuid: the GPU (or MIG instance) uuid.
        device_memory_mib: the device's memory, MiB.
        memory_mib: the workload's memory quota there, MiB (0 < quota <= device memory).
        compute_milli: its compute share there, milli-GPU (1-1000).

    Raises:
        ValueError: a figure out of range.
    """

    uuid: str
    device_memory_mib: int
    memory_mib: int
    compute_milli: int

    def __post_init__(self) -> None:
        if self.device_memory_mib <= 0:
            raise ValueError(f"{self.uuid}: device memory must be positive")
        if not 0 < self.memory_mib <= self.device_memory_mib:
            raise ValueError(
                f"{self.uuid}: memory quota {self.memory_mib} MiB not in "
                f"1-{self.device_memory_mib}",
            )
        if not 0 < self.compute_milli <= 1000:
            raise ValueError(f"{self.uuid}: compute share {self.compute_milli} not in 1-1000")

    @property
    def fraction_millionths(self) -> int:
        """Quota / device memory in millionths, rounded down (never above the quota)."""
        return self.memory_mib * _DIGITS // self.device_memory_mib


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsSettings:
    """An MPS control daemon that serves the workload's GPUs.

    Attributes:
        pipe_directory: its ``CUDA_MPS_PIPE_DIRECTORY`` (None: the default).
        log_directory: its ``CUDA_MPS_LOG_DIRECTORY`` (None: the default).
        limit_memory: set ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``.
        limit_threads: set ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``.
    """

    pipe_directory: str | None = None
    log_directory: str | None = None
    limit_memory: bool = True
    limit_threads: bool = True


MPS_DEFAULT_PIPE_DIRECTORY = Path("/tmp/nvidia-mps")


def mps_pipe_directory(env: Mapping[str, str] | None = None) -> Path | None:
    """The pipe folder of an MPS control daemon serving this machine, or None: the daemon's
    ``control`` pipe in ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``; NVIDIA MPS
    documentation, "Appendix: Environment Variables")."""
    source = os.environ if env is None else env
    folder = Path(source.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE_DIRECTORY)
    try:
        return folder if (folder / "control").exists() else None
    except OSError:
        return None


def _fraction_text(millionths: int) -> str:
    return f"{millionths // _DIGITS}.{millionths % _DIGITS:06d}"


def _merge_alloc_conf(current: str, fraction: str) -> str:
    """``current`` (``key:value,...``) with ``per_process_memory_fraction`` set to the smaller
    of its own value (if any) and ``fraction``."""
    parts: list[str] = []
    value = fraction
    for item in (p.strip() for p in current.split(",")):
        if not item:
            continue
        key, _, old = item.partition(":")
        if key.strip() == "per_process_memory_fraction":
            try:
                if float(old) < float(fraction):
                    value = old.strip()
            except ValueError:
                pass
            continue
        parts.append(item)
    parts.append(f"per_process_memory_fraction:{value}")
    return ",".join(parts)


def launch_env(
    grants: Sequence[GpuGrant],
    *,
    env: Mapping[str, str] | None = None,
    mps: MpsSettings | None = None,
    torch_shim: bool = True,
    torch_alloc_conf: bool = False,
) -> dict[str, str]:
    """Variables to add to a workload's environment so that its framework keeps to its
    limits (module docstring lists the forms and their sources).

    Args:
        grants: the workload's GPUs in ``CUDA_VISIBLE_DEVICES`` order.
        env: the workload's own environment (to extend its ``PYTHONPATH`` and
            ``PYTORCH_*ALLOC_CONF`` rather than replace them).
        mps: the MPS daemon serving these GPUs, or None when MPS is not in use.
        torch_shim: add the ``sitecustomize`` shim (default).
        torch_alloc_conf: also put ``per_process_memory_fraction`` into the allocator
            configuration variable (needs a PyTorch release that knows the key).

    Returns:
        Variable -> value; merge it over ``env`` (values already include ``env``'s where
        they extend it). Empty when ``grants`` is empty.
    """
    if not grants:
        return {}
    base = env or {}
    out: dict[str, str] = {}
    fractions = [_fraction_text(g.fraction_millionths) for g in grants]
    if torch_shim:
        out[FRACTION_ENV] = ",".join(fractions)
        rest = base.get("PYTHONPATH", "")
        out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM_DIR), rest) if p)
    if torch_alloc_conf:
        smallest = _fraction_text(min(g.fraction_millionths for g in grants))
        name = (
            "PYTORCH_CUDA_ALLOC_CONF" if "PYTORCH_CUDA_ALLOC_CONF" in base else "PYTORCH_ALLOC_CONF"
        )
        out[name] = _merge_alloc_conf(base.get(name, ""), smallest)
    if mps is not None:
        if mps.limit_memory:
            out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{i}={g.memory_mib}M" for i, g in enumerate(grants)
            )
        if mps.limit_threads:
            percent = max(1, min(g.compute_milli for g in grants) // 10)
            out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
        if mps.pipe_directory:
            out["CUDA_MPS_PIPE_DIRECTORY"] = mps.pipe_directory
        if mps.log_directory:
            out["CUDA_MPS_LOG_DIRECTORY"] = mps.log_directory
    return out


__all__ = [
    "FRACTION_ENV",
    "SHIM_DIR",
    "GpuGrant",
    "MpsSettings",
    "launch_env",
    "mps_pipe_directory",
]
