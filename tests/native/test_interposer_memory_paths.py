"""libfgpu caps device memory on the roads beside the allocation calls (fgpu-cupaths).

Graph memory nodes however they reach a graph (``cuGraphAddMemAllocNode``,
``cuGraphAddNode`` / ``_v2``, stream capture of ``cuMemAllocAsync``, a child graph moved
into its parent) under every instantiate
entry point (``WithFlags``, ``WithParams`` with and without upload, ``cuGraphUpload``, the
pre-12.0 ``cuGraphInstantiate`` / ``_v2``); the malloc heap limit; primary-context release and
reset (the ``cudaDeviceReset`` path) and context destroy give back what the context held;
``cuDeviceTotalMem`` says the cap. The program runs linked to ``libcuda.so.1`` and through
``dlopen`` + ``dlsym`` (``--dlopen``), against the fake driver (a stand-in for
``libcuda.so.1`` written for the tests). The same program is also built with the CUDA
toolkit's ``nvcc`` against the toolkit's own ``cuda.h`` where one is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import MIB, AgentLib, fake_env

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
FAKE_TOTAL = 81920 * MIB
CAP = 1024 * MIB
OVER = CAP + 64 * MIB
FITS = 600 * MIB
ROADS = ["allocnode", "addnode", "addnode-v1", "capture", "child"]
INSTS = ["flags", "params", "params-upload", "upload", "legacy", "legacy-v1"]
PATHS = [pytest.param([], id="linked"), pytest.param(["--dlopen"], id="dlopen")]
SOURCE = Path(__file__).resolve().parents[2] / "native" / "tests" / "cupaths.c"


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


@pytest.fixture
def env(native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]) -> dict[str, str]:
    return fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1])


def cupaths(program: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    proc = subprocess.run(
        [str(program), *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def program(native: Path) -> Path:
    return native / "bin" / "fgpu-cupaths"


def reserved(agent: AgentLib) -> int:
    return int(agent.snapshot().gpus[0].memory_reserved)


# ------------------------------------------------------------------ the device's size


@pytest.mark.parametrize("path", PATHS)
def test_device_total_memory_says_the_cap(
    native: Path, env: dict[str, str], path: list[str]
) -> None:
    out = cupaths(program(native), env, *path, "totalmem")
    assert out == {"error": "CUDA_SUCCESS", "total_mem": CAP, "meminfo_total": CAP}


def test_without_a_cap_the_device_total_is_the_drivers(native: Path, tmp_path: Path) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, preload=False)
    out = cupaths(program(native), env, "totalmem")
    assert out["total_mem"] == out["meminfo_total"] == FAKE_TOTAL


# ------------------------------------------------------------------ graph memory


@pytest.mark.parametrize("inst", INSTS)
@pytest.mark.parametrize("road", ROADS)
def test_graph_memory_over_the_cap_is_refused_at_instantiation(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], road: str, inst: str
) -> None:
    out = cupaths(program(native), env, "graph", road, inst, str(OVER), "free")
    assert out["build_error"] == "CUDA_SUCCESS", out
    assert out["inst_error"] == "CUDA_ERROR_OUT_OF_MEMORY", out
    snap = seg[0].snapshot()
    assert snap.gpus[0].oom_count == 1
    assert snap.gpus[0].oom_last_bytes == OVER
    assert snap.gpus[0].memory_reserved == 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("inst", INSTS)
@pytest.mark.parametrize("road", ROADS)
def test_graph_memory_is_held_for_the_executable_graph(
    native: Path,
    env: dict[str, str],
    seg: tuple[AgentLib, Path],
    road: str,
    inst: str,
    path: list[str],
) -> None:
    out = cupaths(program(native), env, *path, "graph", road, inst, str(FITS), "free")
    assert out["inst_error"] == out["launch_error"] == "CUDA_SUCCESS", out
    assert out["free_before"] == CAP
    assert out["free_instantiated"] == out["free_launched"] == CAP - FITS
    assert out["free_after"] == CAP, "given back at cuGraphExecDestroy"
    snap = seg[0].snapshot()
    assert snap.gpus[0].memory_peak == FITS
    assert snap.gpus[0].memory_reserved == 0


@pytest.mark.parametrize("road", ROADS)
def test_graph_memory_the_graph_does_not_free_lives_until_cumemfree(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], road: str
) -> None:
    out = cupaths(program(native), env, "graph", road, "params", str(FITS), "keep")
    assert out["inst_error"] == out["launch_error"] == "CUDA_SUCCESS", out
    # still held after cuGraphExecDestroy: the launch left it allocated
    assert out["free_launched"] == CAP - FITS
    assert out["free_after"] == CAP, "given back at cuMemFree of its address"
    assert reserved(seg[0]) == 0


@pytest.mark.parametrize("road", ["allocnode", "capture"])
def test_an_executable_graph_left_to_a_device_reset_is_given_back(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], road: str
) -> None:
    out = cupaths(program(native), env, "graph", road, "flags", str(FITS), "reset")
    assert out["inst_error"] == out["launch_error"] == "CUDA_SUCCESS", out
    assert out["free_launched"] == CAP - FITS
    assert out["free_after"] == CAP, "the reset ended the executable graph"
    assert reserved(seg[0]) == 0


def test_two_graphs_that_together_pass_the_cap_cannot_both_be_instantiated(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    # one process holds a 600 MiB graph while a second asks for another 600 MiB
    holder = subprocess.Popen(
        [str(native / "bin" / "fgpu-cudemo"), "hold", str(FITS)],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert "CUDA_SUCCESS" in line, line
        out = cupaths(program(native), env, "graph", "capture", "params", str(FITS), "free")
        assert out["inst_error"] == "CUDA_ERROR_OUT_OF_MEMORY", out
        assert reserved(seg[0]) == FITS
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder frees and ends
        holder.wait(timeout=60)


# ------------------------------------------------------------------ the malloc heap


@pytest.mark.parametrize("path", PATHS)
def test_malloc_heap_limit_is_charged_to_the_cap(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], path: list[str]
) -> None:
    over = cupaths(program(native), env, *path, "heap", str(OVER), str(100 * MIB))
    assert over["set_error"] == "CUDA_ERROR_OUT_OF_MEMORY", over
    assert seg[0].snapshot().gpus[0].oom_last_bytes == OVER
    out = cupaths(program(native), env, *path, "heap", str(FITS), str(100 * MIB))
    assert out["set_error"] == out["lower_error"] == out["reset_error"] == "CUDA_SUCCESS", out
    assert out["free_set"] == CAP - FITS
    assert out["free_lowered"] == CAP - 100 * MIB, "lowering gives the difference back"
    assert out["free_reset"] == CAP, "the reset context's heap is given back"
    assert reserved(seg[0]) == 0


# ------------------------------------------------------------------ contexts that end

ALLOC = 700 * MIB  # twice this is past the cap: the second allocation fits only if the first went


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["reset", "release", "destroy"])
def test_memory_of_an_ended_context_is_given_back(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], mode: str, path: list[str]
) -> None:
    out = cupaths(program(native), env, *path, "ctx", mode, str(ALLOC))
    assert out["alloc_error"] == out[f"{mode}_error"] == "CUDA_SUCCESS", out
    assert out["free_allocated"] == CAP - ALLOC
    assert out["again_error"] == "CUDA_SUCCESS", "no false out-of-memory after the context ended"
    assert out["free_again"] == CAP - ALLOC
    assert seg[0].snapshot().gpus[0].oom_count == 0


def test_pool_memory_outlives_its_context_and_stays_counted(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    # cuda.h (cuCtxDestroy): cuMemAllocAsync / cuMemCreate memory is not freed with a context
    out = cupaths(program(native), env, "ctx", "destroy-async", str(ALLOC))
    assert out["alloc_error"] == out["destroy-async_error"] == "CUDA_SUCCESS", out
    assert out["again_error"] == "CUDA_ERROR_OUT_OF_MEMORY", "still held by the driver"
    assert out["free_again"] == CAP - ALLOC


def test_releasing_a_primary_context_still_held_keeps_its_memory_counted(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    out = cupaths(program(native), env, "ctx", "release-held", str(ALLOC))
    assert out["alloc_error"] == out["release-held_error"] == "CUDA_SUCCESS", out
    assert out["again_error"] == "CUDA_ERROR_OUT_OF_MEMORY", "the context (and memory) live on"
    assert out["free_again"] == CAP - ALLOC


# ------------------------------------------------------------------ the fake driver itself


@pytest.mark.parametrize("mode", ["reset", "release", "destroy"])
def test_fake_driver_frees_a_contexts_memory_when_it_ends(
    native: Path, tmp_path: Path, mode: str
) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, preload=False)
    out = cupaths(program(native), env, "ctx", mode, str(ALLOC))
    assert out["free_allocated"] == FAKE_TOTAL - ALLOC
    assert out["again_error"] == "CUDA_SUCCESS"
    assert out["free_again"] == FAKE_TOTAL - ALLOC, "the first allocation went with its context"
    held = cupaths(program(native), env, "ctx", "release-held", str(ALLOC))
    assert held["free_again"] == FAKE_TOTAL - 2 * ALLOC
    pool = cupaths(program(native), env, "ctx", "destroy-async", str(ALLOC))
    assert pool["free_again"] == FAKE_TOTAL - 2 * ALLOC, "pool memory outlives its context"


def test_fake_driver_takes_the_heap_and_graph_memory_at_the_right_time(
    native: Path, tmp_path: Path
) -> None:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, preload=False)
    heap = cupaths(program(native), env, "heap", str(FITS), str(100 * MIB))
    assert heap["free_set"] == FAKE_TOTAL - FITS
    assert heap["free_lowered"] == FAKE_TOTAL - 100 * MIB
    assert heap["free_reset"] == FAKE_TOTAL
    pool = 2 * MIB * ((FITS + 2 * MIB - 1) // (2 * MIB))  # the graph pool grows in 2 MiB chunks
    for road in ROADS:
        lazy = cupaths(program(native), env, "graph", road, "params", str(FITS), "free")
        assert lazy["free_instantiated"] == FAKE_TOTAL, lazy  # taken at launch, not before
        assert lazy["free_launched"] == FAKE_TOTAL - pool
        eager = cupaths(program(native), env, "graph", road, "params-upload", str(FITS), "free")
        assert eager["free_instantiated"] == FAKE_TOTAL - pool, eager  # the upload took it


# ------------------------------------------------------------------ built with nvcc


def toolkit() -> tuple[str, Path]:
    """nvcc (CUDA_HOME's, else the one on PATH) and the toolkit's include folder, as nvcc
    itself names it (``-dryrun``: ``TOP=``; /usr/local/bin/nvcc may be a wrapper script), or
    skip with the reason."""
    home = os.environ.get("CUDA_HOME")
    nvcc = str(Path(home) / "bin" / "nvcc") if home else shutil.which("nvcc")
    if nvcc is None or not Path(nvcc).exists():
        pytest.skip("no CUDA toolkit here (no nvcc on PATH, no CUDA_HOME): nvcc build not tried")
    dry = subprocess.run(
        [nvcc, "-dryrun", "-x", "c", "-E", os.devnull], capture_output=True, text=True, timeout=60
    )
    tops = [
        line.split("TOP=", 1)[1].strip()
        for line in (dry.stdout + dry.stderr).splitlines()
        if "TOP=" in line
    ]
    root = Path(tops[0]).resolve() if tops else Path(nvcc).resolve().parent.parent
    include = root / "include"
    if not (include / "cuda.h").exists():
        pytest.skip(f"the toolkit of {nvcc} ({root}) has no include/cuda.h")
    return nvcc, include


@pytest.fixture(scope="module")
def nvcc_program(native: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc, include = toolkit()
    out = tmp_path_factory.mktemp("nvcc")
    (out / "libcuda.so").symlink_to(native / "fakecuda" / "libcuda.so.1")
    exe = out / "cupaths-nvcc"
    proc = subprocess.run(
        [
            nvcc,
            "-cudart",
            "none",
            "-DFGPU_WITH_CUDA_H",
            f"-I{include}",
            "-o",
            str(exe),
            str(SOURCE),
            f"-L{out}",
            "-lcuda",
            "-ldl",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return exe


def test_nvcc_build_links_the_versioned_symbols_cuda_h_names(nvcc_program: Path) -> None:
    syms = subprocess.run(
        ["nm", "-D", "--undefined-only", str(nvcc_program)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in (
        "cuGraphAddNode_v2",
        "cuStreamBeginCapture_v2",
        "cuDevicePrimaryCtxReset_v2",
        "cuDeviceTotalMem_v2",
        "cuGraphInstantiateWithParams",
    ):
        assert f" {name}\n" in syms, name


@pytest.mark.parametrize(
    "args",
    [
        ["graph", road, inst, str(OVER), "free"]
        for road in ("addnode", "capture", "allocnode", "child")
        for inst in ("params", "upload", "legacy")
    ]
    + [["heap", str(OVER), "0"]],
    ids=lambda a: "-".join(a[:3]) if a[0] == "graph" else "heap",
)
def test_nvcc_built_program_is_refused_past_the_cap(
    nvcc_program: Path, env: dict[str, str], seg: tuple[AgentLib, Path], args: list[str]
) -> None:
    out = cupaths(nvcc_program, env, *args)
    if args[0] == "graph":  # the graph is made; its instantiation is what is refused
        assert out["build_error"] == "CUDA_SUCCESS", out
    error = out["inst_error"] if args[0] == "graph" else out["set_error"]
    assert error == "CUDA_ERROR_OUT_OF_MEMORY", out
    assert seg[0].snapshot().gpus[0].oom_last_bytes == OVER


@pytest.mark.parametrize("path", PATHS)
def test_nvcc_built_program_sees_the_cap_and_survives_a_reset(
    nvcc_program: Path, env: dict[str, str], seg: tuple[AgentLib, Path], path: list[str]
) -> None:
    assert cupaths(nvcc_program, env, *path, "totalmem")["total_mem"] == CAP
    out = cupaths(nvcc_program, env, *path, "ctx", "reset", str(ALLOC))
    assert out["again_error"] == "CUDA_SUCCESS", out
    fits = cupaths(nvcc_program, env, *path, "graph", "capture", "params", str(FITS), "free")
    assert fits["free_instantiated"] == CAP - FITS
    assert fits["free_after"] == CAP
    assert reserved(seg[0]) == 0
