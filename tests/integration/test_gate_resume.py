"""A workload held at the interposer's launch gate resumes when the service dies (issue 27,
point 5).

A real ``fgpu serve --fake-driver`` runs a low-priority CUDA program (the fake driver's
``fgpu-cudemo``) and a latency-critical service that stays busy, so the governor holds the
low one at its launch gate. The service is then killed with SIGKILL: nothing opens the gate
for it, and the interposer must count the gate open once the agent's heartbeat is stale
(``FGPU_SEG_STALE_NS``). The test waits (generous deadline) for the low program's launches to
go on; how soon that happens is measured by ``bench/gate_resume.py``, never asserted here.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.agent.interposer.preload import default_segment_root
from fgpu.agent.interposer.segment import Segment, SegmentError, SegmentStats
from fgpu.native import ensure_built, lib_dir
from tests.integration.test_service_governor import critical_until
from tests.serverproc import ServerProcess, wait_for

DEADLINE_S = 60.0


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_built()
    root = Path(tempfile.mkdtemp(prefix="fgpu-gate-resume-", dir="/tmp"))
    proc = ServerProcess(root, "1xA100-80GB", extra=["--fake-driver"])
    proc.start()
    try:
        yield proc
    finally:
        if proc.process is not None and proc.process.poll() is not None:
            proc.start()  # killed by the test: start again so that cleanup can cancel
        proc.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def stats(server: ServerProcess, workload_id: str) -> SegmentStats:
    segment = Segment.open(default_segment_root(server.state_dir) / f"{workload_id}.seg")
    try:
        return segment.stats()
    finally:
        segment.close()


def launching(server: ServerProcess, workload_id: str) -> bool:
    """Whether the workload has launched through the interposer (False before the service
    made its segment)."""
    try:
        return stats(server, workload_id).launches > 0
    except SegmentError:
        return False


def test_a_workload_held_at_the_gate_resumes_after_the_service_is_killed(
    server: ServerProcess,
) -> None:
    spin = [str(lib_dir() / "bin" / "fgpu-cudemo"), "spin", "1000000", "100000000"]
    low = server.submit("-p", "low", "-g", "0.25", "--grace", "1", command=spin)
    wait_for(lambda: launching(server, low), "the low workload launching", DEADLINE_S)
    critical = server.submit(
        "-p", "critical", "-g", "0.5", "--grace", "1",
        command=critical_until(server.root / "never"),
    )  # fmt: skip
    server.wait_phase(critical, "running", timeout_s=DEADLINE_S)
    wait_for(
        lambda: (s := stats(server, low)).gate_closed and s.waiting > 0,
        "the low workload held at its launch gate",
        DEADLINE_S,
    )
    held = stats(server, low).launches

    server.kill()  # SIGKILL: the service opens no gate itself
    assert stats(server, low).gate_closed, "the gate stays closed in the segment"
    wait_for(
        lambda: stats(server, low).launches > held,
        "the held workload to launch again once the agent's heartbeat is stale",
        DEADLINE_S,
    )
    after = stats(server, low)
    assert after.gate_closed, "it resumed by the stale heartbeat, not by an opened gate"
    assert after.launches > held
