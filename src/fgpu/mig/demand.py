"""MIG demand: requests for instances, and which profiles can serve each on a GPU model.

A request is one of (DESIGN.md section 4 units):

- a **profile** by name (``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``): only that profile serves
  it, on models that have a profile of that name;
- a **fraction** of a GPU in milli-GPU (``0.25`` -> 250): any profile without media engines
  whose compute *and* memory slices are each at least that share of the GPU's
  (``compute_slices * 1000 >= milli * 7`` and ``memory_slices * 1000 >= milli * 8`` on an
  A100): ``0.25`` -> ``2g.20gb`` on an A100-80GB, ``0.5`` -> ``4g.40gb``;
- a **memory** size in MiB (``20GiB``): any profile without media engines with at least that
  much memory as the device reports it (a ``1g.20gb`` reports 19.5 GiB, so ``20GiB`` needs a
  ``3g.40gb``; ask ``19GiB`` for a ``1g.20gb``).

The **smallest fitting profile** of a fraction or memory request on a model is the fitting one
with the fewest compute plus memory slices (then least memory, then lowest profile id). A
larger fitting profile may serve it too; the planner counts the extra compute and memory
slices as **waste**.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fgpu.mig.catalog import MigProfile, MigProfileTable
from fgpu.mig.inventory import MigInputError
from fgpu.model.units import UnitError, format_mib, parse_gpu_fraction, parse_memory_mib

_PROFILE = re.compile(r"^\d+g\.\d+gb(\+me)?$", re.IGNORECASE)
_COUNT = re.compile(r"^(?P<count>\d+)\s*[xX]\s*(?P<item>\S.*)$")
_HAS_UNIT = re.compile(r"[A-Za-z]\s*$")


@dataclass(frozen=True, slots=True)
class MigRequest:
    """``count`` instances wanted for one kind of request.

    Exactly one of ``profile``, ``compute_milli``, ``memory_mib`` is set.

    Attributes:
        profile: a profile name, lower case.
        compute_milli: a GPU fraction in milli-GPU, 1..1000.
        memory_mib: device memory in MiB.
        count: how many instances, >= 1.
    """

    profile: str | None = None
    compute_milli: int | None = None
    memory_mib: int | None = None
    count: int = 1

    def __post_init__(self) -> None:
        given = [v for v in (self.profile, self.compute_milli, self.memory_mib) if v is not None]
        if len(given) != 1:
            raise ValueError("a MIG request has exactly one of profile, compute_milli, memory_mib")
        if self.count < 1:
            raise ValueError(f"a MIG request count must be >= 1, got {self.count}")

    @property
    def text(self) -> str:
        """The request as a user writes it, without the count: ``1g.10gb``, ``0.25``,
        ``20GiB``."""
        if self.profile is not None:
            return self.profile
        if self.compute_milli is not None:
            return f"{self.compute_milli / 1000:.3f}".rstrip("0").rstrip(".")
        assert self.memory_mib is not None
        return format_mib(self.memory_mib)

    @property
    def key(self) -> tuple[str, str]:
        """Requests with the same key are interchangeable."""
        if self.profile is not None:
            return ("profile", self.profile)
        if self.compute_milli is not None:
            return ("fraction", str(self.compute_milli))
        return ("memory", str(self.memory_mib))

    def __str__(self) -> str:
        return f"{self.count}x{self.text}" if self.count > 1 else self.text


def parse_demand(spec: str, field: str = "--demand") -> list[MigRequest]:
    """Parse ``"3x1g.10gb,2x3g.40gb,0.25,2x20GiB"``: comma-separated ``[COUNTx]ITEM`` where
    ITEM is a profile name, a GPU fraction in (0, 1], or a memory size with a unit.

    Raises:
        MigInputError: empty spec or part, a count that is not a positive integer, a
            malformed fraction or memory size (the message names ``field`` and the part).
    """
    if not spec.strip():
        raise MigInputError(field, "empty; expected e.g. '3x1g.10gb,2x3g.40gb'")
    requests: list[MigRequest] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            raise MigInputError(field, f"empty part in {spec!r}")
        count = 1
        item = part
        match = _COUNT.match(part)
        if match is not None:
            count = int(match.group("count"))
            item = match.group("item").strip()
            if count < 1:
                raise MigInputError(field, f"count must be positive in {part!r}")
        requests.append(_parse_item(item, count, field, part))
    return requests


def _parse_item(item: str, count: int, field: str, part: str) -> MigRequest:
    if _PROFILE.match(item):
        return MigRequest(profile=item.lower(), count=count)
    try:
        if _HAS_UNIT.search(item):
            return MigRequest(memory_mib=parse_memory_mib(item, field), count=count)
        return MigRequest(compute_milli=parse_gpu_fraction(item, field), count=count)
    except UnitError as exc:
        raise MigInputError(
            field,
            f"{part!r}: {exc.reason}; an item is a profile (1g.10gb), a GPU fraction (0.25) "
            "or a memory size (20GiB)",
        ) from None


def _size(profile: MigProfile) -> tuple[int, int, int]:
    return (profile.compute_slices + profile.memory_slices, profile.memory_mib, profile.profile_id)


def fitting_profiles(table: MigProfileTable, request: MigRequest) -> tuple[tuple[str, int], ...]:
    """The profiles of ``table`` that can serve ``request``, each with its waste in slices
    (compute plus memory slices above the smallest fitting profile's), smallest first.

    Empty when none fits (or a named profile is not the model's).
    """
    if request.profile is not None:
        found = table.find(request.profile)
        return ((found.name, 0),) if found is not None else ()
    fits: list[MigProfile] = []
    for profile in table.profiles:
        if profile.media:
            continue
        if request.compute_milli is not None:
            milli = request.compute_milli
            if (
                profile.compute_slices * 1000 >= milli * table.compute_slices
                and profile.memory_slices * 1000 >= milli * table.memory_slices
            ):
                fits.append(profile)
        elif request.memory_mib is not None and profile.memory_mib >= request.memory_mib:
            fits.append(profile)
    if not fits:
        return ()
    fits.sort(key=_size)
    least = fits[0].compute_slices + fits[0].memory_slices
    return tuple((p.name, p.compute_slices + p.memory_slices - least) for p in fits)


def smallest_fitting(table: MigProfileTable, request: MigRequest) -> str | None:
    """The name of the smallest profile that serves ``request`` on ``table``, or None."""
    fits = fitting_profiles(table, request)
    return fits[0][0] if fits else None
