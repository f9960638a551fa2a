"""Feature gates of the API server stand-in that change what it stores.

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

- ``DRAConsumableCapacity`` (beta, on by default from Kubernetes 1.36; off on 1.34 and
  1.35): with the gate off the API server drops the fields it guards from what it stores,
  as it does with every disabled field (no error): a ResourceSlice device's
  ``allowMultipleAllocations`` (and ``capacity.*.requestPolicy``).
"""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]


def drop_disabled(plural: str, obj: Obj, consumable_capacity: bool) -> Obj:
    """``obj`` as the API server stores it with the gates given (a copy when a field is
    dropped)."""
    if consumable_capacity or plural != "resourceslices":
        return obj
    devices = (obj.get("spec") or {}).get("devices")
    if not isinstance(devices, list):
        return obj
    out = copy.deepcopy(obj)
    for device in out["spec"]["devices"]:
        if not isinstance(device, dict):
            continue
        device.pop("allowMultipleAllocations", None)
        for capacity in (device.get("capacity") or {}).values():
            if isinstance(capacity, dict):
                capacity.pop("requestPolicy", None)
    return out


__all__ = ["drop_disabled"]
