"""Integer units and their parsing.

Inside fgpu every quantity is an integer: compute in **milli-GPU** (1000 = one whole GPU),
memory in **MiB**, CPU in **milli-cores**. Strings from users are converted here, at the
edge, and nowhere else. Every parser raises :class:`UnitError` (a ``ValueError``) whose
message names the field and the reason.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MILLI_PER_GPU = 1000
"""Compute units in one whole GPU."""

_MEMORY_FACTORS_MIB: dict[str, Decimal] = {
    "": Decimal(1),  # a bare number is MiB
    "mib": Decimal(1),
    "m": Decimal(1),
    "mi": Decimal(1),
    "gib": Decimal(1024),
    "g": Decimal(1024),
    "gi": Decimal(1024),
    "tib": Decimal(1024 * 1024),
    "t": Decimal(1024 * 1024),
    "ti": Decimal(1024 * 1024),
    # MB, GB and TB as people type them: binary here too, like M, G and T (DESIGN.md
    # section 3), never powers of ten (nvidia-smi and CUDA report MiB as "MB" as well)
    "mb": Decimal(1),
    "gb": Decimal(1024),
    "tb": Decimal(1024 * 1024),
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


class UnitError(ValueError):
    """A quantity that cannot be parsed or is out of range; the message names the field."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 60:
            shown = f"{shown[:40]}... ({len(str(value))} characters)"
        super().__init__(f"{field}: {reason} (got {shown})")


MAX_NUMBER_CHARS = 40
"""Longest number text accepted (longer ones are refused before any conversion: a
thousands-of-digits value would otherwise cost time and hit Python's integer conversion
limit)."""


def _short_enough(field: str, text: object) -> None:
    if isinstance(text, str) and len(text.strip()) > MAX_NUMBER_CHARS:
        raise UnitError(
            field, text, f"too long for a number (at most {MAX_NUMBER_CHARS} characters)"
        )


_PLAIN_NUMBER = re.compile(r"^-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)$")


def _decimal(field: str, text: str) -> Decimal:
    """A plain decimal number (digits, one optional point, optional minus; no exponent)."""
    _short_enough(field, text)
    raw = text.strip()
    if not _PLAIN_NUMBER.match(raw):
        raise UnitError(field, text, "not a plain decimal number")
    try:
        return Decimal(raw)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise UnitError(field, text, "not a number") from None


def parse_gpu_fraction(text: str | float, field: str = "gpu") -> int:
    """Parse a fraction of one GPU, ``"0.5"`` -> 500 milli-GPU.

    The fraction must lie in (0, 1]; 1 means a whole GPU (1000). Values are rounded to
    the nearest milli-GPU; one that rounds to 0 is rejected.

    Raises:
        UnitError: not a number, not in (0, 1], or below 0.001.
    """
    value = _decimal(field, str(text))
    if value <= 0 or value > 1:
        raise UnitError(field, text, "a GPU fraction must be in (0, 1]")
    milli = int((value * MILLI_PER_GPU).to_integral_value())
    if milli < 1:
        raise UnitError(field, text, "a GPU fraction must be at least 0.001")
    if milli == MILLI_PER_GPU and value != 1:
        raise UnitError(field, text, "a GPU fraction below 1 must be at most 0.999")
    return milli


def parse_gpu_request(text: str | float, field: str = "gpu") -> tuple[int, int]:
    """Parse the ``-g`` value into ``(gpu_count, gpu_milli_per_gpu)``.

    ``"0.5"`` -> ``(1, 500)`` (a fraction of one GPU); ``"1"`` -> ``(1, 1000)``;
    ``"2"`` -> ``(2, 1000)`` (two whole GPUs). Above 1 the value must be a whole number
    (DESIGN.md section 4: a count is a positive integer).

    Raises:
        UnitError: not a number, not positive, or a non-integer count above 1.
    """
    value = _decimal(field, str(text))
    if value <= 0:
        raise UnitError(field, text, "a GPU request must be positive")
    if value < 1:
        return 1, parse_gpu_fraction(text, field)
    if value != value.to_integral_value():
        raise UnitError(field, text, "above 1 a GPU request is a whole number of GPUs")
    return int(value), MILLI_PER_GPU


def parse_memory_mib(text: str | int, field: str = "gpu_memory") -> int:
    """Parse a memory size into MiB: ``"5GiB"``, ``"5G"`` (= GiB), ``"5120MiB"``, ``"5120"``.

    Units are binary (``G`` and ``GB`` mean GiB, ``M`` and ``MB`` MiB, ``T`` and ``TB`` TiB,
    as in DESIGN.md section 3), case-insensitive. A bare number is MiB.
    Fractional results are rounded up to the next MiB so a request is never shrunk.

    Raises:
        UnitError: malformed, unknown unit, or not positive.
    """
    if isinstance(text, bool):
        raise UnitError(field, text, "not a memory size")
    if isinstance(text, int):
        if text <= 0:
            raise UnitError(field, text, "memory must be positive")
        return text
    _short_enough(field, text)
    match = _NUMBER_UNIT.match(text) if isinstance(text, str) else None
    if match is None:
        if isinstance(text, str) and text.strip().startswith("-"):
            raise UnitError(field, text, "memory must be positive")
        raise UnitError(field, text, "expected a number with an optional unit, e.g. 5GiB")
    number, unit = match.groups()
    factor = _MEMORY_FACTORS_MIB.get(unit.lower())
    if factor is None:
        raise UnitError(
            field,
            text,
            f"unknown unit {unit!r}; use MiB, GiB or TiB (M/MB, G/GB and T/TB mean the "
            "same: binary; a bare number is MiB)",
        )
    mib = Decimal(number) * factor
    if mib <= 0:
        raise UnitError(field, text, "memory must be positive")
    whole = int(mib.to_integral_value(rounding="ROUND_CEILING"))
    return whole


def parse_cpu_milli(text: str | float, field: str = "cpu") -> int:
    """Parse CPU cores into milli-cores: ``"2"`` -> 2000, ``"0.5"`` -> 500, ``"250m"`` -> 250.

    Raises:
        UnitError: malformed or not positive.
    """
    raw = str(text).strip()
    if raw.endswith("m"):
        value = _decimal(field, raw[:-1])
        milli = value
    else:
        milli = _decimal(field, raw) * 1000
    if milli <= 0:
        raise UnitError(field, text, "CPU must be positive")
    if milli != milli.to_integral_value():
        raise UnitError(field, text, "CPU must be a whole number of milli-cores")
    return int(milli)


_BYTE_FACTORS: dict[str, int] = {
    "": 1,  # a bare number is bytes
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tb": 2**40,
    "tib": 2**40,
}


def parse_bytes(text: str | int, field: str = "size") -> int:
    """Parse a size into bytes: ``"64MiB"``, ``"64M"`` (= MiB), ``"1GiB"``, ``"4096"`` (a
    bare number is bytes). Units are binary, as for memory (DESIGN.md section 3); a fraction
    is rounded down to whole bytes.

    Raises:
        UnitError: malformed, unknown unit, or not positive.
    """
    if isinstance(text, bool):
        raise UnitError(field, text, "not a size")
    if isinstance(text, int):
        if text <= 0:
            raise UnitError(field, text, "must be positive")
        return text
    _short_enough(field, text)
    found = _NUMBER_UNIT.match(text)
    if found is None:
        raise UnitError(field, text, "not a size; give bytes or e.g. 64MiB, 1GiB")
    factor = _BYTE_FACTORS.get(found.group(2).lower())
    if factor is None:
        raise UnitError(field, text, f"unknown unit {found.group(2)!r}; use B, KiB, MiB, GiB, TiB")
    size = int(Decimal(found.group(1)) * factor)
    if size <= 0:
        raise UnitError(field, text, "must be positive")
    return size


MAX_DURATION_S = 1e9
"""Durations are at most this many seconds (about 31 years)."""

_DURATION_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(text: str | float, field: str = "duration") -> float:
    """Parse a duration into seconds: ``"90"`` (seconds), ``"300s"``, ``"5m"``, ``"1.5h"``,
    ``"1d"``; 0 is allowed.

    Raises:
        UnitError: malformed, an unknown unit, negative, or not below
            :data:`MAX_DURATION_S` (the message names ``field``, echoes the value, and says
            which forms are accepted).
    """
    forms = "seconds (90) or a number with s, m, h or d (300s, 5m, 1h)"
    if isinstance(text, bool):
        raise UnitError(field, text, f"not a duration; use {forms}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        _short_enough(field, text)
        raw = str(text).strip()
        if raw.startswith("-"):
            raise UnitError(field, text, "a duration must not be negative")
        match = _NUMBER_UNIT.match(raw)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _DURATION_UNITS_S:
            raise UnitError(field, text, f"not a duration; use {forms}")
        seconds = float(Decimal(match.group(1)) * _DURATION_UNITS_S[unit])
    if seconds != seconds or seconds < 0:
        raise UnitError(field, text, "a duration must not be negative")
    if seconds > MAX_DURATION_S:
        raise UnitError(field, text, f"must be at most {MAX_DURATION_S:.0e} seconds")
    return seconds


def format_duration_s(seconds: float) -> str:
    """Render seconds for people: 300 -> ``"5m"``, 90 -> ``"90s"``, 7200 -> ``"2h"``,
    1.5 -> ``"1.5s"``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def format_mib(mib: int) -> str:
    """Render MiB for people: 5120 -> ``"5GiB"``, 1536 -> ``"1536MiB"``, 0 -> ``"0MiB"``."""
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib}MiB"
