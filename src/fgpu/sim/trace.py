"""Loaders for the Alibaba cluster-trace-gpu-v2023 ("openb") CSV files.

Two layouts are read (the files of ``alibaba/clusterdata``, ``cluster-trace-gpu-v2023/csv``;
see :mod:`fgpu.sim.trace_source`):

* **node list** (``openb_node_list_*.csv``): ``sn, cpu_milli, memory_mib, gpu, model``;
* **pod list** (``openb_pod_list_*.csv``): ``name, cpu_milli, memory_mib, num_gpu,
  gpu_milli`` and optionally ``gpu_spec``; other columns (``qos``, ``pod_phase``, the
  timestamps) are accepted and ignored. The ``multigpu*`` files have only the five
  required columns.

Validation is strict: anything the simulator could misread is a :class:`TraceFormatError`
that names the file, the physical line (1 is the header) and the reason. Entirely blank
lines are skipped (they still count for line numbers). Values are not trimmed: ``" 5"`` is
not an integer. GPU model names go through :func:`fgpu.model.canonical_name`, so the
trace's ``V100M16`` / ``V100M32`` become ``V100-16GB`` / ``V100-32GB``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from fgpu.model.catalog import GPU_CATALOG, UnknownGpuModelError, canonical_name
from fgpu.model.types import (
    MAX_CPU_MILLI,
    MAX_GPUS,
    MAX_MEMORY_MIB,
    MODEL_SEPARATOR,
    InvalidRequestError,
    Node,
    Request,
)
from fgpu.model.units import MILLI_PER_GPU

NODE_COLUMNS: tuple[str, ...] = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
"""Required columns of a node list, in the published order."""

POD_COLUMNS: tuple[str, ...] = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""Required columns of a pod list, in the published order (``gpu_spec`` is optional)."""

_POD_SPEC_COLUMN = "gpu_spec"
_SPEC_SEPARATOR = MODEL_SEPARATOR
_LONGEST_SHOWN = 40
"""A too-large number longer than this many characters is shown shortened in messages."""


class TraceFormatError(ValueError):
    """A trace file that cannot be loaded as it is.

    Attributes:
        path: the file as given by the caller.
        line: 1-based physical line of the problem (1 is the header; 0 when the file
            could not be opened at all).
        reason: what is wrong, in words fit to show a user.

    ``str(err)`` is ``"{path}:{line}: {reason}"``, or ``"{path}: {reason}"`` when the
    problem is the whole file (line 0: missing, a folder, unreadable).
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}" if line > 0 else f"{path}: {reason}")

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[str, int, str]]:
        return (type(self), (self.path, self.line, self.reason))


@dataclass(frozen=True)
class PodTrace:
    """The pods of one pod list, in file order.

    Attributes:
        names: pod names (``name`` column), unique.
        requests: the matching requests; ``requests[i]`` belongs to ``names[i]``.
    """

    names: tuple[str, ...]
    requests: tuple[Request, ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.requests):
            raise ValueError(f"PodTrace: {len(self.names)} names but {len(self.requests)} requests")

    def __len__(self) -> int:
        return len(self.names)


# --------------------------------------------------------------------------- reading


def _read_text(path: str) -> str:
    """Read the whole file as UTF-8 (a leading BOM is dropped)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise TraceFormatError(path, 0, "file not found") from None
    except IsADirectoryError:
        raise TraceFormatError(path, 0, "is a directory, not a file") from None
    except OSError as exc:
        raise TraceFormatError(path, 0, f"cannot read file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceFormatError(
            path, line, f"not UTF-8 text (byte 0x{data[exc.start]:02x})"
        ) from None


def _rows(path: str, text: str) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(first physical line, fields)`` for every non-blank CSV record."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceFormatError(
                path, max(start, reader.line_num), f"malformed CSV: {exc}"
            ) from None
        if fields:
            yield start, fields


def _columns(names: Iterable[str]) -> str:
    return ", ".join(names)


def _check_header(
    path: str,
    header: list[str],
    required: Sequence[str],
    layout: str,
    other_required: Sequence[str],
    other_layout: str,
) -> dict[str, int]:
    """Map column name -> index, after checking that the header fits ``layout``."""
    index: dict[str, int] = {}
    for position, name in enumerate(header):
        if name in index:
            raise TraceFormatError(path, 1, f"duplicate column {name!r} in the header")
        index[name] = position
    missing = [name for name in required if name not in index]
    if not missing:
        return index
    expected = f"expected a {layout} with columns {_columns(required)}"
    if all(name in index for name in other_required):
        raise TraceFormatError(
            path, 1, f"wrong column layout: this looks like a {other_layout}; {expected}"
        )
    if len(missing) == len(required):
        raise TraceFormatError(
            path,
            1,
            f"unknown column layout ({_columns(repr(h) for h in header)}); {expected}",
        )
    raise TraceFormatError(
        path,
        1,
        f"missing required column(s) {_columns(missing)}; {expected}; "
        f"found {_columns(repr(h) for h in header)}",
    )


def _start(
    path: str,
    required: Sequence[str],
    layout: str,
    other_required: Sequence[str],
    other_layout: str,
) -> tuple[dict[str, int], int, Iterator[tuple[int, list[str]]]]:
    """Open ``path``, check its header; return (column index, field count, row iterator)."""
    text = _read_text(path)
    rows = _rows(path, text)
    first = next(rows, None)
    if first is None:
        raise TraceFormatError(
            path, 1, f"empty file: no header; expected a {layout} with columns {_columns(required)}"
        )
    header_line, header = first
    if header_line != 1:
        raise TraceFormatError(path, 1, "blank line before the header")
    index = _check_header(path, header, required, layout, other_required, other_layout)
    return index, len(header), rows


def _no_rows(path: str, layout: str) -> TraceFormatError:
    return TraceFormatError(path, 1, f"no data rows after the header: the {layout} is empty")


def _field_count(path: str, line: int, fields: list[str], width: int) -> None:
    if len(fields) != width:
        raise TraceFormatError(
            path, line, f"expected {width} fields as in the header, got {len(fields)}"
        )


def _integer(path: str, line: int, column: str, text: str, maximum: int) -> int:
    """A decimal integer in ``0..maximum``, digits only.

    The bound keeps absurd values (``10**27`` milli-cores, a node with ``10**11`` GPUs) from
    reaching numpy, where they would overflow or exhaust memory; the digits are counted
    before conversion, so even a number too long for ``int()`` gets this message.
    """
    if text.isascii() and text.isdigit():
        digits = text.lstrip("0")
        if len(digits) <= len(str(maximum)) and int(text) <= maximum:
            return int(text)
        shown = text if len(text) <= _LONGEST_SHOWN else f"{text[:12]}... ({len(text)} digits)"
        raise TraceFormatError(
            path,
            line,
            f"column {column!r}: {shown} is above the largest supported value {maximum}",
        )
    if not text:
        raise TraceFormatError(path, line, f"column {column!r}: empty value, expected an integer")
    if text[0] == "-" and text[1:].isascii() and text[1:].isdigit():
        raise TraceFormatError(path, line, f"column {column!r}: must not be negative (got {text})")
    raise TraceFormatError(path, line, f"column {column!r}: not an integer (got {text!r})")


def _model(path: str, line: int, column: str, text: str, cache: dict[str, str]) -> str:
    """Canonical catalog name of ``text``; unknown names list the known models."""
    found = cache.get(text)
    if found is not None:
        return found
    try:
        found = canonical_name(text)
    except UnknownGpuModelError as exc:
        message = str(exc).removeprefix("gpu_model: ")
        raise TraceFormatError(path, line, f"column {column!r}: {message}") from None
    cache[text] = found
    return found


def _duplicate(path: str, line: int, kind: str, name: str, first_line: int) -> TraceFormatError:
    return TraceFormatError(
        path, line, f"duplicate {kind} name {name!r} (first on line {first_line})"
    )


# --------------------------------------------------------------------------- public


def load_nodes(path: str | os.PathLike[str]) -> list[Node]:
    """Load a node list (``openb_node_list_gpu_node.csv`` or ``..._all_node.csv``).

    Columns (extra columns are ignored):
        ``sn``: node name, unique, not empty.
        ``cpu_milli``: allocatable CPU in milli-cores (vCPU x 1000), integer in
            0..10**9 (:data:`fgpu.model.types.MAX_CPU_MILLI`).
        ``memory_mib``: host memory in MiB, integer in 0..2**40 (``MAX_MEMORY_MIB``).
        ``gpu``: number of GPUs, integer in 0..64 (``MAX_GPUS``).
        ``model``: GPU model, a catalog name or alias (``V100M16`` -> ``V100-16GB``);
            required when ``gpu`` > 0; with ``gpu`` == 0 it may be empty, and is ignored
            (checked against the catalog if given).

    Returns:
        Nodes in file order. ``gpu_model`` is the canonical catalog name (None for a
        CPU-only node) and ``gpu_memory_mib`` the catalog memory of that model (0 if none).

    Raises:
        TraceFormatError: file missing or unreadable (line 0); empty file, header only,
            a pod list or an unknown layout, missing columns (line 1); a row with the wrong
            number of fields, an empty, non-integer, negative or too large number (above
            the bounds listed with the columns), an unknown model,
            GPUs without a model, an empty or duplicate node name (that row's line).
    """
    where = os.fspath(path)
    index, width, rows = _start(where, NODE_COLUMNS, "node list", POD_COLUMNS, "pod list")
    i_name, i_cpu, i_mem, i_gpu, i_model = (index[c] for c in NODE_COLUMNS)
    models: dict[str, str] = {}
    seen: dict[str, int] = {}
    nodes: list[Node] = []
    for line, fields in rows:
        _field_count(where, line, fields, width)
        name = fields[i_name]
        if not name:
            raise TraceFormatError(where, line, "column 'sn': empty node name")
        cpu_milli = _integer(where, line, "cpu_milli", fields[i_cpu], MAX_CPU_MILLI)
        memory_mib = _integer(where, line, "memory_mib", fields[i_mem], MAX_MEMORY_MIB)
        gpu_count = _integer(where, line, "gpu", fields[i_gpu], MAX_GPUS)
        model_text = fields[i_model]
        model = _model(where, line, "model", model_text, models) if model_text else None
        if gpu_count > 0 and model is None:
            raise TraceFormatError(
                where, line, f"column 'model': empty, but the node has {gpu_count} GPU(s)"
            )
        if gpu_count == 0:
            model = None
        first_line = seen.setdefault(name, line)
        if first_line != line:
            raise _duplicate(where, line, "node", name, first_line)
        try:
            node = Node(
                name=name,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                gpu_count=gpu_count,
                gpu_model=model,
                gpu_memory_mib=GPU_CATALOG[model].memory_mib if model is not None else 0,
            )
        except InvalidRequestError as exc:  # defensive: the checks above should catch it
            raise TraceFormatError(where, line, str(exc)) from None
        nodes.append(node)
    if not nodes:
        raise _no_rows(where, "node list")
    return nodes


def load_pods(path: str | os.PathLike[str]) -> PodTrace:
    """Load a pod list (``openb_pod_list_<variant>.csv``).

    Columns:
        ``name``: pod name, unique, not empty.
        ``cpu_milli``: requested CPU in milli-cores, integer in 0..10**9.
        ``memory_mib``: requested host memory in MiB, integer in 0..2**40.
        ``num_gpu``: number of GPUs, integer in 0..64 (0: CPU-only pod).
        ``gpu_milli``: milli-GPU on each of those GPUs: 0 for a CPU-only pod, 1..1000
            otherwise, and exactly 1000 when ``num_gpu`` > 1 (fractions only on one GPU).
        ``gpu_spec`` (optional): allowed GPU models joined by ``|``, each a catalog name
            or alias; empty (or no such column) means any model. Repeated names are
            accepted (the published ``gpuspec*`` files contain ``V100M32|V100M32``).
        Any other column (``qos``, ``pod_phase``, timestamps) is ignored.

    Returns:
        A :class:`PodTrace` in file order. Each request has ``gpu_count = num_gpu``,
        ``gpu_milli = gpu_milli`` (None for a CPU-only pod), ``gpu_memory_mib = None``
        and ``gpu_models`` the canonical names from ``gpu_spec``.

    Raises:
        TraceFormatError: file missing or unreadable (line 0); empty file, header only,
            a node list or an unknown layout, missing columns (line 1); a row with the
            wrong number of fields, an empty, non-integer, negative or too large number
            (above the bounds listed with the columns; ``gpu_milli`` above 1000),
            ``gpu_milli`` inconsistent with ``num_gpu``, an unknown or empty model in
            ``gpu_spec``, an empty or duplicate pod name (that row's line).
    """
    where = os.fspath(path)
    index, width, rows = _start(where, POD_COLUMNS, "pod list", NODE_COLUMNS, "node list")
    i_name, i_cpu, i_mem, i_num, i_milli = (index[c] for c in POD_COLUMNS)
    i_spec = index.get(_POD_SPEC_COLUMN)
    models: dict[str, str] = {}
    specs: dict[str, frozenset[str]] = {"": frozenset()}
    seen: dict[str, int] = {}
    names: list[str] = []
    requests: list[Request] = []
    for line, fields in rows:
        _field_count(where, line, fields, width)
        name = fields[i_name]
        if not name:
            raise TraceFormatError(where, line, "column 'name': empty pod name")
        cpu_milli = _integer(where, line, "cpu_milli", fields[i_cpu], MAX_CPU_MILLI)
        memory_mib = _integer(where, line, "memory_mib", fields[i_mem], MAX_MEMORY_MIB)
        num_gpu = _integer(where, line, "num_gpu", fields[i_num], MAX_GPUS)
        gpu_milli = _integer(where, line, "gpu_milli", fields[i_milli], MILLI_PER_GPU)
        if num_gpu == 0 and gpu_milli != 0:
            raise TraceFormatError(
                where, line, f"gpu_milli is {gpu_milli} but num_gpu is 0 (a CPU-only pod has 0)"
            )
        if num_gpu > 0 and gpu_milli == 0:
            raise TraceFormatError(
                where, line, f"gpu_milli is 0 but num_gpu is {num_gpu} (a GPU pod needs 1..1000)"
            )
        if num_gpu > 1 and gpu_milli < MILLI_PER_GPU:
            raise TraceFormatError(
                where,
                line,
                f"gpu_milli is {gpu_milli} with num_gpu {num_gpu}: a fraction of a GPU "
                "is allowed only when num_gpu is 1",
            )
        spec_text = fields[i_spec] if i_spec is not None else ""
        allowed = specs.get(spec_text)
        if allowed is None:
            parts = spec_text.split(_SPEC_SEPARATOR)
            if "" in parts:
                raise TraceFormatError(
                    where, line, f"column 'gpu_spec': empty model name in {spec_text!r}"
                )
            allowed = frozenset(_model(where, line, "gpu_spec", p, models) for p in parts)
            specs[spec_text] = allowed
        first_line = seen.setdefault(name, line)
        if first_line != line:
            raise _duplicate(where, line, "pod", name, first_line)
        try:
            request = Request(
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                gpu_count=num_gpu,
                gpu_milli=gpu_milli if num_gpu > 0 else None,
                gpu_memory_mib=None,
                gpu_models=allowed,
            )
        except InvalidRequestError as exc:  # defensive: the checks above should catch it
            raise TraceFormatError(where, line, str(exc)) from None
        names.append(name)
        requests.append(request)
    if not names:
        raise _no_rows(where, "pod list")
    return PodTrace(names=tuple(names), requests=tuple(requests))
