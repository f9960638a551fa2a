"""The CUDA runtime's own cuGetProcAddress requests, and what the interposer answers them.

tests/data/cudart_requests.json is what NVIDIA's libcudart.so.13 asks the driver for before
its first allocation (written by ``python -m tests.native.cudart_support``, see
tests/native/cudart_support.py): each request with the symbol a real driver answers. Where
the toolkit is installed the runtime is run again against the tracing stand-in and must ask
the same. Every request whose answer is a hooked symbol must get that symbol's hook under
both procaddr rules (pointer identity, and the name rule for drivers that answer with
internal addresses); no request may get the hook of another symbol. The name rule itself is
the driver's, derived from cudaTypedefs.h (native/tools/gen_procaddr.py): the generated table
must be what the installed header gives, and the C rule (run in the fake driver) must answer
what the generator's Python rule answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.native.cudart_support import FIXTURE, REPO, gen_procaddr, toolkit, trace_runtime
from tests.native.interposer_support import MIB, AgentLib, fake_env

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
TABLE = REPO / "native" / "include" / "fgpu_procaddr_table.h"
WORKER = Path(__file__).with_name("procaddr_worker.py")
PER_THREAD = 2


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


@pytest.fixture(scope="module")
def fixture() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


@pytest.fixture(scope="module")
def rows() -> list[Any]:
    version, rows = gen_procaddr().parse_rendered(TABLE.read_text())
    assert version == 13000
    assert len(rows) > 600
    return rows


@pytest.fixture
def seg(tmp_path: Path, native: Path) -> Iterator[Path]:
    agent = AgentLib(native)
    path = tmp_path / "seg"
    agent.create(path, [UUID], [1024 * MIB])
    yield path
    agent.close()


def hook_names(native: Path) -> set[str]:
    code = (
        "import ctypes,sys;f=ctypes.CDLL(sys.argv[1]).fgpu_interposer_hook_names;"
        "f.restype=ctypes.POINTER(ctypes.c_char_p);t=f();i=0\n"
        "while t[i]: print(t[i].decode()); i+=1"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(native / "libfgpu.so")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return {n for n in out.split() if n.startswith("cu")}


# ------------------------------------------------------------------ the table and the rule


def test_the_generated_table_is_what_the_installed_header_gives() -> None:
    home = gen_procaddr().find_cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit (CUDA_HOME or nvcc on PATH): cudaTypedefs.h absent")
    assert gen_procaddr().generate(home) == TABLE.read_text(), (
        f"native/include/fgpu_procaddr_table.h differs from {home}/include/cudaTypedefs.h: "
        "rerun python native/tools/gen_procaddr.py"
    )


def test_the_table_pairs_each_version_with_its_own_symbol(rows: list[Any]) -> None:
    lookup = gen_procaddr().lookup
    assert lookup(rows, "cuMemAlloc", 3020, 0) == "cuMemAlloc_v2"
    assert lookup(rows, "cuMemAlloc", 2000, 0) == "cuMemAlloc"
    assert lookup(rows, "cuCtxSynchronize", 12090, 0) == "cuCtxSynchronize"
    assert lookup(rows, "cuCtxSynchronize", 13000, 0) == "cuCtxSynchronize_v2"
    assert [lookup(rows, "cuCtxCreate", v, 0) for v in (2000, 3020, 11040, 12050, 13000)] == [
        "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cuCtxCreate_v4",
    ]  # fmt: skip
    assert lookup(rows, "cuMemcpyHtoD", 13000, PER_THREAD) == "cuMemcpyHtoD_v2_ptds"
    assert lookup(rows, "cuMemcpyHtoD", 13000, 1) == "cuMemcpyHtoD_v2"
    assert lookup(rows, "cuStreamSynchronize", 13000, PER_THREAD) == "cuStreamSynchronize_ptsz"
    assert lookup(rows, "cuStreamSynchronize", 6050, PER_THREAD) == "cuStreamSynchronize"
    assert lookup(rows, "cuStreamGetCtx", 12040, PER_THREAD) == "cuStreamGetCtx_ptsz"
    assert lookup(rows, "cuStreamGetCtx", 12050, PER_THREAD) == "cuStreamGetCtx_v2_ptsz"
    assert lookup(rows, "cuLaunchKernelEx", 11050, 0) is None
    assert lookup(rows, "cuNoSuchFunction", 13000, 0) is None


def queries(rows: list[Any]) -> list[tuple[str, int, int]]:
    """Every base at each of its versions, one below, 13000 and far above; every flag."""
    out: set[tuple[str, int, int]] = set()
    for r in rows:
        for v in (r.version - 10, r.version, 13000, 99000):
            for flags in (0, 1, PER_THREAD):
                out.add((r.base, v, flags))
    out |= {("cuNoSuchFunction", 13000, 0), ("", 0, 0)}
    return sorted(out)


def test_the_fake_driver_answers_every_query_as_the_generators_rule(
    native: Path, rows: list[Any], tmp_path: Path
) -> None:
    # the tracing stand-in records the symbol the fake's C rule chose (implemented or not)
    qs = queries(rows)
    (tmp_path / "q.json").write_text(json.dumps(qs))
    trace = tmp_path / "trace.txt"
    code = (
        "import ctypes,json,sys\n"
        "cu=ctypes.CDLL('libcuda.so.1');g=cu.cuGetProcAddress_v2\n"
        "g.argtypes=[ctypes.c_char_p,ctypes.POINTER(ctypes.c_void_p),ctypes.c_int,"
        "ctypes.c_uint64,ctypes.POINTER(ctypes.c_int)]\n"
        "for n,v,f in json.load(open(sys.argv[1])):\n"
        " p=ctypes.c_void_p();s=ctypes.c_int();g(n.encode(),ctypes.byref(p),v,f,ctypes.byref(s))"
    )
    env = fake_env(native, tmp_path / "fake", GPUS, preload=False, FGPU_TRACE_OUT=str(trace))
    env["LD_LIBRARY_PATH"] = str(native / "trace")
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "q.json")], env=env, timeout=300, check=True
    )
    lines = [ln.split("\t") for ln in trace.read_text().splitlines()]
    got = {(f[1], int(f[2]), int(f[3])): f[5] or None for f in lines if f[0] == "procaddr"}
    lookup = gen_procaddr().lookup
    wrong = [(q, got.get(q), lookup(rows, *q)) for q in qs if got.get(q) != lookup(rows, *q)]
    assert len(got) == len(qs) > 5000
    assert wrong == []


# ------------------------------------------------------------------ the runtime's requests


def test_the_fixture_holds_the_runtimes_requests_with_the_drivers_answers(
    fixture: dict[str, Any], rows: list[Any]
) -> None:
    assert fixture["runtime_version"] == 13000
    assert fixture["driver_version_reported"] == 13000
    requests = fixture["procaddr"]
    assert len(requests) > 400
    lookup = gen_procaddr().lookup
    assert [r[3] for r in requests] == [lookup(rows, *r[:3]) for r in requests]
    asked = {(r[0], r[1]) for r in requests}
    # the requests below CUDA 4.0 that the old name rule refused
    assert {("cuMemAlloc", 3020), ("cuMemFree", 3020), ("cuCtxSynchronize", 2000)} <= asked
    # the runtime stops at its private export tables, which the fake does not have
    assert fixture["export_tables"]
    assert all(rc == 500 for _, rc in fixture["export_tables"])


def test_the_installed_runtime_asks_what_the_fixture_records(
    native: Path, fixture: dict[str, Any], tmp_path: Path
) -> None:
    home, reason = toolkit()
    if home is None:
        pytest.skip(reason)
    live = trace_runtime(native, home, tmp_path)
    if live["runtime_version"] != fixture["runtime_version"]:
        pytest.skip(
            f"the installed runtime is {live['runtime_version']}, the fixture's "
            f"{fixture['runtime_version']}: regenerate it (python -m tests.native.cudart_support)"
        )
    assert live["driver_version_reported"] == 13000
    assert live["procaddr"] == fixture["procaddr"]
    assert live["export_tables"] == fixture["export_tables"]
    assert live["runtime_results"] == fixture["runtime_results"]


@pytest.mark.parametrize("rule", ["auto", "pointers", "names"])
def test_every_runtime_request_for_a_hooked_symbol_gets_its_hook(
    native: Path, fixture: dict[str, Any], seg: Path, tmp_path: Path, rule: str
) -> None:
    hooked = hook_names(native)
    env = fake_env(native, tmp_path / "fake", GPUS, seg=seg, FGPU_PROCADDR=rule)
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(FIXTURE), str(native / "libfgpu.so")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(proc.stdout)["answers"]
    assert len(answers) == len(fixture["procaddr"])
    missing, wrong = [], []
    for (name, version, flags, symbol), (_, _, _, rc, what) in zip(
        fixture["procaddr"], answers, strict=True
    ):
        request = f"{name}@{version}/{flags}->{symbol}"
        if symbol in hooked and (rc, what) != (0, symbol):
            missing.append(f"{request}: got {what} (rc {rc})")
        elif symbol not in hooked and what not in (None, "driver"):
            wrong.append(f"{request}: got the hook of {what}")
    assert missing == [], "requests for a hooked symbol that did not get its hook"
    assert wrong == [], "requests answered with the hook of another symbol"
    # the requests that matter for the caps are in the fixture and hooked
    assert {"cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2"} <= {
        r[3] for r in fixture["procaddr"]
    }


def test_a_request_above_the_tables_version_is_hooked_when_the_driver_agrees(
    native: Path, seg: Path, tmp_path: Path
) -> None:
    # a CUDA 14 program asks at 14000: the driver (here the fake) answers the same function
    # as at 13000, so the name rule may hook it (a driver answering a newer _v3 would not be)
    requests = [
        ["cuMemAlloc", 14000, 0, "cuMemAlloc_v2"],
        ["cuCtxSynchronize", 14000, 0, "cuCtxSynchronize_v2"],
        ["cuMemAllocAsync", 14000, PER_THREAD, "cuMemAllocAsync_ptsz"],
        ["cuMemAlloc", 2000, 0, "cuMemAlloc"],  # the 32-bit v1: not hooked, not the fake's
    ]
    path = tmp_path / "requests.json"
    path.write_text(json.dumps({"procaddr": requests}))
    env = fake_env(native, tmp_path / "fake", GPUS, seg=seg, FGPU_PROCADDR="names")
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(path), str(native / "libfgpu.so")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    answers = [a[3:] for a in json.loads(proc.stdout)["answers"]]
    assert answers == [[0, "cuMemAlloc_v2"], [0, "cuCtxSynchronize_v2"],
                       [0, "cuMemAllocAsync_ptsz"], [500, None]]  # fmt: skip
