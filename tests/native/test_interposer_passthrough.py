"""libfgpu must not be noticed where it has nothing to do, and must say why it stands aside.

Unrelated programs (bash, python, a C program that dlopens a library by a relative name
through its own RUNPATH) behave the same with libfgpu.so preloaded: same output, same exit
status, nothing on stderr. FGPU_INTERPOSER=off and a missing or bad segment pass every call
through (the latter says why, once, on stderr). The hook list (hooks.h) is what the library
exports, what the fake driver provides, and what the dlopen shim hands out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import MIB, AgentLib, fake_env

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
CAP = 1024 * MIB

RUNPATH_MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libplugin.so", RTLD_NOW);   /* found only through our RUNPATH */
    if (h == NULL) { printf("dlopen failed: %s\n", dlerror()); return 3; }
    int (*f)(void) = (int (*)(void))dlsym(h, "plugin_value");
    printf("plugin says %d\n", f());
    return 7;
}
"""


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


@pytest.fixture
def seg(tmp_path: Path, native: Path) -> Iterator[tuple[AgentLib, Path]]:
    agent = AgentLib(native)
    path = tmp_path / "seg"
    agent.create(path, [UUID], [CAP])
    yield agent, path
    agent.close()


@pytest.fixture(scope="module")
def runpath_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("runpath")
    (d / "lib").mkdir()
    (d / "plugin.c").write_text("int plugin_value(void) { return 42; }\n")
    (d / "main.c").write_text(RUNPATH_MAIN)
    plugin = d / "lib" / "libplugin.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(plugin), str(d / "plugin.c")], check=True)
    subprocess.run(
        [
            cc,
            "-o",
            str(d / "main"),
            str(d / "main.c"),
            "-ldl",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib",
        ],
        check=True,
    )
    return d / "main"


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


UNRELATED = [
    pytest.param(["bash", "-c", "echo hello $((6*7)); ls / >/dev/null; exit 5"], id="bash"),
    pytest.param(
        [
            sys.executable,
            "-c",
            "import ctypes, ctypes.util, json, sqlite3, ssl; "
            "libm = ctypes.CDLL(ctypes.util.find_library('m')); "
            "libm.cos.restype = ctypes.c_double; libm.cos.argtypes = [ctypes.c_double]; "
            "print(json.dumps({'cos0': libm.cos(0.0), 'sqlite': sqlite3.sqlite_version > ''}))",
        ],
        id="python-ctypes-json",
    ),
]


@pytest.mark.parametrize("argv", UNRELATED)
@pytest.mark.parametrize("with_seg", [True, False], ids=["segment", "no-segment"])
def test_unrelated_programs_do_not_notice(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path], argv: list[str], with_seg: bool
) -> None:
    plain = fake_env(native, tmp_path / "fakegpu", GPUS, preload=False)
    loaded = fake_env(
        native, tmp_path / "fakegpu", GPUS, seg=seg[1] if with_seg else None, FGPU_LOG="debug"
    )
    assert run(argv, loaded) == run(argv, plain)
    assert run(argv, loaded)[2] == "", "nothing on stderr, even at FGPU_LOG=debug"
    assert seg[0].snapshot().processes == 0


def test_relative_dlopen_through_the_callers_runpath_still_works(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path], runpath_program: Path
) -> None:
    plain = fake_env(native, tmp_path / "fakegpu", GPUS, preload=False)
    loaded = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1])
    want = (7, "plugin says 42\n", "")
    assert run([str(runpath_program)], plain) == want
    assert run([str(runpath_program)], loaded) == want


def cudemo(native: Path, env: dict[str, str], *args: str) -> tuple[dict[str, object], str]:
    proc = subprocess.run(
        [str(native / "bin" / "fgpu-cudemo"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("path", [[], ["--dlopen"]], ids=["linked", "dlopen-procaddr"])
def test_interposer_off_passes_through(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path], path: list[str]
) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1], FGPU_INTERPOSER="off")
    out, err = cudemo(native, env, *path, "alloc", "mem", str(2 * CAP))
    assert out["error"] == "CUDA_SUCCESS"
    assert out["total"] == 81920 * MIB, "the fake GPU's own total, not the cap"
    assert err == ""
    spin, _ = cudemo(native, env, *path, "spin", "1000", "3")
    assert spin["launches"] == 3
    snap = seg[0].snapshot()
    assert (snap.processes, snap.launches, snap.gpus[0].memory_peak) == (0, 0, 0)


def write_bad(path: Path, how: str, native: Path) -> None:
    if how == "missing":
        return
    if how == "short":
        path.write_bytes(b"FGPU")
        return
    agent = AgentLib(native)
    agent.create(path, [UUID], [CAP])
    agent.close()
    data = bytearray(path.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")  # version
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("missing", "cannot open"),
        ("short", "file size 4 is smaller than the segment"),
        ("version", "version 99, this library reads version 3"),
    ],
)
def test_a_missing_or_bad_segment_passes_through_and_says_why_once(
    native: Path, tmp_path: Path, how: str, reason: str
) -> None:
    bad = tmp_path / "bad-seg"
    write_bad(bad, how, native)
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=bad)
    out, err = cudemo(native, env, "alloc", "mem", str(2 * CAP))
    assert out["error"] == "CUDA_SUCCESS"
    lines = [line for line in err.splitlines() if "FGPU_SEG" in line]
    assert len(lines) == 1, err
    assert reason in lines[0]
    assert str(bad) in lines[0]
    assert "every call passes through" in lines[0]


def test_no_segment_variable_passes_through_and_says_so(native: Path, tmp_path: Path) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS)
    out, err = cudemo(native, env, "alloc", "mem", str(2 * CAP))
    assert out["error"] == "CUDA_SUCCESS"
    assert err.count("FGPU_SEG is not set") == 1


def test_quiet_by_default_with_a_good_segment(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1])
    out, err = cudemo(native, env, "alloc", "mem", str(2 * CAP))
    assert out["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert err == ""


HOOK_CHECK = r"""
import ctypes, json, sys
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
def owner(p):
    info = DlInfo()
    assert libc.dladdr(p, ctypes.byref(info)) != 0
    return info.fname.decode().rsplit("/", 1)[-1]
names = json.loads(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")        # the interposer answers with its shim
nvml = ctypes.CDLL("libnvidia-ml.so.1")
out = {}
for name in names + ["cuDeviceGet", "cuCtxGetCurrent", "nvmlInit_v2"]:
    lib = nvml if name.startswith("nvml") else cuda
    out[name] = owner(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
print(json.dumps(out))
"""


def test_hook_list_is_exported_provided_and_handed_out(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    import ctypes

    lib = ctypes.CDLL(str(native / "libfgpu.so"))
    lib.fgpu_interposer_hook_names.restype = ctypes.POINTER(ctypes.c_char_p)
    table = lib.fgpu_interposer_hook_names()
    names: list[str] = []
    while table[len(names)] is not None:
        names.append(table[len(names)].decode())
    assert len(names) == len(set(names)) > 40

    def exported(path: Path) -> set[str]:
        out = subprocess.run(
            ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
        ).stdout
        return {
            line.split()[-1] for line in out.splitlines() if line.split()[-1][:2] in ("cu", "nv")
        }

    assert exported(native / "libfgpu.so") == set(names), "hooks.h is exactly what is exported"
    fake = exported(native / "fakecuda" / "libcuda.so.1") | exported(
        native / "fakecuda" / "libnvidia-ml.so.1"
    )
    assert set(names) <= fake, f"not in the fake driver: {sorted(set(names) - fake)}"
    for required in (
        "cuMemAlloc_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemCreate",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuArrayCreate_v2",
        "cuArray3DCreate_v2",
        "cuMipmappedArrayCreate",
        "cuGraphInstantiate",
        "cuGraphInstantiate_v2",
        "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithParams",
        "cuGraphInstantiateWithParams_ptsz",
        "cuCtxSetLimit",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxReset_v2",
        "cuDeviceTotalMem_v2",
        "cuMemGetInfo_v2",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
        "cuMemcpyHtoDAsync_v2",
        "cuMemsetD32Async_ptsz",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
    ):
        assert required in names

    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1])
    proc = subprocess.run(
        [sys.executable, "-c", HOOK_CHECK, json.dumps(names)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    owners = json.loads(proc.stdout)
    assert {n: owners[n] for n in names} == dict.fromkeys(names, "libfgpu.so")
    assert owners["cuDeviceGet"] == "libcuda.so.1", "everything else is the driver's own"
    assert owners["cuCtxGetCurrent"] == "libcuda.so.1"
    assert owners["nvmlInit_v2"] == "libnvidia-ml.so.1"


NOLOAD_CHECK = r"""
import ctypes, json, os
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
def owner(p):
    info = DlInfo()
    assert libc.dladdr(p, ctypes.byref(info)) != 0
    return info.fname.decode().rsplit("/", 1)[-1]
try:
    ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    before = "loaded"
except OSError:
    before = "not loaded"
ctypes.CDLL("libcuda.so.1")
after = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
print(json.dumps({"before": before,
                  "after": owner(ctypes.cast(after.cuMemAlloc_v2, ctypes.c_void_p).value)}))
"""


@pytest.mark.parametrize("preload", [False, True], ids=["plain", "preloaded"])
def test_rtld_noload_answers_as_the_driver_would(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path], preload: bool
) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1], preload=preload)
    proc = subprocess.run(
        [sys.executable, "-c", NOLOAD_CHECK], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["before"] == "not loaded"
    assert out["after"] == ("libfgpu.so" if preload else "libcuda.so.1")
