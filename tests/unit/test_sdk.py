"""fgpu.sdk: the datagram format, no-op without an agent, never blocking, nesting, and a
light import."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import fgpu.sdk
from fgpu.agent.governor.activity import HintListener
from fgpu.sdk.wire import MAX_DATAGRAM, Message, decode, encode


@pytest.mark.parametrize(
    "message",
    [
        Message("w1", "busy"),
        Message("w1", "idle"),
        Message("w1", "memory", 5120, None),
        Message("w1", "memory", 0, 1),
        Message("w1", "memory", 7, "GPU-abc"),
    ],
    ids=["busy", "idle", "memory-first", "memory-index", "memory-uuid"],
)
def test_wire_round_trip(message: Message) -> None:
    assert decode(encode(message)) == message


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"v":2,"w":"a","k":"busy"}',
        b'{"v":1,"w":"","k":"busy"}',
        b'{"v":1,"w":"a","k":"sleep"}',
        b'{"v":1,"w":"a","k":"memory","mib":-1,"gpu":null}',
        b'{"v":1,"w":"a","k":"memory","mib":true,"gpu":null}',
        b'{"v":1,"w":"a","k":"memory","mib":1,"gpu":false}',
        b'{"v":1,"w":"a","k":"memory","mib":1,"gpu":[0]}',
        b'{"v":1,"w":"' + b"a" * MAX_DATAGRAM + b'","k":"busy"}',
    ],
    ids=[
        "garbage",
        "not-object",
        "version",
        "empty-id",
        "kind",
        "negative-mib",
        "bool-mib",
        "bool-gpu",
        "list-gpu",
        "too-long",
    ],
)
def test_wire_rejects_malformed(data: bytes) -> None:
    assert decode(data) is None


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HintListener]:
    listener = HintListener(tmp_path / "agent.sock")
    monkeypatch.setenv("FGPU_AGENT_SOCKET", str(listener.path))
    monkeypatch.setenv("FGPU_WORKLOAD_ID", "w1")
    yield listener
    listener.close()


def test_without_an_agent_calls_do_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FGPU_AGENT_SOCKET", raising=False)
    monkeypatch.delenv("FGPU_WORKLOAD_ID", raising=False)
    assert fgpu.sdk.mark_busy() is False
    with fgpu.sdk.busy():
        pass
    monkeypatch.setenv("FGPU_AGENT_SOCKET", str(tmp_path / "nobody-listens.sock"))
    monkeypatch.setenv("FGPU_WORKLOAD_ID", "w1")
    assert fgpu.sdk.mark_idle() is False
    assert fgpu.sdk.report_memory(10) is False


def test_busy_blocks_nest_and_send_one_pair(agent: HintListener) -> None:
    with fgpu.sdk.busy():
        with fgpu.sdk.busy():
            pass
        assert [h.message.kind for h in agent.receive()] == ["busy"]
    hints = agent.receive()
    assert [h.message for h in hints] == [Message("w1", "idle")]
    assert hints[0].pid > 0


def test_sending_never_blocks_when_the_queue_is_full(agent: HintListener) -> None:
    results = [fgpu.sdk.mark_busy() for _ in range(20_000)]  # nobody reads meanwhile

    assert results[0] is True
    assert results[-1] is False  # dropped, not blocked
    assert len(agent.receive(limit=100_000)) == results.count(True)


def test_report_memory_rejects_negative(agent: HintListener) -> None:
    with pytest.raises(ValueError, match="mib"):
        fgpu.sdk.report_memory(-1)
    assert fgpu.sdk.report_memory(300, gpu=1) is True
    assert agent.receive()[0].message == Message("w1", "memory", 300, 1)


def test_listener_counts_garbage(agent: HintListener) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    raw.sendto(b"hello", str(agent.path))
    raw.close()
    assert agent.receive() == []
    assert agent.dropped == 1


def test_import_is_light() -> None:
    code = (
        "import sys, fgpu.sdk\n"
        "heavy = ('numpy', 'psutil', 'pydantic', 'fastapi', 'sqlalchemy', 'typer', 'rich',"
        " 'pynvml', 'torch', 'httpx', 'matplotlib')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith('fgpu.') and not m.startswith('fgpu.sdk')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
