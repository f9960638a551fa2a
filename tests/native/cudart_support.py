"""NVIDIA's CUDA runtime against the tracing stand-in of libcuda.so.1 (helpers for the tests
and the command that writes the request fixture).

The tracing stand-in (``trace/libcuda.so.1``, native/tests/cutrace.c) is the fake driver that
also records every ``cuGetProcAddress``/``_v2`` request (name, cudaVersion, flags) and every
``cuGetExportTable`` UUID. :func:`trace_runtime` builds ``native/tests/cudart_probe.c`` with
the installed toolkit's headers, links it to the toolkit's ``libcudart.so``, runs it against
the stand-in and returns what the runtime asked. Regenerate the fixture with::

    .venv/bin/python -m tests.native.cudart_support [--cuda-home DIR]

(it writes tests/data/cudart_requests.json).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "data" / "cudart_requests.json"
PROBE_SOURCE = REPO / "native" / "tests" / "cudart_probe.c"
GPUS = "GPU-7e3c0000-0000-4000-8000-000000000001=A100-80GB:1024"


def gen_procaddr() -> ModuleType:
    """native/tools/gen_procaddr.py as a module (it is a script, not a package)."""
    path = REPO / "native" / "tools" / "gen_procaddr.py"
    spec = importlib.util.spec_from_file_location("gen_procaddr", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_procaddr", module)
    spec.loader.exec_module(module)
    return module


def toolkit(cuda_home: str | None = None) -> tuple[Path | None, str]:
    """(the toolkit folder, "") when it has the runtime and headers the probe needs, else
    (None, the reason)."""
    home = gen_procaddr().find_cuda_home(cuda_home)
    if home is None:
        return None, "no CUDA toolkit: set CUDA_HOME or put nvcc on PATH"
    for part in ("lib64/libcudart.so", "include/cuda_runtime_api.h"):
        if not (home / part).exists():
            return None, f"the CUDA toolkit at {home} has no {part}"
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        return None, f"no C compiler {cc!r} to build the runtime probe"
    return home, ""


def build_probe(home: Path, out: Path) -> Path:
    """Compile native/tests/cudart_probe.c against ``home``'s runtime; return the program."""
    cc = (os.environ.get("CC") or "cc").split()
    lib = home / "lib64"
    prog = out / "fgpu-cudart-probe"
    cmd = [
        *cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{home / 'include'}",
        "-o", str(prog), str(PROBE_SOURCE), f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the probe failed: {' '.join(cmd)}\n{proc.stderr}")
    return prog


def runtime_identity(home: Path) -> dict[str, Any]:
    """The runtime library's file name, size and SHA-256 (which build the fixture came from)."""
    real = (home / "lib64" / "libcudart.so").resolve()
    data = real.read_bytes()
    return {"file": real.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def parse_trace(text: str) -> dict[str, Any]:
    """The stand-in's trace lines as {"procaddr": [[name, version, flags, symbol|None]],
    "export_tables": [[uuid, result]]}, in request order; symbol: what a real driver answers
    (the fake's rule; the fake's own result is left out: it implements only some symbols)."""
    procaddr: list[list[Any]] = []
    tables: list[list[Any]] = []
    for line in text.splitlines():
        f = line.split("\t")
        if f[0] == "procaddr" and len(f) == 6:
            procaddr.append([f[1], int(f[2]), int(f[3]), f[5] or None])
        elif f[0] == "exporttable" and len(f) == 3:
            tables.append([f[1], int(f[2])])
        else:
            raise ValueError(f"trace line not understood: {line!r}")
    return {"procaddr": procaddr, "export_tables": tables}


def trace_runtime(native: Path, home: Path, work: Path) -> dict[str, Any]:
    """Run the probe against ``native``'s tracing stand-in; return the fixture's content."""
    prog = build_probe(home, work)
    trace = work / "trace.txt"
    trace.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FGPU_", "LD_", "CUDA_"))}
    env.update(
        LD_LIBRARY_PATH=str(native / "trace"),
        FGPU_TRACE_OUT=str(trace),
        FGPU_FAKE_GPU_STATE=str(work / "fake.state"),
        FGPU_FAKE_GPUS=GPUS,
    )
    proc = subprocess.run(
        [str(prog)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the probe failed ({proc.returncode}): {proc.stderr}")
    probe = json.loads(proc.stdout)
    return {
        "runtime_version": probe["runtime_version"],
        "runtime_library": runtime_identity(home),
        "driver_version_reported": probe["driver_version"],
        "runtime_results": probe["results"],
        **parse_trace(trace.read_text()),
    }


def render_fixture(data: dict[str, Any]) -> str:
    """JSON with one request per line (reviewable diffs)."""
    lists = ("procaddr", "export_tables")
    head = json.dumps({k: v for k, v in data.items() if k not in lists}, indent=1)[:-2]
    parts = [head]
    for key in lists:
        rows = ",\n".join("  " + json.dumps(r) for r in data[key])
        parts.append(f',\n "{key}": [\n{rows}\n ]')
    return "".join(parts) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write tests/data/cudart_requests.json.")
    parser.add_argument("--cuda-home", help="CUDA toolkit folder (default: $CUDA_HOME, nvcc)")
    args = parser.parse_args(argv)
    home, reason = toolkit(args.cuda_home)
    if home is None:
        print(reason, file=sys.stderr)
        return 2
    from fgpu import native as fgpu_native

    native = fgpu_native.ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        data = trace_runtime(native, home, Path(tmp))
    data = {
        "how": "python -m tests.native.cudart_support: native/tests/cudart_probe.c linked to "
        "the toolkit's libcudart.so, run against trace/libcuda.so.1 (the fake driver that "
        "records requests); procaddr rows are [name, cudaVersion, flags, the symbol a real "
        "driver answers (fgpu_procaddr.h)]; export_tables rows are [UUID, the fake's CUresult]",
        **data,
    }
    FIXTURE.write_text(render_fixture(data))
    print(f"{FIXTURE}: {len(data['procaddr'])} requests, runtime {data['runtime_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
