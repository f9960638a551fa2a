"""Fixtures for the native tests: the built native folder and a fresh fake machine (the fake
driver's state file) per test. See fakecuda_support.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.native.fakecuda_support import TWO_GPUS, FakeGpus

from fgpu import native as fgpu_native


@pytest.fixture(scope="session")
def native_dir() -> Path:
    """The built native folder (built or refreshed once per session)."""
    return fgpu_native.ensure_built()


@pytest.fixture(scope="session")
def sanitized_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The native code built once with AddressSanitizer and UndefinedBehaviorSanitizer."""
    return fgpu_native.ensure_built(sanitize=True, out_dir=tmp_path_factory.mktemp("asan"))


@pytest.fixture
def fake_gpus(native_dir: Path, tmp_path: Path) -> FakeGpus:
    """Two fake GPUs (1 GiB A100-80GB, 2 GiB H100-80GB) in a fresh state file."""
    return FakeGpus(native_dir, tmp_path / "fakegpu.state", TWO_GPUS)


@pytest.fixture
def make_fake_gpus(native_dir: Path, tmp_path: Path) -> Callable[[str], FakeGpus]:
    """A fake machine with the given ``FGPU_FAKE_GPUS`` in a fresh state file."""
    count = iter(range(1000))

    def make(gpus: str) -> FakeGpus:
        return FakeGpus(native_dir, tmp_path / f"fakegpu-{next(count)}.state", gpus)

    return make
