"""The fake driver (a stand-in for tests) answers cuGetProcAddress as a CUDA 13.0 driver:
it reports 13000, hands out the newest prototype a version means (cuCtxCreate_v3/_v4,
cuCtxSynchronize_v2), and has the per-thread variant of every function it implements."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.native.cudart_support import REPO, gen_procaddr
from tests.native.interposer_support import fake_env

from fgpu import native as fgpu_native

GPUS = "GPU-11111111-2222-3333-4444-555555555555=A100-80GB:1024"
TABLE = REPO / "native" / "include" / "fgpu_procaddr_table.h"

# ctypes against the fake: each check prints one JSON value
PROGRAM = r"""
import ctypes, json, sys
cu = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_void_p
gpa = cu.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_int, ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int)]
def get(name, version, flags=0):
    p = P(); st = ctypes.c_int(-1)
    rc = gpa(name.encode(), ctypes.byref(p), version, flags, ctypes.byref(st))
    return rc, st.value, p.value
def same(name, version, symbol, flags=0):
    return get(name, version, flags)[2] == ctypes.cast(getattr(cu, symbol), P).value
out = {}
v = ctypes.c_int(); cu.cuDriverGetVersion(ctypes.byref(v)); out["version"] = v.value
cu.cuInit(0)
out["ctx_v3_at_11040"] = same("cuCtxCreate", 11040, "cuCtxCreate_v3")
out["ctx_v4_at_12050"] = same("cuCtxCreate", 12050, "cuCtxCreate_v4")
out["ctx_v4_at_13000"] = same("cuCtxCreate", 13000, "cuCtxCreate_v4")
out["sync_v2_at_13000"] = same("cuCtxSynchronize", 13000, "cuCtxSynchronize_v2")
out["sync_v1_at_12090"] = same("cuCtxSynchronize", 12090, "cuCtxSynchronize")
out["htod_ptds"] = same("cuMemcpyHtoD", 13000, "cuMemcpyHtoD_v2_ptds", 2)
out["not_implemented"] = get("cuMemHostAlloc", 13000)[:2]
out["too_old"] = get("cuLaunchKernelEx", 11000)[:2]
out["unknown"] = get("cuNoSuchFunction", 13000)[:2]
# the v4 and v3 prototypes, called through what cuGetProcAddress answered
class Affinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("val", ctypes.c_uint)]
class Params(ctypes.Structure):
    _fields_ = [("execAffinityParams", ctypes.POINTER(Affinity)),
                ("numExecAffinityParams", ctypes.c_int), ("cigParams", P)]
v4 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(P), ctypes.POINTER(Params), ctypes.c_uint,
                      ctypes.c_int)(get("cuCtxCreate", 13000)[2])
v3 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(P), ctypes.POINTER(Affinity), ctypes.c_int,
                      ctypes.c_uint, ctypes.c_int)(get("cuCtxCreate", 11040)[2])
sync2 = ctypes.CFUNCTYPE(ctypes.c_int, P)(get("cuCtxSynchronize", 13000)[2])
getdev2 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), P)(
    get("cuCtxGetDevice", 13000)[2])
aff = Affinity(0, 8)
c4, c3, dev = P(), P(), ctypes.c_int(-1)
out["v4_null_params"] = v4(ctypes.byref(c4), None, 0, 0)
out["v4_affinity"] = v4(ctypes.byref(c4), ctypes.byref(Params(ctypes.pointer(aff), 1, None)), 0, 0)
out["v4_cig"] = v4(ctypes.byref(c4), ctypes.byref(Params(None, 0, P(1))), 0, 0)
out["v3_affinity"] = v3(ctypes.byref(c3), ctypes.byref(aff), 1, 0, 0)
out["v3_bad_count"] = v3(ctypes.byref(c3), None, 1, 0, 0)
out["sync_v2_ctx"] = sync2(c3)
out["sync_v2_null"] = sync2(None)
not_a_ctx = ctypes.create_string_buffer(64)  # readable memory that is no context
out["sync_v2_bad"] = sync2(ctypes.cast(not_a_ctx, P))
out["getdev_v2"] = [getdev2(ctypes.byref(dev), c3), dev.value]
htod = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, P, ctypes.c_size_t)(
    get("cuMemcpyHtoD", 13000, 2)[2])
dptr = ctypes.c_uint64()
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
out["alloc"] = cu.cuMemAlloc_v2(ctypes.byref(dptr), 4096)
buf = ctypes.create_string_buffer(4096)
out["htod_ptds_call"] = htod(dptr.value, ctypes.cast(buf, P), 4096)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


def exports(lib: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return {f[2] for f in (ln.split() for ln in out.splitlines()) if len(f) == 3}


def test_the_fake_answers_as_a_cuda_13_driver(native: Path, tmp_path: Path) -> None:
    env = fake_env(native, tmp_path / "fake", GPUS, preload=False)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["version"] == 13000
    for key in ("ctx_v3_at_11040", "ctx_v4_at_12050", "ctx_v4_at_13000", "sync_v2_at_13000",
                "sync_v1_at_12090", "htod_ptds"):  # fmt: skip
        assert out[key] is True, key
    # CUDA_ERROR_NOT_FOUND (500) with SYMBOL_NOT_FOUND (1) / VERSION_NOT_SUFFICIENT (2)
    assert out["not_implemented"] == [500, 1]
    assert out["too_old"] == [500, 2]
    assert out["unknown"] == [500, 1]
    assert (out["v4_null_params"], out["v4_affinity"], out["v3_affinity"]) == (0, 0, 0)
    assert out["v4_cig"] == 801  # CUDA_ERROR_NOT_SUPPORTED: no graphics on the fake
    assert out["v3_bad_count"] == 1  # CUDA_ERROR_INVALID_VALUE
    assert (out["sync_v2_ctx"], out["sync_v2_null"], out["sync_v2_bad"]) == (0, 0, 201)
    assert out["getdev_v2"] == [0, 0]
    assert (out["alloc"], out["htod_ptds_call"]) == (0, 0)


def test_the_fake_has_the_per_thread_and_newest_form_of_what_it_implements(
    native: Path,
) -> None:
    _, rows = gen_procaddr().parse_rendered(TABLE.read_text())
    fake = {s for s in exports(native / "fakecuda" / "libcuda.so.1") if s.startswith("cu")}
    threaded = {r.symbol for r in rows if r.per_thread and r.symbol[:-5] in fake}
    assert sorted(threaded - fake) == []
    newest: dict[str, Any] = {}
    for r in rows:
        if not r.per_thread and r.version >= newest.get(r.base, r).version:
            newest[r.base] = r
    stale = [b for b, r in newest.items() if r.symbol not in fake and any(
        o.symbol in fake for o in rows if o.base == b)]  # fmt: skip
    assert stale == []
    assert {"cuMemcpyHtoD_v2_ptds", "cuMemsetD8_v2_ptds", "cuStreamSynchronize_ptsz"} <= fake
