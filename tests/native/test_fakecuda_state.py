"""The fake CUDA driver's state file (a stand-in for tests, native/fakecuda) against misuse:
it is created private (0600); a used counter that holds less than is given back stops at
zero instead of wrapping; a counter above the GPU's total, or a header no fake could have
written, is an error the fake reports (with the reason under ``FGPU_FAKE_DEBUG=1``), never
a figure. The file is edited here by hand, through a ctypes mirror of its layout
(``struct fk_shared`` in native/fakecuda/fake.h), as a trial once did.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from tests.native.fakecuda_support import GPU_A, MIB, FakeGpus
from tests.native.test_fakecuda import (
    CUDA_ERROR_NO_DEVICE,
    CUDA_SUCCESS,
    DEADLINE_S,
    read_json_line,
)

CUDA_ERROR_ILLEGAL_STATE = 401
NVML_ERROR_UNKNOWN = 999
FK_MAGIC = 0x4B415046
FK_NAME_LEN = 96
Fields = Sequence[tuple[str, int | bytes]]


class Header(ctypes.Structure):
    """The start of ``struct fk_shared``."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint64),
        ("ngpus", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("next_va", ctypes.c_uint64),
        ("dead_seq", ctypes.c_uint64),
        ("export_seq", ctypes.c_uint64),
    ]


class GpuHead(ctypes.Structure):
    """The start of ``struct fk_gpu`` (the first GPU follows the header)."""

    _fields_ = [
        ("uuid", ctypes.c_char * FK_NAME_LEN),
        ("name", ctypes.c_char * FK_NAME_LEN),
        ("total", ctypes.c_uint64),
        ("used", ctypes.c_uint64),
    ]


def edit(fake: FakeGpus, header: Fields = (), gpu: Fields = ()) -> GpuHead:
    """Write ``header`` fields (of :class:`Header`) and first-GPU fields (of :class:`GpuHead`,
    an int or raw bytes) into the state file, after checking that it is what the mirror says;
    return the first GPU as it was before."""
    with open(fake.state, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        found = Header.from_buffer_copy(m)
        before = GpuHead.from_buffer_copy(m, ctypes.sizeof(Header))
        assert (found.magic, found.size) == (FK_MAGIC, os.path.getsize(fake.state))
        assert (before.uuid.decode(), before.total) == (GPU_A, 1024 * MIB)
        for base, kind, fields in ((0, Header, header), (ctypes.sizeof(Header), GpuHead, gpu)):
            for name, value in fields:
                spot = getattr(kind, name)
                raw = value if isinstance(value, bytes) else value.to_bytes(spot.size, "little")
                assert len(raw) == spot.size
                m[base + spot.offset : base + spot.offset + spot.size] = raw
    return before


def test_the_state_file_is_created_for_its_user_only(fake_gpus: FakeGpus) -> None:
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB
    assert os.stat(fake_gpus.state).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("how", ["freed", "killed"])
def test_giving_back_more_than_the_counter_holds_stops_at_zero(
    fake_gpus: FakeGpus, how: str
) -> None:
    holder = fake_gpus.start("hold", str(256 * MIB), env=fake_gpus.env(FGPU_FAKE_DEBUG="1"))
    assert read_json_line(holder)["result"] == CUDA_SUCCESS
    # the file says less is used than the holder gives back
    assert edit(fake_gpus, gpu=[("used", 100 * MIB)]).used == 256 * MIB
    if how == "freed":
        _, err = holder.communicate(timeout=DEADLINE_S)  # stdin closes: it frees, exits
        assert "only 104857600 counted as used; the counter stops at 0" in err
    else:
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate(timeout=DEADLINE_S)
    memory = fake_gpus.probe("nvml-memory", GPU_A)  # sweeps a killed holder first
    assert (memory["result"], memory["used"], memory["free"]) == (0, 0, 1024 * MIB)
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB
    assert fake_gpus.run("alloc", "mem", str(1024 * MIB))["result"] == CUDA_SUCCESS


@pytest.mark.parametrize(
    "used",
    [
        pytest.param(1024 * MIB + 1, id="above-total"),
        pytest.param(2**64 - 156 * MIB, id="wrapped"),
    ],
)
def test_a_used_counter_above_the_total_is_an_error_not_a_figure(
    fake_gpus: FakeGpus, used: int
) -> None:
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB
    edit(fake_gpus, gpu=[("used", used)])
    debug = fake_gpus.env(FGPU_FAKE_DEBUG="1")
    info = fake_gpus.run("meminfo", env=debug, ok=False)
    assert (info["result"], info["error"]) == (CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE")
    assert f"state of {GPU_A} is corrupt: {used} bytes used of {1024 * MIB}" in info["_stderr"]
    assert fake_gpus.run("alloc", "mem", str(MIB), ok=False)["result"] == CUDA_ERROR_ILLEGAL_STATE
    assert fake_gpus.probe("nvml-memory", GPU_A)["result"] == NVML_ERROR_UNKNOWN
    edit(fake_gpus, gpu=[("used", 0)])  # the error is the counter's: nothing sticks
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB


@pytest.mark.parametrize(
    ("header", "gpu", "reason"),
    [
        pytest.param([("ngpus", 0)], [], "is corrupt: 0 GPUs (1..16)", id="no-gpus"),
        pytest.param([("ngpus", 4000)], [], "is corrupt: 4000 GPUs (1..16)", id="many-gpus"),
        pytest.param([], [("total", 0)], "is corrupt: GPU 0 total 0 bytes", id="zero-total"),
        pytest.param(
            [], [("total", 2**63)], f"is corrupt: GPU 0 total {2**63} bytes", id="huge-total"
        ),
        pytest.param(
            [],
            [("uuid", b"x" * FK_NAME_LEN)],
            "is corrupt: GPU 0's uuid or name is not terminated",
            id="unterminated-uuid",
        ),
    ],
)
def test_a_corrupt_header_means_no_device_and_says_why(
    fake_gpus: FakeGpus, header: Fields, gpu: Fields, reason: str
) -> None:
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB
    edit(fake_gpus, header, gpu)
    out = fake_gpus.run("info", env=fake_gpus.env(FGPU_FAKE_DEBUG="1"), ok=False)
    assert (out["call"], out["result"]) == ("cuInit", CUDA_ERROR_NO_DEVICE)
    assert f"state file {fake_gpus.state} {reason}" in out["_stderr"]
    assert fake_gpus.probe("nvml-init")["result"] != 0


def test_the_clamp_and_the_checks_are_clean_under_asan_and_ubsan(
    sanitized_dir: Path, make_fake_gpus: Callable[[str], FakeGpus]
) -> None:
    fake = make_fake_gpus(f"{GPU_A}=A100-80GB:1024")
    fake.native = sanitized_dir
    env = fake.env(
        FGPU_FAKE_DEBUG="1",
        ASAN_OPTIONS="halt_on_error=1:detect_leaks=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    holder = fake.start("hold", str(256 * MIB), env=env)
    assert read_json_line(holder)["result"] == CUDA_SUCCESS
    edit(fake, gpu=[("used", 100 * MIB)])
    _, err = holder.communicate(timeout=DEADLINE_S)  # frees 256 MiB against 100: clamped
    assert holder.returncode == 0, err
    assert "the counter stops at 0" in err
    edit(fake, gpu=[("used", 2**64 - 1)])
    corrupt = fake.run("meminfo", env=env, ok=False)
    assert corrupt["result"] == CUDA_ERROR_ILLEGAL_STATE
    edit(fake, header=[("ngpus", 4000)])
    refused = fake.run("info", env=env, ok=False)
    assert refused["result"] == CUDA_ERROR_NO_DEVICE
    for said in (err, corrupt["_stderr"], refused["_stderr"]):
        assert "Sanitizer" not in said
        assert "runtime error" not in said
