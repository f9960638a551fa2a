"""fgpu's PyTorch memory limit, applied when (and only if) the workload imports torch.

The agent puts this directory first on ``PYTHONPATH`` and sets ``FGPU_TORCH_MEMORY_FRACTION``
to one fraction per visible GPU (``CUDA_VISIBLE_DEVICES`` order), e.g. ``"0.500000"``. Python
imports this module at start-up (``site``); it:

1. runs any other ``sitecustomize`` further down ``sys.path`` (so one the environment
   already has keeps working);
2. installs an import hook that waits for ``import torch`` (torch is never imported by this
   module: a workload without torch pays nothing);
3. when torch is imported, queues ``torch.cuda.set_per_process_memory_fraction(f, i)`` for
   each device with ``torch.cuda._lazy_call``, which runs queued calls when CUDA initialises,
   so the shim neither initialises CUDA itself (that would break fork-based data loaders) nor
   comes too late.

``set_per_process_memory_fraction`` caps PyTorch's caching allocator at ``fraction *
total_memory`` of the device (PyTorch docs, ``torch.cuda.memory``); allocations beyond raise
an out-of-memory error in the workload instead of hurting its neighbours. It does not count
memory allocated outside the caching allocator (CUDA context, NCCL, other libraries); the
agent's memory guard covers that. Failures are reported on stderr and never stop the
workload. Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence

ENV = "FGPU_TORCH_MEMORY_FRACTION"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _fractions() -> list[float]:
    values: list[float] = []
    for part in os.environ.get(ENV, "").split(","):
        try:
            value = float(part)
        except ValueError:
            return []
        if not 0.0 < value <= 1.0:
            return []
        values.append(value)
    return values


def _apply(torch: types.ModuleType, fractions: Sequence[float]) -> None:
    def limit() -> None:
        count = torch.cuda.device_count()
        for index, fraction in enumerate(fractions[:count]):
            torch.cuda.set_per_process_memory_fraction(fraction, index)

    def guarded() -> None:
        try:
            limit()
        except Exception as exc:  # never break the workload's CUDA start
            print(f"fgpu: could not set the PyTorch memory limit: {exc}", file=sys.stderr)

    try:
        lazy = getattr(torch.cuda, "_lazy_call", None)
        if torch.cuda.is_initialized() or lazy is None:
            guarded()
        else:
            lazy(guarded)
    except Exception as exc:
        print(f"fgpu: could not set the PyTorch memory limit: {exc}", file=sys.stderr)


class _TorchHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when ``torch`` is about to be imported, wraps its loader so
    that :func:`_apply` runs right after ``torch`` has executed."""

    def __init__(self, fractions: Sequence[float]) -> None:
        self.fractions = list(fractions)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module
        fractions = self.fractions

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            _apply(module, fractions)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    saved_path = list(sys.path)
    this = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception as exc:
        print(f"fgpu: the environment's sitecustomize failed: {exc}", file=sys.stderr)
    finally:
        sys.path[:] = saved_path
        if this is not None:
            sys.modules["sitecustomize"] = this


def _install() -> None:
    _chain()
    fractions = _fractions()
    if not fractions:
        return
    if "torch" in sys.modules:
        _apply(sys.modules["torch"], fractions)
    else:
        sys.meta_path.insert(0, _TorchHook(fractions))


_install()
