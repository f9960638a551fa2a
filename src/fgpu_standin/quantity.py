"""Resource quantities in the API server's canonical form (``81920Mi`` is stored as
``80Gi``, ``1.5`` as ``1500m``, ``2000m`` as ``2``).

TEST STAND-IN. See :mod:`fgpu_standin`.

The rules are those documented for ``k8s.io/apimachinery/pkg/api/resource.Quantity``
(Kubernetes API reference, "Quantity"): a quantity keeps the kind of suffix it was written
with (binary ``Ki``..``Ei``, decimal ``n``..``E``, or a decimal exponent ``e3``) and is
written so that no precision is lost, no fractional digits are written, and the suffix is
as large as it can be. As the library does, a binary quantity whose value is below 1024 in
magnitude or not a whole number is written with a decimal suffix, and a value finer than
a nano-unit is rounded up to one.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIX_OF = {e: s for s, e in _DECIMAL.items()}
_BINARY_OF = {e: s for s, e in _BINARY.items()}
_FORM = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[A-Za-z]*)$")

PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
"""The expression the API server names when it refuses a malformed quantity."""


class QuantityError(ValueError):
    """A value that is not a quantity (the API server answers 400 BadRequest)."""


def parse(text: str) -> tuple[Decimal, str]:
    """``text``'s exact value and the kind of its suffix (``binary``, ``decimal``,
    ``exponent``).

    Raises:
        QuantityError: ``text`` is not a quantity.
    """
    found = _FORM.match(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise QuantityError(f"quantities must match the regular expression '{PATTERN}'")
    number, suffix = found.groups()
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise QuantityError("unable to parse numeric part of quantity") from None
    if suffix in _BINARY:
        return value * (1 << _BINARY[suffix]), "binary"
    if suffix in _DECIMAL:
        return value.scaleb(_DECIMAL[suffix]), "decimal"
    if suffix[:1] in ("e", "E"):
        return value.scaleb(int(suffix[1:])), "exponent"
    raise QuantityError("unable to parse quantity's suffix")


def canonical(value: Any) -> str:
    """``value`` (a quantity string, or a JSON number) in canonical form.

    Raises:
        QuantityError: it is not a quantity.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"quantities must match the regular expression '{PATTERN}'")
    amount, form = parse(str(value))
    if amount == 0:
        return "0"
    nano = (amount.scaleb(9)).to_integral_value(rounding=ROUND_CEILING)  # round up to 1n
    amount = nano.scaleb(-9)
    sign = "-" if amount < 0 else ""
    magnitude = -amount if amount < 0 else amount
    if form == "binary" and magnitude >= 1024 and magnitude == magnitude.to_integral_value():
        whole, power = int(magnitude), 0
        while power < 60 and whole % 1024 == 0:
            whole //= 1024
            power += 10
        return f"{sign}{whole}{_BINARY_OF.get(power, '')}"
    # decimal: an integer mantissa with an exponent that is a multiple of 3, as large as can be
    mantissa, exponent = int(magnitude.scaleb(9)), -9
    while exponent < 18 and mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    if form == "exponent":
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_SUFFIX_OF[exponent]}"


def _maps(obj: Any, *path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every mapping at ``path`` under ``obj`` (``*`` walks a list), with its field path."""
    found: list[tuple[str, Any]] = [("", obj)]
    for step in path:
        nxt: list[tuple[str, Any]] = []
        for at, here in found:
            if step == "*":
                if isinstance(here, list):
                    nxt.extend((f"{at}[{i}]", x) for i, x in enumerate(here))
            elif isinstance(here, dict) and step in here:
                nxt.append((f"{at}.{step}" if at else step, here[step]))
        found = nxt
    return [(at, m) for at, m in found if isinstance(m, dict)]


_RESOURCE_LISTS: dict[str, list[tuple[str, ...]]] = {
    "pods": [
        (part, "*", "resources", which)
        for part in ("containers", "initContainers")
        for which in ("requests", "limits")
    ]
    + [("spec", "overhead"), ("spec", "resources", "requests"), ("spec", "resources", "limits")],
    "nodes": [("status", "capacity"), ("status", "allocatable")],
    "persistentvolumes": [("spec", "capacity")],
    "persistentvolumeclaims": [
        ("spec", "resources", "requests"),
        ("spec", "resources", "limits"),
        ("status", "capacity"),
    ],
    "runtimeclasses": [("overhead", "podFixed")],
}
_CLAIM_REQUESTS = [
    ("devices", "requests", "*", "exactly", "capacity", "requests"),
    ("devices", "requests", "*", "firstAvailable", "*", "capacity", "requests"),
]


def canonicalize(plural: str, obj: dict[str, Any]) -> None:
    """Put every quantity of an object of kind ``plural`` in canonical form, in place (as
    the API server stores it): resource lists of pods (containers, init containers,
    overhead, pod resources), nodes, volumes, claims of volumes, RuntimeClass overhead, and
    the capacities of ResourceSlices and ResourceClaims (templates too). A ResourceSlice
    capacity without a ``value`` gets ``0`` (the API server decodes a missing quantity as
    zero; 1.36 stores it).

    Raises:
        QuantityError: a value is not a quantity (the message names its field).
    """
    paths = list(_RESOURCE_LISTS.get(plural, []))
    if plural == "pods":
        paths = [p if p[0] == "spec" else ("spec", *p) for p in paths]
    elif plural == "resourceclaims":
        paths = [("spec", *p) for p in _CLAIM_REQUESTS]
    elif plural == "resourceclaimtemplates":
        paths = [("spec", "spec", *p) for p in _CLAIM_REQUESTS]
    for path in paths:
        for at, resources in _maps(obj, *path):
            for key, value in resources.items():
                try:
                    resources[key] = canonical(value)
                except QuantityError as exc:
                    raise QuantityError(f"{at}[{key}]: {exc}") from None
    if plural == "resourceslices":
        for at, capacity in _maps(obj, "spec", "devices", "*", "capacity"):
            for key, entry in capacity.items():
                if not isinstance(entry, dict):
                    continue
                value = entry.get("value")
                try:
                    entry["value"] = "0" if value in (None, "") else canonical(value)
                except QuantityError as exc:
                    raise QuantityError(f"{at}[{key}].value: {exc}") from None


__all__ = ["PATTERN", "QuantityError", "canonical", "canonicalize", "parse"]
