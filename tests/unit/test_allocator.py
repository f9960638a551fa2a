"""The server's allocator settings (:mod:`fgpu.server.allocator`): set through glibc's
``mallopt`` in a fresh process, left alone when the environment chooses its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "from fgpu.server.allocator import tune_allocator; print(tune_allocator())"


def run(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(
    not os.confstr("CS_GNU_LIBC_VERSION"), reason="mallopt's parameters are glibc's"
)
def test_glibc_takes_the_settings() -> None:
    assert run({}) == "True"


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"MALLOC_ARENA_MAX": "4"}, id="arena-max"),
        pytest.param({"MALLOC_MMAP_THRESHOLD_": "1048576"}, id="mmap-threshold"),
        pytest.param({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, id="tunables"),
    ],
)
def test_the_environment_wins(env: dict[str, str]) -> None:
    assert run(env) == "False"
