"""Plans as files: fgpu's plan JSON, and mig-parted v1 configs (write and read).

**Plan JSON** (``fgpu mig plan --json``; what ``fgpu mig apply`` reads back): ``kind``
``"fgpu-mig-plan"``, ``version`` 1, the totals, ``gpus`` (per GPU ``index``, ``model``,
``mig_enabled``, ``enable_mig``, ``changed``, ``before``, ``destroy``, ``create``, ``after``,
``assignments``, ``explanation``), ``unserved`` (``request``, ``count``, ``reason``; empty
when all fits) and ``explanation``.

**mig-parted v1** (NVIDIA mig-parted, ``api/spec/v1``): ``version: v1`` and ``mig-configs``,
a map from config name to a list of entries with ``devices`` (``all`` or GPU indices),
``mig-enabled``, ``mig-devices`` (profile -> count; required when enabled, empty or absent
when not) and optionally ``device-filter``; no other keys. A config lists whole layouts, not
changes: ``nvidia-mig-parted apply`` rebuilds every GPU whose layout differs, evicting the
work on it, in-use instances included. The exported file says so in a comment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fgpu.mig.catalog import NotMigCapableError, UnknownGpuModelError, mig_profiles
from fgpu.mig.device import MigDevice, gpu_from_device
from fgpu.mig.inventory import MigInputError, MigInstanceState
from fgpu.mig.layout import Placement, is_valid, layout_text, make_layout
from fgpu.mig.planner import GpuPlan, MigPlan, plan_layout

PLAN_KIND = "fgpu-mig-plan"
PLAN_VERSION = 1
MIG_PARTED_KEYS = frozenset({"device-filter", "devices", "mig-enabled", "mig-devices"})
"""The keys of a mig-parted v1 entry (NVIDIA mig-parted ``api/spec/v1/spec.go``)."""


# --- plan JSON -----------------------------------------------------------------------------


def _instance(i: MigInstanceState) -> dict[str, Any]:
    return {"profile": i.profile, "start": i.start, "in_use": i.in_use, "uuid": i.uuid}


def _placement(p: Placement) -> dict[str, Any]:
    return {"profile": p.profile, "start": p.start}


def plan_to_data(plan: MigPlan) -> dict[str, Any]:
    """The plan as JSON-able data (shape in the module docstring)."""
    return {
        "kind": PLAN_KIND,
        "version": PLAN_VERSION,
        "requested": plan.requested,
        "served": plan.served,
        "changed_gpus": plan.changed_gpus,
        "wasted_slices": plan.wasted_slices,
        "operations": plan.operations,
        "future_options": plan.future_options,
        "exact": plan.exact,
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "mig_enabled": g.mig_enabled,
                "enable_mig": g.enable_mig,
                "changed": g.changed,
                "before": [_instance(i) for i in g.before],
                "destroy": [_instance(i) for i in g.destroy],
                "create": [_placement(p) for p in g.create],
                "after": [_placement(p) for p in g.after],
                "assignments": [
                    {
                        "request": a.request,
                        "profile": a.profile,
                        "start": a.start,
                        "new": a.new,
                        "uuid": a.uuid,
                        "waste": a.waste,
                    }
                    for a in g.assignments
                ],
                "explanation": list(g.explanation),
            }
            for g in plan.gpus
        ],
        "unserved": [
            {"request": u.request, "count": u.count, "reason": u.reason} for u in plan.unserved
        ],
        "explanation": list(plan.explanation),
    }


def plan_to_json(plan: MigPlan) -> str:
    return json.dumps(plan_to_data(plan), indent=2)


def _field(item: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in item:
        raise MigInputError(f"{where}.{key}", "missing")
    value = item[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise MigInputError(f"{where}.{key}", f"expected an integer >= 0, got {value!r}")
    if not isinstance(value, kind):
        raise MigInputError(f"{where}.{key}", f"expected {kind.__name__}, got {value!r}")
    return value


def _list(item: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    value = item.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise MigInputError(f"{where}.{key}", "expected a list of objects")
    return value


def _states(item: Mapping[str, Any], key: str, where: str) -> tuple[MigInstanceState, ...]:
    out = []
    for number, raw in enumerate(_list(item, key, where)):
        at = f"{where}.{key}[{number}]"
        uuid = raw.get("uuid")
        out.append(
            MigInstanceState(
                _field(raw, "profile", str, at),
                _field(raw, "start", int, at),
                bool(raw.get("in_use", False)),
                uuid if isinstance(uuid, str) else None,
            )
        )
    return tuple(out)


def gpu_plans_from_data(data: Any, field: str = "plan") -> list[GpuPlan]:
    """Read the per-GPU part of a plan JSON back, checking it.

    Raises:
        MigInputError: not an fgpu plan, a missing or mistyped field, a destroy that is not
            in ``before``, an instance in use marked for destroying, or a resulting layout
            that is not valid (overlap, bad start, unknown profile); the field is named
            (``plan.gpus[0].create``).
    """
    if not isinstance(data, Mapping) or data.get("kind") != PLAN_KIND:
        raise MigInputError(field, f"not an fgpu MIG plan (expected kind {PLAN_KIND!r})")
    if data.get("version") != PLAN_VERSION:
        raise MigInputError(f"{field}.version", f"expected {PLAN_VERSION}")
    plans: list[GpuPlan] = []
    for position, item in enumerate(_list(data, "gpus", field)):
        where = f"{field}.gpus[{position}]"
        model = _field(item, "model", str, where)
        try:
            table = mig_profiles(model)
        except (UnknownGpuModelError, NotMigCapableError) as exc:
            raise MigInputError(f"{where}.model", str(exc).split(": ", 1)[-1]) from None

        before = _states(item, "before", where)
        destroy = _states(item, "destroy", where)
        create = tuple(
            Placement(
                _field(raw, "start", int, f"{where}.create[{n}]"),
                _field(raw, "profile", str, f"{where}.create[{n}]"),
            )
            for n, raw in enumerate(_list(item, "create", where))
        )
        held = {b.placement: b for b in before}
        for number, d in enumerate(destroy):
            if d.placement not in held:
                raise MigInputError(
                    f"{where}.destroy[{number}]", f"{d.placement} is not in 'before'"
                )
            if held[d.placement].in_use:
                raise MigInputError(
                    f"{where}.destroy[{number}]", f"{d.placement} is in use; it is never destroyed"
                )
        for key, layout in (
            ("before", make_layout(b.placement for b in before)),
            (
                "create",
                make_layout(
                    [*(p for p in held if p not in {d.placement for d in destroy}), *create]
                ),
            ),
        ):
            status = is_valid(table, layout)
            if not status:
                raise MigInputError(f"{where}.{key}", f"GPU {item.get('index')}: {status.reason}")
        plans.append(
            GpuPlan(
                _field(item, "index", int, where),
                table.model,
                bool(item.get("mig_enabled", True)),
                bool(item.get("enable_mig", False)),
                before,
                tuple(held[d.placement] for d in destroy),
                create,
                (),
            )
        )
    indexes = [p.index for p in plans]
    if len(set(indexes)) != len(indexes):
        raise MigInputError(f"{field}.gpus", "a GPU index appears twice")
    return plans


# --- mig-parted ----------------------------------------------------------------------------


def to_mig_parted(plan: MigPlan, config_name: str = "fgpu") -> str:
    """A mig-parted v1 config whose one config, ``config_name``, gives every GPU of the plan
    its final layout. GPUs with the same final layout share an entry (``devices: [0, 2]``).

    Returns:
        YAML text, starting with comments that name the GPUs whose layout changes (which
        ``nvidia-mig-parted apply`` rebuilds whole).
    """
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for g in plan.gpus:
        counts: dict[str, int] = {}
        for p in g.after:
            counts[p.profile] = counts.get(p.profile, 0) + 1
        key = (g.mig_enabled_after, tuple(sorted(counts.items())))
        groups.setdefault(key, []).append(g.index)
    changed = [g for g in plan.gpus if g.changed]
    lines = [
        "# mig-parted v1 config written by `fgpu mig plan`.",
        "# nvidia-mig-parted rebuilds every GPU whose layout changes, evicting its work;",
    ]
    if changed:
        busy = [g.index for g in changed if any(b.in_use for b in g.before)]
        lines.append(
            "# changed here: GPU "
            + ", ".join(str(g.index) for g in changed)
            + (f" (GPU {', '.join(map(str, busy))} has instances in use:" if busy else "")
        )
        if busy:
            lines.append("#   apply with `fgpu mig apply` to keep them)")
    else:
        lines.append("# no GPU changes.")
    lines += ["version: v1", "mig-configs:", f"  {json.dumps(config_name)}:"]
    for (enabled, counts_items), indexes in sorted(groups.items(), key=lambda kv: kv[1]):
        lines.append(f"    - devices: [{', '.join(str(i) for i in indexes)}]")
        lines.append(f"      mig-enabled: {'true' if enabled else 'false'}")
        if enabled:
            if counts_items:
                lines.append("      mig-devices:")
                lines += [f"        {json.dumps(name)}: {n}" for name, n in counts_items]
            else:
                lines.append("      mig-devices: {}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class MigPartedEntry:
    """One entry of a mig-parted config: ``devices`` is ``"all"`` or GPU indices."""

    devices: str | tuple[int, ...]
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]
    device_filter: tuple[str, ...] = ()


def parse_mig_parted(
    data: Any, config_name: str | None = None, field: str = "config"
) -> list[MigPartedEntry]:
    """Check parsed YAML against the mig-parted v1 spec and return the entries of one config.

    Args:
        data: ``yaml.safe_load`` of the file.
        config_name: which config; may be left out when the file has only one.
        field: how errors name the file.

    Raises:
        MigInputError: wrong version, unknown or missing keys, wrong types, MIG devices on a
            GPU with MIG off, or an unknown or ambiguous config name.
    """
    if not isinstance(data, Mapping):
        raise MigInputError(field, "expected a mig-parted v1 config (version, mig-configs)")
    extra = sorted(set(data) - {"version", "mig-configs"})
    if extra:
        raise MigInputError(f"{field}.{extra[0]}", "unexpected field")
    if data.get("version") != "v1":
        raise MigInputError(f"{field}.version", f"expected 'v1', got {data.get('version')!r}")
    configs = data.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise MigInputError(f"{field}.mig-configs", "expected at least one config")
    names = sorted(str(n) for n in configs)
    if config_name is None:
        if len(configs) != 1:
            raise MigInputError(
                "--config-name", f"the file has several configs; choose one of {', '.join(names)}"
            )
        config_name = next(iter(configs))
    if config_name not in configs:
        raise MigInputError(
            "--config-name", f"no config {config_name!r}; the file has {', '.join(names)}"
        )
    entries = configs[config_name]
    where = f"{field}.mig-configs.{config_name}"
    if not isinstance(entries, list) or not entries:
        raise MigInputError(where, "expected a list with at least one entry")
    out: list[MigPartedEntry] = []
    for number, entry in enumerate(entries):
        at = f"{where}[{number}]"
        if not isinstance(entry, Mapping):
            raise MigInputError(at, "expected an object")
        unknown = sorted(set(entry) - MIG_PARTED_KEYS)
        if unknown:
            raise MigInputError(f"{at}.{unknown[0]}", "unexpected field")
        for key in ("devices", "mig-enabled"):
            if key not in entry:
                raise MigInputError(f"{at}.{key}", "missing required field")
        devices = entry["devices"]
        if devices != "all" and not (
            isinstance(devices, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
        ):
            raise MigInputError(
                f"{at}.devices", f"expected 'all' or a list of GPU indices, got {devices!r}"
            )
        enabled = entry["mig-enabled"]
        if not isinstance(enabled, bool):
            raise MigInputError(f"{at}.mig-enabled", f"expected true or false, got {enabled!r}")
        mig_devices = entry.get("mig-devices")
        if enabled and mig_devices is None:
            raise MigInputError(f"{at}.mig-devices", "required when mig-enabled is true")
        if mig_devices is None:
            mig_devices = {}
        if not isinstance(mig_devices, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in mig_devices.items()
        ):
            raise MigInputError(f"{at}.mig-devices", "expected profile names with counts >= 0")
        if not enabled and any(mig_devices.values()):
            raise MigInputError(f"{at}.mig-devices", "MIG devices given while mig-enabled is false")
        device_filter = entry.get("device-filter", ())
        if isinstance(device_filter, str):
            device_filter = (device_filter,)
        out.append(
            MigPartedEntry(
                "all" if devices == "all" else tuple(devices),
                enabled,
                tuple(sorted(mig_devices.items())),
                tuple(str(f) for f in device_filter),
            )
        )
    return out


def plans_from_mig_parted(
    entries: Sequence[MigPartedEntry], devices: Sequence[MigDevice], field: str = "config"
) -> list[GpuPlan]:
    """Per-GPU plans that give each selected device exactly the config's layout, keeping its
    in-use instances and as many idle ones as fit (:func:`fgpu.mig.planner.plan_layout`).

    Raises:
        MigInputError: ``device-filter`` (not supported here), a device index that is not
            on the machine, a GPU selected by two entries, a MIG mode change, or a layout that
            cannot be made without destroying an instance in use.
    """
    by_index = {d.index: d for d in devices}
    chosen: dict[int, tuple[int, MigPartedEntry]] = {}
    for number, entry in enumerate(entries):
        at = f"{field}[{number}]"
        if entry.device_filter:
            raise MigInputError(
                f"{at}.device-filter", "not supported by fgpu mig apply; use GPU indices"
            )
        indexes = sorted(by_index) if entry.devices == "all" else list(entry.devices)
        for index in indexes:
            if index not in by_index:
                known = ", ".join(str(i) for i in sorted(by_index)) or "none"
                raise MigInputError(
                    f"{at}.devices", f"GPU {index} is not on this machine (GPUs: {known})"
                )
            if index in chosen:
                raise MigInputError(
                    f"{at}.devices", f"GPU {index} is also in entry {chosen[index][0]}"
                )
            chosen[index] = (number, entry)
    plans: list[GpuPlan] = []
    for index in sorted(chosen):
        number, entry = chosen[index]
        device = by_index[index]
        at = f"{field}[{number}]"
        if entry.mig_enabled != device.mig_enabled():
            raise MigInputError(
                f"{at}.mig-enabled",
                f"GPU {index} has MIG mode {'on' if device.mig_enabled() else 'off'}; fgpu does "
                f"not change MIG modes: use `nvidia-smi -i {index} -mig "
                f"{1 if entry.mig_enabled else 0}` as root first",
            )
        if not entry.mig_enabled:
            continue
        plans.append(
            plan_layout(gpu_from_device(device), dict(entry.mig_devices), f"{at}.mig-devices")
        )
    return plans


def load_plan_file(text: str, name: str) -> tuple[str, Any]:
    """Parse a file for ``fgpu mig apply``: ``("plan", data)`` for an fgpu plan JSON,
    ``("mig-parted", data)`` for a mig-parted config.

    Raises:
        MigInputError: not YAML/JSON, or neither kind.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigInputError(name, f"not YAML or JSON: {exc}") from None
    if isinstance(data, Mapping) and data.get("kind") == PLAN_KIND:
        return "plan", data
    if isinstance(data, Mapping) and "mig-configs" in data:
        return "mig-parted", data
    raise MigInputError(
        name, f"neither an fgpu MIG plan (kind {PLAN_KIND!r}) nor a mig-parted config (mig-configs)"
    )


def describe(plans: Sequence[GpuPlan]) -> list[str]:
    """One line per changed GPU: ``GPU 0: destroy ...; create ... -> layout``."""
    lines = []
    for g in plans:
        if not g.changed:
            continue
        steps = [f"destroy {d.profile}@{d.start}" for d in g.destroy]
        steps += [f"create {c}" for c in g.create]
        lines.append(f"GPU {g.index} ({g.model}): {'; '.join(steps)} -> {layout_text(g.after)}")
    return lines
