"""Build fgpu's native code with the system C compiler (stdlib only).

Used by the hatchling build hook (``hatch_build.py``, so ``pip install`` builds it), by
``fgpu.native.ensure_built()`` (tests, source checkouts) and by hand::

    python native/build.py OUT_DIR [--sanitize] [--force]

Every target is one compiler invocation (all its sources at once) writing to a temporary
name that is renamed into place, so a process loading a library never sees half a file and
concurrent builds into one folder (serialised by a lock file) agree. A target is rebuilt only
when an output is missing, older than one of its sources, a header under ``native/include``
or its own folder, or this file, or was built with other flags (``.build-flags`` in the
output folder).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

NATIVE = Path(__file__).resolve().parent
INCLUDE = NATIVE / "include"

CFLAGS = ["-std=c11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]


@dataclass(frozen=True)
class Target:
    """One output of the native build.

    Attributes:
        name: output path relative to the output folder, e.g. ``fakecuda/libcuda.so.1``.
        kind: ``"shared"`` (a shared object) or ``"program"`` (an executable).
        sources: C files relative to ``native/``.
        soname: the ``DT_SONAME`` of a shared object (None for programs).
        libs: extra linker arguments; ``{out}`` is replaced by the output folder.
        deps: names of targets that must be built first (and whose rebuild rebuilds this).
        cflags: extra compiler flags for this target only.
    """

    name: str
    kind: str
    sources: tuple[str, ...]
    soname: str | None = None
    libs: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()
    cflags: tuple[str, ...] = field(default=())


FAKECUDA_SOURCES = (
    "fakecuda/state.c",
    "fakecuda/devlock.c",
    "fakecuda/context.c",
    "fakecuda/limits.c",
    "fakecuda/modules.c",
    "fakecuda/memory.c",
    "fakecuda/objects.c",
    "fakecuda/vmm.c",
    "fakecuda/streams.c",
    "fakecuda/launch.c",
    "fakecuda/graphs.c",
    "fakecuda/graph_nodes.c",
    "fakecuda/capture.c",
    "fakecuda/procaddress.c",
    "fakecuda/versions.c",
    "fakecuda/contents.c",
    "fakecuda/checkpoint.c",
)

INTERPOSER_SOURCES = (
    "interposer/config.c",
    "interposer/resolve.c",
    "interposer/procaddr.c",
    "interposer/memory.c",
    "interposer/memory_pools.c",
    "interposer/memory_objects.c",
    "interposer/memory_graphs.c",
    "interposer/launch.c",
    "interposer/launch_ring.c",
    "interposer/launch_sync.c",
    "interposer/launch_hooks.c",
    "interposer/nvml.c",
    "interposer/seg.c",
    "interposer/dlopen_x86_64.S",
    "interposer/dlopen_aarch64.S",
)

# The table of everything the build makes, in build order.
TARGETS: list[Target] = [
    # --- the fake driver and fake NVML (stand-ins for tests; native/fakecuda) -----------
    # -Bsymbolic: the fake's own references (cuGetProcAddress's table, internal calls) bind
    # to its own definitions even when an interposer preloaded first exports the same names.
    Target(
        name="fakecuda/libcuda.so.1",
        kind="shared",
        sources=FAKECUDA_SOURCES,
        soname="libcuda.so.1",
        libs=("-Wl,-Bsymbolic", "-lpthread", "-lm"),
    ),
    Target(
        name="fakecuda/libnvidia-ml.so.1",
        kind="shared",
        sources=("fakecuda/state.c", "fakecuda/devlock.c", "fakecuda/nvml.c"),
        soname="libnvidia-ml.so.1",
        libs=("-Wl,-Bsymbolic", "-lpthread"),
    ),
    # A test stand-in: the fake driver plus a constructor that dlopens the driver's own path
    # and "libcuda.so.1" while it loads (the dlopen route must not deadlock on that).
    Target(
        name="selfload/libcuda.so.1",
        kind="shared",
        sources=(*FAKECUDA_SOURCES, "tests/selfload.c"),
        soname="libcuda.so.1",
        libs=("-Wl,-Bsymbolic", "-lpthread", "-lm", "-ldl"),
    ),
    # --- the interposer (native/interposer; libfgpu*.so): its engineer adds targets here --
    # libfgpu.so: LD_PRELOADed into workloads; exports only the hooks of hooks.h, dlopen and
    # fgpu_interposer_hook_names (-fvisibility=hidden); -z defs: a hook listed in hooks.h but
    # not written fails the link.
    Target(
        name="libfgpu.so",
        kind="shared",
        sources=INTERPOSER_SOURCES,
        soname="libfgpu.so",
        libs=("-Wl,-z,defs", "-lpthread"),
        cflags=("-fvisibility=hidden",),
    ),
    # The shims a dlopen of the driver is sent to: DT_NEEDED libfgpu.so first, then the
    # driver, so dlsym on the handle finds the hooks first and the driver for the rest. The
    # driver named at link time is only a DT_NEEDED name (libcuda.so.1 / libnvidia-ml.so.1):
    # at run time it matches the driver libfgpu.so loaded already (the real one on a GPU).
    Target(
        name="libfgpu-dlcuda.so",
        kind="shared",
        sources=("interposer/dlshim.c",),
        soname="libfgpu-dlcuda.so",
        libs=(
            "-Wl,--no-as-needed",
            "-L{out}",
            "-l:libfgpu.so",
            "-L{out}/fakecuda",
            "-l:libcuda.so.1",
            "-Wl,-rpath,$ORIGIN",
        ),
        deps=("libfgpu.so", "fakecuda/libcuda.so.1"),
    ),
    Target(
        name="libfgpu-dlnvml.so",
        kind="shared",
        sources=("interposer/dlshim.c",),
        soname="libfgpu-dlnvml.so",
        libs=(
            "-Wl,--no-as-needed",
            "-L{out}",
            "-l:libfgpu.so",
            "-L{out}/fakecuda",
            "-l:libnvidia-ml.so.1",
            "-Wl,-rpath,$ORIGIN",
        ),
        deps=("libfgpu.so", "fakecuda/libnvidia-ml.so.1"),
    ),
    # libfgpu-agent.so: the agent's side of the segment (ctypes); seg.c is shared with
    # libfgpu.so so the reservation and sweep rules exist once.
    Target(
        name="libfgpu-agent.so",
        kind="shared",
        sources=("interposer/seg.c", "interposer/agent.c"),
        soname="libfgpu-agent.so",
        libs=("-Wl,-z,defs",),
        cflags=("-fvisibility=hidden",),
    ),
    # --- end of interposer targets --------------------------------------------------------
    # --- test programs ----------------------------------------------------------------------
    # The TRACING stand-in of libcuda.so.1 (tests only): the fake driver that also records
    # every cuGetProcAddress(_v2) and cuGetExportTable request to $FGPU_TRACE_OUT; the tests
    # run NVIDIA's CUDA runtime against it (tests/native/test_cudart_requests.py).
    Target(
        name="trace/libcuda.so.1",
        kind="shared",
        sources=(*FAKECUDA_SOURCES, "tests/cutrace.c"),
        soname="libcuda.so.1",
        libs=("-Wl,-Bsymbolic", "-lpthread", "-lm"),
        cflags=("-DFK_TRACE", f"-I{NATIVE / 'fakecuda'}"),
    ),
    # Linked against the fake without an rpath: LD_LIBRARY_PATH / LD_PRELOAD choose at run
    # time which libcuda.so.1 (fake, interposer, real) the program gets.
    Target(
        name="bin/fgpu-cudemo",
        kind="program",
        sources=("tests/cudemo.c", "tests/cudemo_main.c", "tests/cudemo_bench.c"),
        libs=("-L{out}/fakecuda", "-l:libcuda.so.1", "-ldl", "-lpthread"),
        deps=("fakecuda/libcuda.so.1",),
    ),
    # the driver-API roads to device memory beside the allocation calls (graphs, capture,
    # heap limit, context reset); the tests also build it with nvcc against cuda.h
    Target(
        name="bin/fgpu-cupaths",
        kind="program",
        sources=("tests/cupaths.c",),
        libs=("-L{out}/fakecuda", "-l:libcuda.so.1", "-ldl"),
        deps=("fakecuda/libcuda.so.1",),
    ),
]


class BuildError(RuntimeError):
    """A compiler run failed or no compiler was found; the message holds the command and
    the compiler's standard error."""


def _compiler(cc: str | None) -> list[str]:
    words = shlex.split(cc or os.environ.get("CC") or "cc")
    if not words or shutil.which(words[0]) is None:
        message = (
            f"C compiler {words[0] if words else cc!r} not found (set CC, or install gcc or "
            "clang): fgpu's native libraries cannot be built"
        )
        print(f"native build failed: {message}", file=sys.stderr)
        raise BuildError(message)
    return words


def _flags(sanitize: bool) -> list[str]:
    return CFLAGS + (SANITIZE_FLAGS if sanitize else [])


def _inputs(target: Target) -> list[Path]:
    paths = [NATIVE / s for s in target.sources]
    headers = set(INCLUDE.glob("*.h"))
    for src in paths:
        headers.update(src.parent.glob("*.h"))
    return [*paths, *sorted(headers), Path(__file__).resolve()]


def _stale(target: Target, out: Path, rebuilt: set[str]) -> bool:
    output = out / target.name
    if not output.exists() or any(dep in rebuilt for dep in target.deps):
        return True
    built = output.stat().st_mtime_ns
    return any(path.stat().st_mtime_ns > built for path in _inputs(target))


def _command(cc: list[str], target: Target, out: Path, tmp: Path, sanitize: bool) -> list[str]:
    cmd = [*cc, *_flags(sanitize), *target.cflags, f"-I{INCLUDE}"]
    if target.kind == "shared":
        cmd += ["-shared", f"-Wl,-soname,{target.soname}"]
    elif target.kind != "program":
        raise BuildError(f"target {target.name}: kind {target.kind!r} is not shared or program")
    cmd += ["-o", str(tmp), *(str(NATIVE / s) for s in target.sources)]
    cmd += [lib.replace("{out}", str(out)) for lib in target.libs]
    return cmd


def build(
    out_dir: str | os.PathLike[str],
    *,
    sanitize: bool = False,
    cc: str | None = None,
    force: bool = False,
) -> list[Path]:
    """Build every target of :data:`TARGETS` into ``out_dir`` (created if missing).

    Args:
        out_dir: output folder; outputs land at ``out_dir / target.name``.
        sanitize: add AddressSanitizer and UndefinedBehaviorSanitizer instrumentation.
        cc: compiler command (default ``$CC``, else ``cc``).
        force: rebuild every target even when up to date.

    Returns:
        The output paths, in table order.

    Raises:
        BuildError: no compiler, or a compile failed (the message names the command and
            carries the compiler's standard error; it is also printed to stderr).
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    compiler = _compiler(cc)
    flags_file = out / ".build-flags"
    want_flags = shlex.join([*compiler, *_flags(sanitize)])
    with open(out / ".build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not flags_file.exists() or flags_file.read_text() != want_flags:
            force = True
        rebuilt: set[str] = set()
        outputs: list[Path] = []
        for target in TARGETS:
            output = out / target.name
            outputs.append(output)
            if not force and not _stale(target, out, rebuilt):
                continue
            output.parent.mkdir(parents=True, exist_ok=True)
            tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
            cmd = _command(compiler, target, out, tmp, sanitize)
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                message = (
                    f"native build of {target.name} failed (exit {proc.returncode})\n"
                    f"command: {shlex.join(cmd)}\n{proc.stderr}"
                )
                print(message, file=sys.stderr)
                raise BuildError(message)
            os.replace(tmp, output)
            rebuilt.add(target.name)
        flags_file.write_text(want_flags)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build fgpu's native libraries and programs.")
    parser.add_argument("out_dir", help="output folder (e.g. src/fgpu/_native)")
    parser.add_argument("--sanitize", action="store_true", help="ASan + UBSan build")
    parser.add_argument("--force", action="store_true", help="rebuild everything")
    args = parser.parse_args(argv)
    try:
        for path in build(args.out_dir, sanitize=args.sanitize, force=args.force):
            print(path)
    except BuildError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
