"""The hand-written declarations (native/include/cuda_api.h, nvml_api.h) against NVIDIA's
real headers, where they are installed.

Every hooked symbol and every function the fake driver / fake NVML exports is declared in our
headers; a translation unit that includes the real header declares each of them again from
our header under another name (``fgpu_ours_<name>``) and assigns it to a pointer of the real
prototype: for CUDA the ``PFN_<base>_v<version>[_ptds|_ptsz]`` typedef of cudaTypedefs.h that
the generated table pairs with the symbol (the exact version, not the newest), for NVML
``__typeof__`` of nvml.h's declaration. Compiled with ``-Werror``, so one wrong parameter type
fails the test. cuda.h comes from the CUDA toolkit (CUDA_HOME or nvcc on PATH), nvml.h from
PyPI's ``nvidia-nvml-dev`` (a dev dependency) or the toolkit; each check is skipped, saying
why, where its header is absent.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.native.cudart_support import REPO, gen_procaddr

from fgpu import native as fgpu_native

INCLUDE = REPO / "native" / "include"
TABLE = INCLUDE / "fgpu_procaddr_table.h"
_DECL = re.compile(r"^(CUresult|nvmlReturn_t|const char \*)\s*(\w+)\(([^;]*?)\);", re.M | re.S)


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


def declarations(header: Path) -> dict[str, tuple[str, str]]:
    """{name: (return type, parameter list)} of the function declarations in ``header``."""
    text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
    return {m.group(2): (m.group(1), " ".join(m.group(3).split())) for m in _DECL.finditer(text)}


def exports(lib: Path, prefix: str) -> set[str]:
    """The defined dynamic symbols of ``lib`` that start with ``prefix``."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return {f[2] for f in (ln.split() for ln in out.splitlines()) if len(f) == 3 and
            f[2].startswith(prefix)}  # fmt: skip


def hooks(native: Path, prefix: str) -> set[str]:
    return exports(native / "libfgpu.so", prefix) - {"fgpu_interposer_hook_names"}


def compile_unit(source: str, include: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    cc = (os.environ.get("CC") or "cc").split()
    path = tmp / "check.c"
    path.write_text(source)
    return subprocess.run(
        [*cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{include}",
         str(path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def cuda_unit(names: set[str], ours: dict[str, tuple[str, str]]) -> str:
    _, rows = gen_procaddr().parse_rendered(TABLE.read_text())
    pfn = {}
    for r in rows:
        suffix = r.symbol[-5:] if r.per_thread else ""
        pfn[r.symbol] = f"PFN_{r.base}_v{r.version}{suffix}"
    # __CUDA_API_VERSION_INTERNAL: cudaTypedefs.h then also types the older symbols the driver
    # still exports (cuGraphInstantiate_v2, cuStreamBeginCapture, cuDevicePrimaryCtxReset ...)
    lines = ["#define __CUDA_API_VERSION_INTERNAL 1", "#include <cudaTypedefs.h>"]
    lines += [f"{ours[n][0]} fgpu_ours_{n}({ours[n][1]});" for n in sorted(names)]
    lines.append("void fgpu_check(void);\nvoid fgpu_check(void)\n{")
    lines += [f"    {pfn[n]} p_{n} = &fgpu_ours_{n};\n    (void)p_{n};" for n in sorted(names)]
    return "\n".join([*lines, "}", ""])


def cuda_include() -> Path:
    home = gen_procaddr().find_cuda_home()
    if home is None or not (home / "include" / "cuda.h").is_file():
        pytest.skip("no CUDA toolkit (CUDA_HOME or nvcc on PATH): the real cuda.h is absent")
    if shutil.which((os.environ.get("CC") or "cc").split()[0]) is None:
        pytest.skip("no C compiler")
    return home / "include"


def test_every_hook_and_fake_export_has_the_real_cuda_prototype(
    native: Path, tmp_path: Path
) -> None:
    include = cuda_include()
    ours = declarations(INCLUDE / "cuda_api.h")
    names = hooks(native, "cu") | exports(native / "fakecuda" / "libcuda.so.1", "cu")
    assert sorted(names - ours.keys()) == [], "exported but not declared in cuda_api.h"
    _, rows = gen_procaddr().parse_rendered(TABLE.read_text())
    assert sorted(names - {r.symbol for r in rows}) == [], "not a CUDA 13 driver symbol"
    assert len(names) > 100
    proc = compile_unit(cuda_unit(names, ours), include, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_the_cuda_check_fails_on_a_wrong_parameter_type(native: Path, tmp_path: Path) -> None:
    include = cuda_include()
    ours = declarations(INCLUDE / "cuda_api.h")
    wrong = {**ours, "cuMemAlloc_v2": ("CUresult", "CUdeviceptr *dptr, unsigned int bytesize")}
    proc = compile_unit(cuda_unit({"cuMemAlloc_v2", "cuInit"}, wrong), include, tmp_path)
    assert proc.returncode != 0
    assert "p_cuMemAlloc_v2" in proc.stderr


def nvml_include() -> Path:
    spec = importlib.util.find_spec("nvidia")
    for root in [*(spec.submodule_search_locations or [] if spec else [])]:
        for header in sorted(Path(root).glob("*/include/nvml.h")):
            return header.parent
    home = gen_procaddr().find_cuda_home()
    if home is not None and (home / "include" / "nvml.h").is_file():
        return home / "include"
    pytest.skip("nvml.h absent: install nvidia-nvml-dev (pip) or a CUDA toolkit with nvml.h")


def nvml_unit(names: set[str], ours: dict[str, tuple[str, str]]) -> str:
    lines = ["#define NVML_NO_UNVERSIONED_FUNC_DEFS 1", "#include <nvml.h>"]
    lines += [f"{ours[n][0]} fgpu_ours_{n}({ours[n][1]});" for n in sorted(names)]
    lines.append("void fgpu_check(void);\nvoid fgpu_check(void)\n{")
    lines += [
        f"    __typeof__(&{n}) p_{n} = &fgpu_ours_{n};\n    (void)p_{n};" for n in sorted(names)
    ]
    return "\n".join([*lines, "}", ""])


def test_every_nvml_hook_and_fake_export_has_the_real_prototype(
    native: Path, tmp_path: Path
) -> None:
    include = nvml_include()
    ours = declarations(INCLUDE / "nvml_api.h")
    names = hooks(native, "nvml") | exports(native / "fakecuda" / "libnvidia-ml.so.1", "nvml")
    assert sorted(names - ours.keys()) == [], "exported but not declared in nvml_api.h"
    assert len(names) > 10
    proc = compile_unit(nvml_unit(names, ours), include, tmp_path)
    assert proc.returncode == 0, proc.stderr
    wrong = {**ours, "nvmlDeviceGetCount_v2": ("nvmlReturn_t", "int *deviceCount")}
    proc = compile_unit(nvml_unit({"nvmlDeviceGetCount_v2"}, wrong), include, tmp_path)
    assert proc.returncode != 0
    assert "p_nvmlDeviceGetCount_v2" in proc.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------------ types and constants


def _bodies(text: str, keyword: str) -> list[tuple[str, str]]:
    """(body, typedef name) of every ``typedef <keyword> [tag] { body } name;``."""
    out = []
    for m in re.finditer(rf"typedef\s+{keyword}\s+\w*\s*\{{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        name = re.match(r"\s*(\w+)\s*;", text[i:])
        if name is not None:
            out.append((text[m.end() : i - 1], name.group(1)))
    return out


def _members(body: str) -> list[str]:
    """The names of a struct body's top-level members."""
    flat, depth = "", 0
    for ch in body:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        flat += ch if depth == 0 or ch in "{}" else ""
    names = []
    for decl in flat.split(";"):
        m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl.strip())
        if m is not None:
            names.append(m.group(1))
    return names


def layout_program(header: Path, real_header: str = "cuda.h", prefix: str = "CU") -> str:
    """A C program that prints the size and alignment of every type ``header`` defines, the
    offset of every top-level struct member and the value of every constant."""
    text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
    text = re.sub(r"_Static_assert\([^;]*;", "", text, flags=re.S)
    types = set(re.findall(r"typedef\s+[^;{}]*?(\w+)\s*;", text))
    lines = []
    for body, name in _bodies(text, "struct"):
        types.add(name)
        lines += [f'    P("offsetof {name}.{m}", offsetof({name}, {m}));' for m in _members(body)]
    consts = set(re.findall(rf"^#define\s+({prefix}\w+)\s+\S", text, re.M))
    for body, name in _bodies(text, "enum"):
        types.add(name)
        consts |= set(re.findall(r"(\w+)\s*(?:=[^,]*)?(?:,|$)", body.strip()))
    for _body, name in _bodies(text, "union"):
        types.add(name)
    types = {t for t in types if not t.lower().startswith("fgpu")}
    consts = {c for c in consts if not c.startswith("FGPU")}
    lines += [f'    P("sizeof {t}", sizeof({t}));' for t in sorted(types)]
    lines += [f'    P("alignof {t}", _Alignof({t}));' for t in sorted(types)]
    lines += [f'    P("value {c}", (uintptr_t)({c}));' for c in sorted(consts) if c]
    return "\n".join([
        "#include <stddef.h>", "#include <stdint.h>", "#include <stdio.h>",
        "#ifdef FGPU_REAL", f"#include <{real_header}>", "#else", f'#include "{header.name}"',
        "#endif",
        '#define P(what, v) printf("%s %llu\\n", what, (unsigned long long)(v))',
        "int main(void)", "{", *lines, "    return 0;", "}", "",
    ])  # fmt: skip


def run_layout(source: Path, include: Path, real: bool, tmp: Path) -> str:
    cc = (os.environ.get("CC") or "cc").split()
    prog = tmp / ("real" if real else "ours")
    flags = ["-DFGPU_REAL"] if real else []
    build = subprocess.run(
        [*cc, "-std=c11", "-w", *flags, f"-I{include}", "-o", str(prog), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    return subprocess.run([str(prog)], capture_output=True, text=True, check=True).stdout


def test_the_types_and_constants_of_cuda_api_h_are_the_real_abi(tmp_path: Path) -> None:
    include = cuda_include()
    source = tmp_path / "layout.c"
    source.write_text(layout_program(INCLUDE / "cuda_api.h"))
    ours = run_layout(source, INCLUDE, False, tmp_path).splitlines()
    real = run_layout(source, include, True, tmp_path).splitlines()
    assert sum(ln.startswith("offsetof") for ln in ours) > 40
    assert sum(ln.startswith("value") for ln in ours) > 90
    assert [a for a, b in zip(ours, real, strict=True) if a != b] == []


def test_the_types_and_constants_of_nvml_api_h_are_the_real_abi(tmp_path: Path) -> None:
    include = nvml_include()
    source = tmp_path / "layout.c"
    source.write_text(layout_program(INCLUDE / "nvml_api.h", "nvml.h", "NVML"))
    ours = run_layout(source, INCLUDE, False, tmp_path).splitlines()
    real = run_layout(source, include, True, tmp_path).splitlines()
    assert sum(ln.startswith("offsetof") for ln in ours) > 10
    assert [a for a, b in zip(ours, real, strict=True) if a != b] == []
