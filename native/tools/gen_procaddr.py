"""Generate native/include/fgpu_procaddr_table.h from NVIDIA's cudaTypedefs.h (stdlib only).

The CUDA driver answers ``cuGetProcAddress(name, cudaVersion, flags)`` with one of its exported,
versioned symbols. ``cudaTypedefs.h`` names every (base name, first CUDA version) pair as a
typedef ``PFN_<base>_v<version>`` (``_ptds``/``_ptsz`` appended for the per-thread default
stream variants); ``cuda.h`` names the exported symbols (``<base>``, ``<base>_v2``, ...). The
n-th version of a base (oldest first) is its n-th symbol (``<base>`` is the first); a per-thread
typedef of version V is the legacy symbol in force at V with its suffix. The driver's rule
(``lookup`` below, and the same in C in native/include/fgpu_procaddr.h): the legacy row with
the highest version <= cudaVersion; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, that
row's per-thread variant when one exists at cudaVersion.

Usage::

    python native/tools/gen_procaddr.py [--cuda-home DIR] [--check] [--out FILE]

``--cuda-home`` defaults to $CUDA_HOME, else the folder above ``nvcc`` on PATH. ``--check``
writes nothing and exits 1 when the committed file differs from what the header gives.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "include" / "fgpu_procaddr_table.h"
PER_THREAD_FLAG = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

_TYPEDEF = re.compile(r"\bPFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)")
_IDENT = re.compile(r"\b(cu[A-Z]\w*)\b")
_CUDA_VERSION = re.compile(r"^#define\s+CUDA_VERSION\s+(\d+)", re.M)


@dataclass(frozen=True, order=True)
class Row:
    """One (base name, first CUDA version, kind) -> exported symbol pair of the driver.

    Attributes:
        base: the name callers pass, e.g. ``cuMemAlloc``.
        version: the first CUDA version (1000 * major + 10 * minor) that has ``symbol``.
        per_thread: True for a ``_ptds``/``_ptsz`` variant.
        symbol: the exported symbol, e.g. ``cuMemAlloc_v2``.
    """

    base: str
    per_thread: bool
    version: int
    symbol: str


class HeaderError(ValueError):
    """The headers do not follow the naming this generator relies on (message says where)."""


def find_cuda_home(explicit: str | None = None) -> Path | None:
    """The toolkit folder: ``explicit``, else $CUDA_HOME, else the parent of ``nvcc``'s
    folder; None when none holds ``include/cudaTypedefs.h``."""
    candidates = [explicit, os.environ.get("CUDA_HOME")]
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent.parent))
        candidates.append(_nvcc_top(nvcc))
    for c in candidates:
        if c and (Path(c) / "include" / "cudaTypedefs.h").is_file():
            return Path(c)
    return None


def _nvcc_top(nvcc: str) -> str | None:
    """The toolkit folder nvcc reports (``#$ TOP=...`` of a dry run): nvcc on PATH may be a
    wrapper script outside the toolkit."""
    try:
        proc = subprocess.run(
            [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", proc.stdout + proc.stderr, re.M)
    return os.path.realpath(m.group(1).strip()) if m else None


def derive(typedefs_h: str, cuda_h: str) -> tuple[int, list[Row]]:
    """(CUDA_VERSION of cuda.h, the sorted rows) from the two headers' text.

    Raises:
        HeaderError: a base whose typedef versions and cuda.h symbols do not pair up.
    """
    m = _CUDA_VERSION.search(cuda_h)
    if m is None:
        raise HeaderError("cuda.h: no '#define CUDA_VERSION <n>' line")
    cuda_version = int(m.group(1))
    legacy: dict[str, set[int]] = {}
    threaded: dict[str, set[tuple[int, str]]] = {}
    for base, version, suffix in _TYPEDEF.findall(typedefs_h):
        if suffix:
            threaded.setdefault(base, set()).add((int(version), suffix))
        else:
            legacy.setdefault(base, set()).add(int(version))
    idents = set(_IDENT.findall(cuda_h))
    rows: list[Row] = []
    for base, versions in legacy.items():
        numbers = {1}
        for ident in idents:
            m = re.fullmatch(re.escape(base) + r"_v(\d+)", ident)
            if m is not None:
                numbers.add(int(m.group(1)))
        if sorted(numbers) != list(range(1, len(versions) + 1)):
            raise HeaderError(
                f"{base}: cudaTypedefs.h has versions {sorted(versions)} but cuda.h names "
                f"symbol numbers {sorted(numbers)}; cannot pair them"
            )
        ordered = sorted(versions)
        symbols = {v: base if i == 0 else f"{base}_v{i + 1}" for i, v in enumerate(ordered)}
        rows += [Row(base, False, v, s) for v, s in symbols.items()]
        for version, suffix in threaded.pop(base, set()):
            in_force = [v for v in ordered if v <= version]
            if not in_force:
                raise HeaderError(f"{base}_v{version}{suffix}: no legacy version before it")
            symbol = symbols[in_force[-1]] + suffix
            macro = f"__CUDA_API_PT{suffix[3:].upper()}({symbols[in_force[-1]]})"
            if symbol not in idents and macro not in cuda_h:
                raise HeaderError(f"{base}_v{version}{suffix}: cuda.h never names {symbol}")
            rows.append(Row(base, True, version, symbol))
    if threaded:
        raise HeaderError(f"per-thread typedefs without a legacy one: {sorted(threaded)}")
    return cuda_version, sorted(rows, key=lambda r: (r.base.encode(), r.per_thread, r.version))


def lookup(rows: list[Row], name: str, version: int, flags: int) -> str | None:
    """The symbol a driver with ``rows`` answers for ``(name, version, flags)``, or None."""
    legacy = [r for r in rows if r.base == name and not r.per_thread and r.version <= version]
    if not legacy:
        return None
    best = max(legacy, key=lambda r: r.version)
    if flags & PER_THREAD_FLAG:
        for r in rows:
            if (
                r.base == name
                and r.per_thread
                and r.version <= version
                and r.symbol in (best.symbol + "_ptds", best.symbol + "_ptsz")
            ):
                return r.symbol
    return best.symbol


def render(cuda_version: int, rows: list[Row]) -> str:
    """The C header text for ``rows`` (sorted by base in byte order, then kind, version)."""
    lines = [
        "/*",
        " * fgpu_procaddr_table.h - GENERATED by native/tools/gen_procaddr.py from NVIDIA's",
        f" * cudaTypedefs.h and cuda.h of CUDA {cuda_version // 1000}.{cuda_version % 1000 // 10}"
        " (facts only: names and versions).",
        " * Do not edit; rerun the generator. The driver's cuGetProcAddress rule that reads it",
        " * is in fgpu_procaddr.h.",
        " */",
        "#ifndef FGPU_PROCADDR_TABLE_H",
        "#define FGPU_PROCADDR_TABLE_H",
        "",
        "/* CUDA_VERSION of the cuda.h of the table (the fake driver reports it) */",
        f"#define FGPU_PROCADDR_CUDA_VERSION {cuda_version}",
        "",
        "struct fgpu_procaddr_row {",
        "    const char *base;   /* the name callers pass */",
        "    int per_thread;     /* 1: the _ptds/_ptsz variant */",
        "    int version;        /* first CUDA version of symbol */",
        "    const char *symbol; /* the exported symbol */",
        "};",
        "",
        f"#define FGPU_PROCADDR_ROWS {len(rows)}",
        "",
        "/* sorted by base (strcmp order), then per_thread, then version */",
        "static const struct fgpu_procaddr_row fgpu_procaddr_rows[FGPU_PROCADDR_ROWS] = {",
    ]
    lines += [f'    {{"{r.base}", {int(r.per_thread)}, {r.version}, "{r.symbol}"}},' for r in rows]
    lines += ["};", "", "#endif", ""]
    return "\n".join(lines)


def generate(cuda_home: Path) -> str:
    """The header text for the toolkit at ``cuda_home``."""
    inc = cuda_home / "include"
    typedefs = (inc / "cudaTypedefs.h").read_text(errors="replace")
    cuda = (inc / "cuda.h").read_text(errors="replace")
    return render(*derive(typedefs, cuda))


def parse_rendered(text: str) -> tuple[int, list[Row]]:
    """Read a generated header back: (CUDA version, rows)."""
    m = re.search(r"#define FGPU_PROCADDR_CUDA_VERSION (\d+)", text)
    if m is None:
        raise HeaderError("not a generated fgpu_procaddr_table.h (no FGPU_PROCADDR_CUDA_VERSION)")
    rows = [
        Row(b, p == "1", int(v), s)
        for b, p, v, s in re.findall(r'\{"(\w+)", ([01]), (\d+), "(\w+)"\}', text)
    ]
    return int(m.group(1)), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-home", help="CUDA toolkit folder (default: $CUDA_HOME, nvcc)")
    parser.add_argument("--out", default=str(OUT), help=f"output file (default {OUT})")
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    home = find_cuda_home(args.cuda_home)
    if home is None:
        print(
            "no CUDA toolkit with include/cudaTypedefs.h found (--cuda-home, $CUDA_HOME, "
            "nvcc on PATH)",
            file=sys.stderr,
        )
        return 2
    text = generate(home)
    out = Path(args.out)
    if args.check:
        same = out.is_file() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'DIFFERS from'} {home}/include")
        return 0 if same else 1
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
