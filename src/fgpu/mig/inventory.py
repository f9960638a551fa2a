"""What the MIG planner is given about the GPUs: model, MIG mode, current instances.

Plain values; the planner never reads a device. A service builds them from its GPU backend
(:class:`fgpu.mig.device.MigDevice` ``instances()``), the CLI from ``--gpus 2xA100-80GB``
(empty GPUs with MIG on) or an inventory file (:func:`inventory_from_data`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fgpu.mig.catalog import (
    MigProfileTable,
    NotMigCapableError,
    UnknownGpuModelError,
    UnknownMigProfileError,
    mig_profiles,
)
from fgpu.mig.layout import Layout, Placement, is_valid, make_layout


class MigInputError(ValueError):
    """Input the planner or ``fgpu mig`` cannot use; the message starts with the field.

    Attributes:
        field: where the problem is (``"--demand"``, ``"gpus[1].instances"``).
        reason: what is wrong, fit to show as it is.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True, slots=True)
class MigInstanceState:
    """A GPU instance that exists now.

    Attributes:
        profile: profile name (``"3g.40gb"``).
        start: first memory slice.
        in_use: a workload uses it; the planner never destroys it.
        uuid: the MIG device uuid (``MIG-...``) when known.
    """

    profile: str
    start: int
    in_use: bool = False
    uuid: str | None = None

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.profile)

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}" + (" (in use)" if self.in_use else "")


@dataclass(frozen=True, slots=True)
class MigGpu:
    """One GPU as the planner sees it.

    Attributes:
        index: the GPU's index on its node (NVML index); unique in an inventory.
        model: catalog model name or alias (``"A100-80GB"``).
        mig_enabled: MIG mode is on. A GPU with MIG off holds no instances; the planner may
            plan to enable MIG on it (unless ``in_use``).
        instances: its GPU instances now.
        in_use: with MIG off: a workload uses the whole GPU, so it is left alone.
        table: the profile table read from the device (it wins over the catalog); None uses
            :func:`fgpu.mig.catalog.mig_profiles`.
    """

    index: int
    model: str
    mig_enabled: bool = True
    instances: tuple[MigInstanceState, ...] = ()
    in_use: bool = False
    table: MigProfileTable | None = None

    def profiles(self) -> MigProfileTable:
        """The device's table when given, else the catalog's."""
        return self.table if self.table is not None else mig_profiles(self.model)

    def layout(self) -> Layout:
        return make_layout(i.placement for i in self.instances)


def check_inventory(gpus: Sequence[MigGpu], field: str = "gpus") -> None:
    """Check an inventory before planning.

    Raises:
        MigInputError: duplicate GPU index, a model without MIG, a GPU with MIG off that has
            instances, an unknown profile, or a layout that is not valid (overlap, bad
            start, too many) - the field names the GPU (``gpus[1].instances``).
    """
    seen: set[int] = set()
    for position, gpu in enumerate(gpus):
        where = f"{field}[{position}]"
        if gpu.index in seen:
            raise MigInputError(f"{where}.index", f"GPU index {gpu.index} appears twice")
        seen.add(gpu.index)
        try:
            table = gpu.profiles()
        except (UnknownGpuModelError, NotMigCapableError) as exc:
            raise MigInputError(f"{where}.model", _reason(exc)) from None
        if not gpu.mig_enabled and gpu.instances:
            raise MigInputError(
                f"{where}.instances", f"GPU {gpu.index} has MIG off, so it cannot hold instances"
            )
        for number, instance in enumerate(gpu.instances):
            if table.find(instance.profile) is None:
                error = UnknownMigProfileError(instance.profile, table.model, table.names())
                raise MigInputError(f"{where}.instances[{number}].profile", _reason(error))
        status = is_valid(table, gpu.layout())
        if not status:
            raise MigInputError(f"{where}.instances", f"GPU {gpu.index}: {status.reason}")


def _reason(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if ": " in text else text


_SPEC_PART = re.compile(r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<model>\S.*)$")


MAX_PLAN_GPUS = 1024
"""Most GPUs one plan takes (a node has at most 64; a plan spans a few nodes)."""


def parse_gpu_spec(spec: str, field: str = "--gpus") -> list[MigGpu]:
    """``"2xA100-80GB,1xH100-80GB"`` -> empty GPUs with MIG on, indexed from 0.

    Raises:
        MigInputError: empty spec or part, a count that is not a positive integer, more than
            :data:`MAX_PLAN_GPUS` GPUs, or a model that is unknown or has no MIG profiles
            (the message lists the MIG models).
    """
    if not spec.strip():
        raise MigInputError(field, "empty; expected e.g. '2xA100-80GB'")
    gpus: list[MigGpu] = []
    for raw in spec.split(","):
        part = raw.strip()
        match = _SPEC_PART.match(part)
        if not part or match is None:
            raise MigInputError(field, f"empty part in {spec!r}; expected e.g. '2xA100-80GB'")
        count = int(match.group("count") or 1)
        if count <= 0:
            raise MigInputError(field, f"GPU count must be positive in {part!r}")
        if len(gpus) + count > MAX_PLAN_GPUS:
            raise MigInputError(
                field, f"more than {MAX_PLAN_GPUS} GPUs in {spec[:80]!r}; plan fewer at a time"
            )
        try:
            table = mig_profiles(match.group("model").strip())
        except (UnknownGpuModelError, NotMigCapableError) as exc:
            raise MigInputError(field, _reason(exc)) from None
        for _ in range(count):
            gpus.append(MigGpu(len(gpus), table.model))
    return gpus


def inventory_from_data(data: Any, field: str = "inventory") -> list[MigGpu]:
    """An inventory from parsed JSON/YAML:
    ``{"gpus": [{"index": 0, "model": "A100-80GB", "mig_enabled": true, "in_use": false,
    "instances": [{"profile": "3g.40gb", "start": 0, "in_use": true, "uuid": "MIG-..."}]}]}``.

    ``index`` defaults to the position, ``mig_enabled`` to true, ``in_use`` to false.

    Raises:
        MigInputError: a missing or mistyped field, or what :func:`check_inventory` finds.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), list):
        raise MigInputError(field, "expected an object with a 'gpus' list")
    gpus: list[MigGpu] = []
    for position, item in enumerate(data["gpus"]):
        where = f"{field}.gpus[{position}]"
        if not isinstance(item, Mapping):
            raise MigInputError(where, "expected an object")
        _only(item, {"index", "model", "mig_enabled", "in_use", "instances"}, where)
        instances: list[MigInstanceState] = []
        raw_instances = item.get("instances", [])
        if not isinstance(raw_instances, list):
            raise MigInputError(f"{where}.instances", "expected a list")
        for number, raw in enumerate(raw_instances):
            at = f"{where}.instances[{number}]"
            if not isinstance(raw, Mapping):
                raise MigInputError(at, "expected an object")
            _only(raw, {"profile", "start", "in_use", "uuid"}, at)
            instances.append(
                MigInstanceState(
                    _typed(raw, "profile", str, at),
                    _typed(raw, "start", int, at),
                    _typed(raw, "in_use", bool, at, False),
                    _typed(raw, "uuid", str, at, None),
                )
            )
        gpus.append(
            MigGpu(
                _typed(item, "index", int, where, position),
                _typed(item, "model", str, where),
                _typed(item, "mig_enabled", bool, where, True),
                tuple(instances),
                _typed(item, "in_use", bool, where, False),
            )
        )
    check_inventory(gpus, f"{field}.gpus")
    return gpus


def inventory_to_data(gpus: Sequence[MigGpu]) -> dict[str, Any]:
    """The JSON-able form :func:`inventory_from_data` reads."""
    return {
        "gpus": [
            {
                "index": g.index,
                "model": g.profiles().model,
                "mig_enabled": g.mig_enabled,
                "in_use": g.in_use,
                "instances": [
                    {"profile": i.profile, "start": i.start, "in_use": i.in_use, "uuid": i.uuid}
                    for i in g.instances
                ],
            }
            for g in gpus
        ]
    }


def _only(item: Mapping[str, Any], keys: set[str], where: str) -> None:
    extra = sorted(set(item) - keys)
    if extra:
        raise MigInputError(
            f"{where}.{extra[0]}", f"unknown field; expected: {', '.join(sorted(keys))}"
        )


_MISSING = object()


def _typed(
    item: Mapping[str, Any], key: str, kind: type, where: str, default: Any = _MISSING
) -> Any:
    value = item.get(key, _MISSING)
    if value is _MISSING or (value is None and default is None):
        if default is _MISSING:
            raise MigInputError(f"{where}.{key}", "missing")
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise MigInputError(f"{where}.{key}", f"expected an integer, got {value!r}")
    if not isinstance(value, kind):
        raise MigInputError(f"{where}.{key}", f"expected {kind.__name__}, got {value!r}")
    if kind is int and isinstance(value, int) and value < 0:
        raise MigInputError(f"{where}.{key}", f"must be >= 0, got {value}")
    return value
