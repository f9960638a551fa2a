"""SIGTERM while a round is starting many workloads: the service starts nothing more, waits
for the round, closes, and exits; the next start takes over (found by an attacker's trial:
the server went on launching without an API and never exited)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serverproc import ServerProcess, wait_for

COUNT = 300


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path, "1xA100-80GB")
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


def test_sigterm_during_a_burst_of_starts_exits_and_the_next_start_serves(
    server: ServerProcess,
) -> None:
    transport = httpx.HTTPTransport(uds=str(server.socket))
    with httpx.Client(transport=transport, base_url="http://fgpu", timeout=60) as client:
        for _ in range(COUNT):  # tiny shares: a round starts many at once
            answer = client.post("/v1/workloads", json={"command": ["true"], "gpu": "0.01"})
            assert answer.status_code == 201, answer.text
    wait_for(
        lambda: any(w["phase"] != "pending" for w in server.workloads().values()),
        "the first starts",
    )
    assert server.process is not None
    code = server.stop()  # waits (generously) for the exit: before the fix it never came
    assert code == 0, server.server_log()[-3000:]
    assert "Executor shutdown has been called" not in server.server_log()
    server.start()  # the state is free again: a new server takes over and serves
    server.wait_listing(
        lambda ws: len(ws) == COUNT and all(w["phase"] == "succeeded" for w in ws.values()),
        "every workload to end",
        timeout_s=300,
    )
