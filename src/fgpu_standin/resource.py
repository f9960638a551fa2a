"""``resource.k8s.io/v1`` (Dynamic Resource Allocation) in the API server stand-in.

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

Served: DeviceClass and ResourceSlice (cluster-scoped), ResourceClaim (with a ``status``
subresource) and ResourceClaimTemplate (namespaced), as Kubernetes 1.34 to 1.36 serve them
(as 1.36 where they differ: a request's ``count: 0`` reads as unset and is defaulted to 1,
a device capacity without a ``value`` is stored as ``0``). The
checks are those of the API server's validation for these kinds (``pkg/apis/resource/
validation``) that fgpu's components and users meet; messages are worded as the API server
words them (``ResourceClaim.resource.k8s.io "x" is invalid: spec.devices.requests[0].name:
Required value``; values quoted as Go's ``%q`` quotes them):

- names: DNS subdomains for objects, DNS labels for devices and requests; drivers DNS
  subdomains of at most 63 characters;
- ResourceSlice: ``spec.driver``, ``spec.pool.name``, ``spec.pool.resourceSliceCount > 0``,
  exactly one of ``nodeName``, ``nodeSelector``, ``allNodes``, ``perDeviceNodeSelection``;
  at most 128 devices with unique names, each attribute exactly one of ``int``, ``bool``,
  ``string`` (at most 64 characters), ``version``; at most 32 attributes and capacities
  together per device; ``spec.driver`` and ``spec.nodeName`` immutable;
- ResourceClaim and the template's ``spec.spec``: at most 32 requests with unique names,
  each exactly one of ``exactly`` and ``firstAvailable``; ``exactly.deviceClassName``
  required; ``allocationMode`` ``ExactCount`` (default, ``count`` at least 1, default 1) or
  ``All`` (no ``count``); config entries name existing requests and hold ``opaque``
  ``driver`` and ``parameters``; the claim's spec is immutable;
- ResourceClaim status: every allocation result names a request of the spec, a driver, a
  pool and a device; an allocation once written cannot change (only be removed);
  ``reservedFor`` needs an allocation, holds at most 256 consumers with unique uids, and
  an allocation is not removed while it is reserved.

The resource claim controller is :mod:`fgpu_standin.claims`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

from fgpu_standin.store import KINDS as ALL_KINDS
from fgpu_standin.store import ApiStatusError, Kind

Obj = dict[str, Any]

GROUP = "resource.k8s.io"

KINDS: tuple[Kind, ...] = tuple(k for k in ALL_KINDS if k.group == GROUP)
"""DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate (``store.KINDS``)."""

MAX_REQUESTS = 32
MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_RESERVED_FOR = 256
MAX_STRING_ATTRIBUTE = 64
MAX_DRIVER_NAME = 63

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ATTRIBUTE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


class _Errors:
    """Field errors collected for one object, then raised as one 422 ``Invalid`` whose
    ``details.causes`` list each (``reason``, ``message``, ``field``) as the API server
    does."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.causes: list[Obj] = []

    def add(self, path: str, what: str) -> None:
        self.items.append(f"{path}: {what}")
        reason = next((r for words, r in _CAUSES if what.startswith(words)), "FieldValueInvalid")
        self.causes.append({"reason": reason, "message": what, "field": path})

    def required(self, path: str) -> None:
        self.add(path, "Required value")

    def raise_for(self, kind: Kind, name: str) -> None:
        if not self.items:
            return
        text = self.items[0] if len(self.items) == 1 else "[" + ", ".join(self.items) + "]"
        raise ApiStatusError(
            422,
            "Invalid",
            f'{kind.kind}.{kind.group} "{name}" is invalid: {text}',
            {"name": name, "group": kind.group, "kind": kind.kind, "causes": self.causes},
        )


_CAUSES = (
    ("Required value", "FieldValueRequired"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Too many", "FieldValueTooMany"),
    ("Forbidden", "FieldValueForbidden"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Invalid value", "FieldValueInvalid"),
)
"""The ``details.causes[].reason`` of a field error, by its message's first words (the API
server's ``field.ErrorType`` names)."""


def _label(errors: _Errors, path: str, value: Any, required: bool = True) -> None:
    if value in (None, ""):
        if required:
            errors.required(path)
        return
    if not isinstance(value, str) or len(value) > 63 or not _LABEL.match(value):
        errors.add(
            path,
            f"Invalid value: {_q(value)}: a lowercase RFC 1123 label must consist of lower case "
            "alphanumeric characters or '-', and must start and end with an alphanumeric "
            "character",
        )


def _subdomain(errors: _Errors, path: str, value: Any, limit: int = 253) -> None:
    if value in (None, ""):
        errors.required(path)
        return
    if not isinstance(value, str) or len(value) > limit or not _SUBDOMAIN.match(value):
        errors.add(
            path,
            f"Invalid value: {_q(value)}: a lowercase RFC 1123 subdomain of at most {limit} "
            "characters must consist of lower case alphanumeric characters, '-' or '.', and "
            "must start and end with an alphanumeric character",
        )


def _qualified(errors: _Errors, path: str, key: str) -> None:
    """An attribute or capacity name: ``name`` or ``domain/name`` (name a C identifier-like
    token of at most 32 characters)."""
    domain, _, name = key.rpartition("/")
    if domain:
        _subdomain(errors, path, domain, 63)
    if not name or len(name) > 32 or not _ATTRIBUTE.match(name):
        errors.add(
            path,
            f"Invalid value: {_q(key)}: must be a C-like identifier of at most 32 "
            "characters, optionally with a DNS subdomain prefix and '/'",
        )


def _selectors(errors: _Errors, path: str, selectors: Any) -> None:
    for i, sel in enumerate(selectors or []):
        cel = (sel or {}).get("cel") if isinstance(sel, dict) else None
        if not isinstance(cel, dict):
            errors.required(f"{path}[{i}].cel")
        elif not cel.get("expression"):
            errors.required(f"{path}[{i}].cel.expression")


def _opaque(errors: _Errors, path: str, entry: Any) -> None:
    opaque = entry.get("opaque") if isinstance(entry, dict) else None
    if not isinstance(opaque, dict):
        errors.required(f"{path}.opaque")
        return
    _subdomain(errors, f"{path}.opaque.driver", opaque.get("driver"), MAX_DRIVER_NAME)
    if opaque.get("parameters") in (None, {}, ""):
        errors.required(f"{path}.opaque.parameters")
    elif not isinstance(opaque["parameters"], dict):
        errors.add(f"{path}.opaque.parameters", "Invalid value: must be a JSON object")


def _meta_name(errors: _Errors, obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if name:
        _subdomain(errors, "metadata.name", name)
    return str(name or meta.get("generateName") or "")


# ------------------------------------------------------------------ validation
def validate_device_class(obj: Obj) -> _Errors:
    """The checks of a DeviceClass (module docstring)."""
    errors = _Errors()
    _meta_name(errors, obj)
    spec = obj.get("spec") or {}
    _selectors(errors, "spec.selectors", spec.get("selectors"))
    for i, entry in enumerate(spec.get("config") or []):
        _opaque(errors, f"spec.config[{i}]", entry)
    return errors


def _attribute(errors: _Errors, path: str, value: Any) -> None:
    if not isinstance(value, dict):
        errors.add(path, "Invalid value: must be an object with one of int, bool, string, version")
        return
    kinds = [k for k in ("int", "bool", "string", "version") if value.get(k) is not None]
    if len(kinds) != 1:
        errors.add(
            path, "Invalid value: exactly one of `int`, `bool`, `string`, `version` is required"
        )
        return
    v = value[kinds[0]]
    if kinds[0] == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        errors.add(f"{path}.int", f"Invalid value: {_q(v)}: must be an integer")
    elif kinds[0] == "bool" and not isinstance(v, bool):
        errors.add(f"{path}.bool", f"Invalid value: {_q(v)}: must be a boolean")
    elif kinds[0] == "string" and (not isinstance(v, str) or len(v) > MAX_STRING_ATTRIBUTE):
        errors.add(f"{path}.string", f"Too long: may not be more than {MAX_STRING_ATTRIBUTE} bytes")
    elif kinds[0] == "version" and (not isinstance(v, str) or not _SEMVER.match(v)):
        errors.add(f"{path}.version", f"Invalid value: {_q(v)}: must be a semantic version")


def validate_slice(obj: Obj, old: Obj | None = None) -> _Errors:
    """The checks of a ResourceSlice (module docstring)."""
    errors = _Errors()
    _meta_name(errors, obj)
    spec = obj.get("spec") or {}
    _subdomain(errors, "spec.driver", spec.get("driver"), MAX_DRIVER_NAME)
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        errors.required("spec.pool")
        pool = {}
    if not pool.get("name"):
        errors.required("spec.pool.name")
    if not isinstance(pool.get("generation", 0), int) or pool.get("generation", 0) < 0:
        errors.add("spec.pool.generation", "Invalid value: must be greater than or equal to 0")
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or count <= 0:
        errors.add(
            "spec.pool.resourceSliceCount", f"Invalid value: {_q(count)}: must be greater than zero"
        )
    where = [
        k
        for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if spec.get(k) not in (None, "", False)
    ]
    if len(where) != 1:
        errors.add(
            "spec",
            "Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required",
        )
    if spec.get("nodeName"):
        _subdomain(errors, "spec.nodeName", spec["nodeName"])
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES_PER_SLICE:
        errors.add(
            "spec.devices",
            f"Too many: {len(devices)}: must have at most {MAX_DEVICES_PER_SLICE} items",
        )
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        path = f"spec.devices[{i}]"
        name = (dev or {}).get("name")
        _label(errors, f"{path}.name", name)
        if name in seen:
            errors.add(f"{path}.name", f"Duplicate value: {_q(name)}")
        seen.add(str(name))
        attrs = (dev or {}).get("attributes") or {}
        caps = (dev or {}).get("capacity") or {}
        if len(attrs) + len(caps) > MAX_ATTRIBUTES_AND_CAPACITIES:
            errors.add(
                path,
                f"Too many: {len(attrs) + len(caps)}: must have at most "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities combined",
            )
        for key, value in attrs.items():
            _qualified(errors, f"{path}.attributes[{key}]", key)
            _attribute(errors, f"{path}.attributes[{key}]", value)
        for key in caps:  # a missing value was stored as 0 (fgpu_standin.quantity)
            _qualified(errors, f"{path}.capacity[{key}]", key)
    if old is not None:
        old_spec = old.get("spec") or {}
        for key in ("driver", "nodeName"):
            if spec.get(key) != old_spec.get(key):
                errors.add(f"spec.{key}", "Invalid value: field is immutable")
    return errors


def _claim_spec(errors: _Errors, path: str, spec: Any) -> None:
    if not isinstance(spec, dict):
        spec = {}
    devices = spec.get("devices") or {}
    requests = devices.get("requests") or []
    if len(requests) > MAX_REQUESTS:
        errors.add(
            f"{path}.devices.requests",
            f"Too many: {len(requests)}: must have at most {MAX_REQUESTS} items",
        )
    names: set[str] = set()
    for i, req in enumerate(requests):
        at = f"{path}.devices.requests[{i}]"
        req = req if isinstance(req, dict) else {}
        name = req.get("name")
        _label(errors, f"{at}.name", name)
        if name in names:
            errors.add(f"{at}.name", f"Duplicate value: {_q(name)}")
        names.add(str(name))
        exactly, first = req.get("exactly"), req.get("firstAvailable")
        if (exactly is None) == (first is None):
            errors.add(
                at, "Invalid value: exactly one of `exactly` or `firstAvailable` is required"
            )
            continue
        subs: list[Any] = [exactly] if exactly is not None else list(first or [])
        for j, sub in enumerate(subs):
            sub_at = f"{at}.exactly" if exactly is not None else f"{at}.firstAvailable[{j}]"
            sub = sub if isinstance(sub, dict) else {}
            if first is not None:
                _label(errors, f"{sub_at}.name", sub.get("name"))
            _subdomain(errors, f"{sub_at}.deviceClassName", sub.get("deviceClassName"))
            _selectors(errors, f"{sub_at}.selectors", sub.get("selectors"))
            mode = sub.get("allocationMode") or "ExactCount"
            count = sub.get("count")
            if mode == "ExactCount":
                if count is not None and (not isinstance(count, int) or count <= 0):
                    errors.add(
                        f"{sub_at}.count", f"Invalid value: {_q(count)}: must be greater than zero"
                    )
            elif mode == "All":
                if count not in (None, 0):
                    errors.add(
                        f"{sub_at}.count",
                        "Invalid value: must not be specified when allocationMode is All",
                    )
            else:
                errors.add(
                    f"{sub_at}.allocationMode",
                    f'Unsupported value: "{mode}": supported values: "All", "ExactCount"',
                )
    for i, entry in enumerate(devices.get("config") or []):
        at = f"{path}.devices.config[{i}]"
        for j, ref in enumerate((entry or {}).get("requests") or []):
            if str(ref).split("/", 1)[0] not in names:
                errors.add(
                    f"{at}.requests[{j}]",
                    f"Invalid value: {_q(ref)}: must be the name of a request in the claim",
                )
        _opaque(errors, at, entry)


def _q(value: Any) -> str:
    """A value in a message as the API server quotes it (Go's ``%q``: strings in double
    quotes; numbers as they are)."""
    return json.dumps(value) if isinstance(value, str) else str(value)


def _defaults(spec: Obj) -> None:
    """``allocationMode`` ``ExactCount`` and ``count`` 1, as the API server defaults them
    (``count: 0`` too: the field is an integer left out when zero, so 0 reads as unset)."""
    for req in ((spec.get("devices") or {}).get("requests")) or []:
        subs = [req.get("exactly")] if req.get("exactly") else list(req.get("firstAvailable") or [])
        for sub in subs:
            if isinstance(sub, dict):
                sub.setdefault("allocationMode", "ExactCount")
                if sub["allocationMode"] == "ExactCount" and not sub.get("count"):
                    sub["count"] = 1


def validate_claim(obj: Obj, old: Obj | None = None) -> _Errors:
    """The checks of a ResourceClaim's metadata and spec (status: :func:`validate_status`)."""
    errors = _Errors()
    _meta_name(errors, obj)
    _claim_spec(errors, "spec", obj.get("spec"))
    if old is not None and obj.get("spec") != old.get("spec"):
        errors.add("spec", "Invalid value: field is immutable")
    return errors


def validate_template(obj: Obj, old: Obj | None = None) -> _Errors:
    """The checks of a ResourceClaimTemplate (its ``spec.spec`` is a claim's spec)."""
    errors = _Errors()
    _meta_name(errors, obj)
    _claim_spec(errors, "spec.spec", (obj.get("spec") or {}).get("spec"))
    if old is not None and obj.get("spec") != old.get("spec"):
        errors.add("spec", "Invalid value: field is immutable")
    return errors


def validate_status(obj: Obj, old: Obj) -> _Errors:
    """The checks of a ResourceClaim status update (module docstring)."""
    errors = _Errors()
    status = obj.get("status") or {}
    old_status = old.get("status") or {}
    spec = obj.get("spec") or {}
    names = {str(r.get("name")) for r in ((spec.get("devices") or {}).get("requests") or [])}
    allocation = status.get("allocation")
    if allocation is not None:
        results = ((allocation.get("devices") or {}).get("results")) or []
        for i, res in enumerate(results):
            at = f"status.allocation.devices.results[{i}]"
            res = res if isinstance(res, dict) else {}
            if str(res.get("request", "")).split("/", 1)[0] not in names:
                errors.add(
                    f"{at}.request",
                    f"Invalid value: {_q(res.get('request'))}: must be "
                    "the name of a request in the claim",
                )
            _subdomain(errors, f"{at}.driver", res.get("driver"), MAX_DRIVER_NAME)
            if not res.get("pool"):
                errors.required(f"{at}.pool")
            _label(errors, f"{at}.device", res.get("device"))
        for i, entry in enumerate(((allocation.get("devices") or {}).get("config")) or []):
            at = f"status.allocation.devices.config[{i}]"
            if (entry or {}).get("source") not in ("FromClass", "FromClaim"):
                errors.add(
                    f"{at}.source",
                    f'Unsupported value: "{(entry or {}).get("source")}": '
                    'supported values: "FromClaim", "FromClass"',
                )
            _opaque(errors, at, entry)
        if old_status.get("allocation") is not None and allocation != old_status["allocation"]:
            errors.add("status.allocation", "Invalid value: field is immutable")
    reserved = status.get("reservedFor") or []
    if reserved and allocation is None:
        errors.add(
            "status.reservedFor", "Forbidden: may not be specified when `allocated` is not set"
        )
    if len(reserved) > MAX_RESERVED_FOR:
        errors.add(
            "status.reservedFor",
            f"Too many: {len(reserved)}: must have at most {MAX_RESERVED_FOR} items",
        )
    uids: set[str] = set()
    for i, ref in enumerate(reserved):
        at = f"status.reservedFor[{i}]"
        ref = ref if isinstance(ref, dict) else {}
        for key in ("resource", "name", "uid"):
            if not ref.get(key):
                errors.required(f"{at}.{key}")
        if ref.get("uid") in uids:
            errors.add(f"{at}.uid", f"Duplicate value: {_q(ref.get('uid'))}")
        uids.add(str(ref.get("uid")))
    if (
        old_status.get("allocation") is not None
        and allocation is None
        and old_status.get("reservedFor")
        and reserved
    ):
        errors.add("status.allocation", "Forbidden: may not be removed while `reservedFor` is set")
    return errors


_VALIDATORS: dict[str, Callable[[Obj, Obj | None], _Errors]] = {
    "deviceclasses": lambda o, _old: validate_device_class(o),
    "resourceslices": validate_slice,
    "resourceclaims": validate_claim,
    "resourceclaimtemplates": validate_template,
}


def admit(kind: Kind, obj: Obj, old: Obj | None = None, *, status: bool = False) -> Obj:
    """Default and check an object of a ``resource.k8s.io`` kind before it is stored
    (``old``: the stored one on an update; ``status``: a write to ``/status``).

    Returns:
        The object with the API server's defaults.

    Raises:
        ApiStatusError: 422 Invalid naming every field in error.
    """
    if kind.group != GROUP:
        return obj
    obj = copy.deepcopy(obj)
    if kind.plural == "resourceclaims":
        _defaults(obj.setdefault("spec", {}))
    elif kind.plural == "resourceclaimtemplates":
        _defaults(obj.setdefault("spec", {}).setdefault("spec", {}))
    name = str((obj.get("metadata") or {}).get("name") or "")
    if status and old is not None:
        validate_status(obj, old).raise_for(kind, name)
        return obj
    _VALIDATORS[kind.plural](obj, old).raise_for(kind, name)
    return obj


__all__ = [
    "GROUP",
    "KINDS",
    "admit",
    "validate_claim",
    "validate_device_class",
    "validate_slice",
    "validate_status",
    "validate_template",
]
