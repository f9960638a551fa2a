"""MIG profile catalog: per GPU model, the GPU instance profiles and where they may start.

Geometry (NVIDIA MIG user guide; ``../shared/mig-profiles.md``): memory is cut into 8 slices
and compute into 7 (A30: 4 and 4). A GPU instance of a profile occupies the memory slices
``[start, start + memory_slices)``; it may start only at one of the profile's allowed starts,
which already encode the compute-slice limit (a 1g instance cannot start at slice 7).

Figures per profile are what ``nvidia-smi mig -lgip`` / NVML
(``nvmlDeviceGetGpuInstanceProfileInfo``) report: the profile id, compute slices
(``sliceCount``), memory in MiB (``memorySizeMB``; from the GiB figure ``nvidia-smi`` prints,
see :func:`_profile`), SMs (``multiprocessorCount``), the most instances of that profile on one GPU
(``instanceCount``), and the allowed starts (``nvmlDeviceGetGpuInstancePossiblePlacements``).
Sources: the MIG user guide's profile tables, ``nvidia-smi mig -lgip/-lgipp`` listings
published by users (A30, A100, H100). Figures marked *assumed* below were not confirmed on
hardware: the H200 ``1g.35gb`` SM count (taken as the H100 ``1g.20gb``'s 26) and the H200
``3g.71gb``/``4g.71gb`` memory (69.75 GiB, scaled from the H100's 39.5 of 79.25 GiB). On a
real GPU, :func:`fgpu.agent.mig_nvml.read_profile_table` reads the same table from the
device, and the device's answer wins (pass it as :attr:`fgpu.mig.planner.MigGpu.table`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fgpu.model.catalog import GPU_CATALOG, UnknownGpuModelError, canonical_name
from fgpu.model.units import MILLI_PER_GPU

MEDIA_SUFFIX = "+me"
"""Profiles whose name ends with this include the media engines (decoders, JPEG, OFA); only
one such instance fits on a GPU."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of one GPU model.

    Attributes:
        name: ``"1g.10gb"``, ``"1g.10gb+me"``: compute slices, then nominal memory.
        profile_id: the NVML / ``nvidia-smi mig -lgip`` profile id (19 for 1g on A100).
        compute_slices: compute slices (GPCs) of the instance, 1..7.
        memory_slices: memory slices it occupies on the memory axis (its placement size).
        memory_mib: memory the instance reports, MiB.
        sm_count: streaming multiprocessors of the instance.
        max_count: the most instances of this profile one GPU can hold.
        starts: allowed first memory slices, ascending.
    """

    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    sm_count: int
    max_count: int
    starts: tuple[int, ...]

    @property
    def media(self) -> bool:
        """True for a ``+me`` profile (with media engines)."""
        return self.name.endswith(MEDIA_SUFFIX)


class UnknownMigProfileError(ValueError):
    """A profile name that the GPU model does not have; the message lists the valid ones."""

    def __init__(self, name: str, model: str, valid: list[str], field: str = "profile") -> None:
        self.name = name
        self.model = model
        self.valid = valid
        self.field = field
        super().__init__(
            f"{field}: {name!r} is not a MIG profile of {model}; valid: {', '.join(valid)}"
        )


class NotMigCapableError(ValueError):
    """A GPU model without MIG (or one whose MIG profiles fgpu does not know)."""

    def __init__(self, model: str, field: str = "gpu_model") -> None:
        self.model = model
        self.field = field
        super().__init__(
            f"{field}: {model} has no MIG profiles in fgpu's catalog; "
            f"MIG models: {', '.join(MIG_MODELS)}"
        )


@dataclass(frozen=True, slots=True)
class MigProfileTable:
    """Every MIG profile of one GPU model, with the model's slice counts.

    Attributes:
        model: catalog model name (``"A100-80GB"``).
        compute_slices: compute slices of the whole GPU (7; A30: 4).
        memory_slices: memory slices of the whole GPU (8; A30: 4).
        profiles: ordered by compute slices, memory slices, then name.
        source: ``"catalog"`` (this module) or ``"nvml"`` (read from a device).

    Hashable, so it can key caches; two tables are equal when all their figures are.
    """

    model: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]
    source: str = "catalog"

    def names(self, *, media: bool = True) -> list[str]:
        """Profile names in table order; ``media=False`` leaves out ``+me`` profiles."""
        return [p.name for p in self.profiles if media or not p.media]

    def find(self, name: str) -> MigProfile | None:
        """The profile called ``name`` (case-insensitive), or None."""
        key = name.strip().lower()
        for profile in self.profiles:
            if profile.name == key:
                return profile
        return None

    def get(self, name: str, field: str = "profile") -> MigProfile:
        """The profile called ``name`` (case-insensitive).

        Raises:
            UnknownMigProfileError: the model has no such profile (lists the valid ones).
        """
        found = self.find(name)
        if found is None:
            raise UnknownMigProfileError(name, self.model, self.names(), field)
        return found


def _profile(
    name: str,
    profile_id: int,
    compute: int,
    memory: int,
    gib_x100: int,
    sms: int,
    max_count: int,
    starts: tuple[int, ...],
) -> MigProfile:
    """A catalog entry; memory is given as ``nvidia-smi`` prints it, GiB x 100 (``975`` =
    9.75 GiB). Instance memory is a multiple of 1/16 GiB (64 MiB) that ``nvidia-smi`` rounds
    to two decimals, so the MiB figure is the nearest such multiple: 5.81 GiB -> 5952 MiB,
    what NVML reports for an A30 ``1g.6gb``."""
    sixteenths = (gib_x100 * 16 + 50) // 100
    return MigProfile(name, profile_id, compute, memory, sixteenths * 64, sms, max_count, starts)


_ALL7 = (0, 1, 2, 3, 4, 5, 6)
_EVEN4 = (0, 2, 4, 6)
_EVEN3 = (0, 2, 4)
_HALVES = (0, 4)
_ZERO = (0,)


def _eight_slice(
    model: str,
    names: tuple[str, str, str, str, str, str],
    gib: tuple[int, ...],
    sms: tuple[int, ...],
) -> MigProfileTable:
    """A100 / H100 / H200 geometry: 8 memory and 7 compute slices, the same ids and starts.

    ``names`` are 1g, 1g double memory, 2g, 3g, 4g, 7g; ``gib`` and ``sms`` follow the same
    order for 1g, 1g double, 2g, 3g, 4g, 7g (the ``+me`` 1g has the 1g figures).
    """
    one, one_double, two, three, four, seven = names
    return MigProfileTable(
        model,
        7,
        8,
        (
            _profile(one, 19, 1, 1, gib[0], sms[0], 7, _ALL7),
            _profile(one + MEDIA_SUFFIX, 20, 1, 1, gib[0], sms[0], 1, _ALL7),
            _profile(one_double, 15, 1, 2, gib[1], sms[1], 4, _EVEN4),
            _profile(two, 14, 2, 2, gib[2], sms[2], 3, _EVEN3),
            _profile(three, 9, 3, 4, gib[3], sms[3], 2, _HALVES),
            _profile(four, 5, 4, 4, gib[4], sms[4], 1, _ZERO),
            _profile(seven, 0, 7, 8, gib[5], sms[5], 1, _ZERO),
        ),
    )


_TABLES: tuple[MigProfileTable, ...] = (
    MigProfileTable(
        "A30",
        4,
        4,
        (
            _profile("1g.6gb", 14, 1, 1, 581, 14, 4, (0, 1, 2, 3)),
            _profile("1g.6gb+me", 21, 1, 1, 581, 14, 1, (0, 1, 2, 3)),
            _profile("2g.12gb", 5, 2, 2, 1169, 28, 2, (0, 2)),
            _profile("2g.12gb+me", 6, 2, 2, 1169, 28, 1, (0, 2)),
            _profile("4g.24gb", 0, 4, 4, 2350, 56, 1, _ZERO),
        ),
    ),
    _eight_slice(
        "A100-40GB",
        ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (475, 962, 962, 1950, 1950, 3925),
        (14, 14, 28, 42, 56, 98),
    ),
    _eight_slice(
        "A100-80GB",
        ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (950, 1950, 1950, 3925, 3925, 7900),
        (14, 14, 28, 42, 56, 98),
    ),
    _eight_slice(
        "H100-80GB",
        ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (975, 1962, 1962, 3950, 3950, 7925),
        (16, 26, 32, 60, 64, 132),
    ),
    _eight_slice(
        "H200-141GB",
        ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        (1600, 3250, 3250, 6975, 6975, 14000),
        (16, 26, 32, 60, 64, 132),
    ),
)

MIG_TABLES: dict[str, MigProfileTable] = {t.model: t for t in _TABLES}
"""Catalog model name -> its MIG profile table."""

MIG_MODELS: tuple[str, ...] = tuple(t.model for t in _TABLES)
"""The MIG-capable models fgpu knows, in catalog order."""


def mig_profiles(model: str, field: str = "gpu_model") -> MigProfileTable:
    """The catalog's MIG profile table of ``model`` (canonical name or alias).

    Raises:
        UnknownGpuModelError: the name is not a GPU model of :mod:`fgpu.model.catalog`.
        NotMigCapableError: the model has no MIG profiles (e.g. ``T4``).
    """
    name = canonical_name(model)
    table = MIG_TABLES.get(name)
    if table is None:
        raise NotMigCapableError(name, field)
    return table


def instance_milli(table: MigProfileTable, profile: MigProfile) -> int:
    """Milli-GPU a MIG instance counts against its queue: ``1000 * compute slices // the
    GPU's compute slices``, rounded down so that the instances of a GPU never add up to more
    than 1000 (seven 1g instances of an A100 are 7 x 142 = 994)."""
    return MILLI_PER_GPU * profile.compute_slices // table.compute_slices


def check_catalog() -> None:
    """Assert the catalog agrees with :mod:`fgpu.model.catalog` (MIG flag) and itself
    (starts inside the GPU, ids unique); for tests.

    Raises:
        AssertionError: an inconsistency, named.
    """
    for table in _TABLES:
        model = GPU_CATALOG.get(table.model)
        if model is None or not model.mig_capable:
            raise AssertionError(f"{table.model}: not a MIG-capable catalog model")
        ids = [p.profile_id for p in table.profiles]
        if len(set(ids)) != len(ids):
            raise AssertionError(f"{table.model}: duplicate profile ids {ids}")
        for p in table.profiles:
            if p.starts != tuple(sorted(set(p.starts))):
                raise AssertionError(f"{table.model} {p.name}: starts not ascending")
            if p.starts[-1] + p.memory_slices > table.memory_slices:
                raise AssertionError(f"{table.model} {p.name}: a start runs past the GPU")
            if p.memory_mib > model.memory_mib:
                raise AssertionError(f"{table.model} {p.name}: more memory than the GPU")


__all__ = [
    "MEDIA_SUFFIX",
    "MIG_MODELS",
    "MIG_TABLES",
    "MigProfile",
    "MigProfileTable",
    "NotMigCapableError",
    "UnknownGpuModelError",
    "UnknownMigProfileError",
    "check_catalog",
    "mig_profiles",
]
