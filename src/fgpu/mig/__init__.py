"""MIG: the profile catalog, layout validity, the placement rule and the planner.

Pure: no device is touched here. Devices are behind :class:`fgpu.mig.device.MigDevice`
(simulated) and :mod:`fgpu.agent.mig_nvml` (NVML). See ``docs/mig.md``.
"""

from fgpu.mig.catalog import (
    MIG_MODELS,
    MigProfile,
    MigProfileTable,
    NotMigCapableError,
    UnknownMigProfileError,
    mig_profiles,
)
from fgpu.mig.layout import (
    Layout,
    LayoutStatus,
    NoRoom,
    Placement,
    future_options,
    is_maximal,
    is_valid,
    make_layout,
    maximal_layouts,
    place_instance,
)

__all__ = [
    "MIG_MODELS",
    "Layout",
    "LayoutStatus",
    "MigProfile",
    "MigProfileTable",
    "NoRoom",
    "NotMigCapableError",
    "Placement",
    "UnknownMigProfileError",
    "future_options",
    "is_maximal",
    "is_valid",
    "make_layout",
    "maximal_layouts",
    "mig_profiles",
    "place_instance",
]
