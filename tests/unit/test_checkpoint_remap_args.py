"""The restore arguments the checkpoint binding builds for a restore onto other GPUs
(``CUcheckpointRestoreArgs`` of CUDA 13.0's ``cuda.h``) and the UUID form it takes; the
calls themselves run on the fake driver in tests/native/test_fakecuda_checkpoint.py."""

from __future__ import annotations

import ctypes

import pytest

from fgpu.agent.checkpoint import REMAP_DRIVER_VERSION, _GpuPair, _RestoreArgs, uuid_bytes


def test_the_restore_args_have_cuda_13s_layout() -> None:
    assert ctypes.sizeof(_RestoreArgs) == 64
    assert _RestoreArgs.gpuPairsCount.offset == 8
    assert _RestoreArgs.reserved1.offset == 56
    assert ctypes.sizeof(_GpuPair) == 32
    assert REMAP_DRIVER_VERSION == 13000


def test_a_gpu_uuid_gives_its_16_bytes() -> None:
    assert uuid_bytes("GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9") == bytes.fromhex(
        "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "not GPU-xxxxxxxx"),
        ("GPU-0a1b2c3d-4e5f-6071-8293", "not GPU-xxxxxxxx"),
        ("MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "not GPU-xxxxxxxx"),
        ("GPU-0a1b2c3z-4e5f-6071-8293-a4b5c6d7e8f9", "not hexadecimal"),
    ],
    ids=["no-prefix", "short", "mig", "not-hex"],
)
def test_other_forms_are_refused_with_the_value(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        uuid_bytes(text)
    assert repr(text) in str(info.value)
