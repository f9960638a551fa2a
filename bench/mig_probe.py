"""Read-only MIG probe: what a real GPU says about MIG, as JSON.

For each GPU: name, uuid, memory, the catalog model, MIG mode (current and pending), the GPU
instance profiles with their possible placements as NVML reports them, the instances present,
and how the device's profiles differ from fgpu's catalog (``src/fgpu/mig/catalog.py``; the
figures marked *assumed* there are the ones to confirm). It never changes anything: no MIG
mode change, no instance created or destroyed (only NVML queries are called).

Usage: ``python bench/mig_probe.py [--out FILE]``. With no NVML (no driver, no
nvidia-ml-py), it prints ``{"error": ...}`` and exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

from fgpu.agent.mig_nvml import NvmlMigDevice, read_profile_table
from fgpu.agent.nvml import NvmlUnavailableError, catalog_name_for
from fgpu.mig.catalog import MIG_TABLES, MigProfile, MigProfileTable
from fgpu.mig.device import MigDeviceError

_MIB = 1024 * 1024
_FIELDS = (
    "profile_id",
    "compute_slices",
    "memory_slices",
    "memory_mib",
    "sm_count",
    "max_count",
    "starts",
)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _profile(p: MigProfile) -> dict[str, Any]:
    return {"name": p.name, **{f: getattr(p, f) for f in _FIELDS}}


def compare(device: MigProfileTable, catalog: MigProfileTable) -> dict[str, Any]:
    """Profiles only on the device, only in the catalog, and fields that differ."""
    mine = {p.name: p for p in catalog.profiles}
    theirs = {p.name: p for p in device.profiles}
    differ = {}
    for name in sorted(set(mine) & set(theirs)):
        fields = {
            f: {"device": getattr(theirs[name], f), "catalog": getattr(mine[name], f)}
            for f in _FIELDS
            if getattr(theirs[name], f) != getattr(mine[name], f)
        }
        if fields:
            differ[name] = fields
    return {
        "only_on_device": sorted(set(theirs) - set(mine)),
        "only_in_catalog": sorted(set(mine) - set(theirs)),
        "different": differ,
        "slices": {
            "device": [device.compute_slices, device.memory_slices],
            "catalog": [catalog.compute_slices, catalog.memory_slices],
        },
    }


def probe(nvml: Any) -> dict[str, Any]:
    """Query every GPU (read only).

    Raises:
        NvmlUnavailableError: NVML does not initialise.
    """
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as exc:
        raise NvmlUnavailableError(f"NVML did not initialise: {exc}") from exc
    try:
        report: dict[str, Any] = {"host": platform.node(), "gpus": []}
        try:
            report["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        except (nvml.NVMLError, AttributeError):
            report["driver"] = None
        for index in range(int(nvml.nvmlDeviceGetCount())):
            report["gpus"].append(_gpu(nvml, index))
        return report
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _gpu(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle)).strip()
    memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
    model = catalog_name_for(name, memory)
    gpu: dict[str, Any] = {
        "index": index,
        "name": name,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "memory_mib": memory,
        "catalog_model": model,
    }
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        enabled = int(current) == int(nvml.NVML_DEVICE_MIG_ENABLE)
        gpu["mig_mode"] = {"current": int(current), "pending": int(pending), "enabled": enabled}
    except nvml.NVMLError as exc:
        gpu["mig_mode"] = {"error": str(exc)}
        return gpu
    try:
        table = read_profile_table(nvml, handle, model or name)
    except (MigDeviceError, nvml.NVMLError) as exc:
        gpu["profiles_error"] = str(exc)
        return gpu
    gpu["profiles"] = [_profile(p) for p in table.profiles]
    gpu["slices"] = {"compute": table.compute_slices, "memory": table.memory_slices}
    if model in MIG_TABLES:
        gpu["catalog_comparison"] = compare(table, MIG_TABLES[model])
    try:
        device = NvmlMigDevice(nvml, handle, index, model or name, table, enabled)
        gpu["instances"] = [
            {"profile": i.profile, "start": i.start, "uuid": i.uuid, "in_use": i.in_use}
            for i in device.instances()
        ]
    except MigDeviceError as exc:
        gpu["instances_error"] = str(exc)
    return gpu


def main(argv: list[str] | None = None, nvml: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    try:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailableError(f"nvidia-ml-py is not installed: {exc}") from exc
            nvml = pynvml
        report = probe(nvml)
        code = 0
    except NvmlUnavailableError as exc:
        report = {"error": str(exc)}
        code = 1
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
