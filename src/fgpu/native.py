"""Where fgpu's native code is, and building it from a source checkout.

Layout of the native folder (``lib_dir()``; built by ``native/build.py``):

- ``libfgpu.so``: the interposer (preloaded into workloads); ``libfgpu-dlcuda.so`` and
  ``libfgpu-dlnvml.so``: the shims a ``dlopen`` of the driver is answered with;
  ``libfgpu-agent.so``: the agent's side of the segments (:mod:`fgpu.agent.interposer`);
- ``fakecuda/libcuda.so.1``, ``fakecuda/libnvidia-ml.so.1``: the fake CUDA driver and NVML
  written for the tests (a folder of their own, so ``LD_LIBRARY_PATH`` can point at it);
- ``bin/fgpu-cudemo``: the test program driving the CUDA driver API.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

_PACKAGE = Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE.parent.parent  # the repository, when running from a checkout


class NativeBuildError(RuntimeError):
    """The native code is missing and cannot be built here (no compiler, not a source
    checkout, or a compile error; the message says which)."""


def lib_dir() -> Path:
    """The folder holding the built native code: ``$FGPU_NATIVE_DIR`` when set, else
    ``fgpu/_native`` inside the installed package."""
    override = os.environ.get("FGPU_NATIVE_DIR")
    return Path(override) if override else _PACKAGE / "_native"


def fake_driver_dir() -> Path:
    """The folder holding the fake ``libcuda.so.1`` and ``libnvidia-ml.so.1`` (put it on
    ``LD_LIBRARY_PATH`` to run a CUDA program against the fake driver)."""
    return lib_dir() / "fakecuda"


def cudemo_path() -> Path:
    """The ``fgpu-cudemo`` test program."""
    return lib_dir() / "bin" / "fgpu-cudemo"


def _source_build_module() -> ModuleType | None:
    script = _SOURCE_ROOT / "native" / "build.py"
    if not script.is_file():
        return None
    spec = importlib.util.spec_from_file_location("fgpu_native_build", script)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def ensure_built(*, sanitize: bool = False, out_dir: Path | None = None) -> Path:
    """Make sure the native code is built and current; return its folder.

    From a source checkout, runs ``native/build.py`` (which rebuilds only what changed);
    from an installed wheel, checks that the outputs exist.

    Args:
        sanitize: build with AddressSanitizer and UndefinedBehaviorSanitizer (only with
            ``out_dir``: the sanitized build must not replace the normal one).
        out_dir: build here instead of :func:`lib_dir`.

    Raises:
        NativeBuildError: no C compiler, a compile error, or (installed package) missing
            outputs.
    """
    out = out_dir if out_dir is not None else lib_dir()
    if sanitize and out_dir is None:
        raise NativeBuildError("sanitize=True needs out_dir: it would replace the normal build")
    module = _source_build_module()
    if module is None:
        missing = [p for p in (fake_driver_dir() / "libcuda.so.1", cudemo_path()) if not p.exists()]
        if missing:
            raise NativeBuildError(
                f"native code not built: {', '.join(map(str, missing))} missing and no "
                "native/build.py next to the package to build it (reinstall fgpu)"
            )
        return out
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        raise NativeBuildError(
            f"C compiler {cc!r} not found (set CC or install gcc): cannot build fgpu's native code"
        )
    try:
        module.build(out, sanitize=sanitize)
    except module.BuildError as exc:
        raise NativeBuildError(str(exc)) from exc
    return out
