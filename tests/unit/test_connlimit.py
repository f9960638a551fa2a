"""The connection limits' arithmetic and refusals (issue 27, point 1): the total stays under
the file limit by the reserve, a bad flag is refused naming it and echoing the value, the
per-peer and total caps refuse with 429 and 503, and refusals are logged at most once per
interval with the count since."""

from __future__ import annotations

import logging

import pytest

from fgpu.server.connlimit import (
    ConnectionGuard,
    ConnectionLimits,
    LimitError,
    ThrottledLog,
    closing_response,
    peer_of,
)


def test_the_total_keeps_the_reserve_under_the_file_limit() -> None:
    assert ConnectionLimits(reserve=256).resolved_total(1024) == 768
    assert ConnectionLimits(total=500, reserve=256).resolved_total(1024) == 500


@pytest.mark.parametrize(
    ("limits", "flag", "value"),
    [
        (ConnectionLimits(total=900, reserve=256), "--max-connections", "900"),
        (ConnectionLimits(total=3), "--max-connections", "3"),
        (ConnectionLimits(reserve=1020), "--connection-reserve", "1020"),
    ],
)
def test_a_total_that_eats_the_reserve_is_refused(
    limits: ConnectionLimits, flag: str, value: str
) -> None:
    with pytest.raises(LimitError) as caught:
        limits.resolved_total(1024)
    assert str(caught.value).startswith(f"{flag}: {value}")


@pytest.mark.parametrize(
    ("limits", "flag"),
    [
        (ConnectionLimits(per_peer=0), "--max-connections-per-user: 0"),
        (ConnectionLimits(reserve=-1), "--connection-reserve: -1"),
        (ConnectionLimits(request_timeout_s=0.0), "--request-timeout: 0.0"),
        (ConnectionLimits(idle_timeout_s=float("nan")), "--idle-timeout: nan"),
        (ConnectionLimits(idle_timeout_s=float("inf")), "--idle-timeout: inf"),
    ],
)
def test_bad_limits_are_refused_naming_the_flag(limits: ConnectionLimits, flag: str) -> None:
    with pytest.raises(LimitError, match=f"^{flag}"):
        limits.check()


def test_per_peer_and_total_caps() -> None:
    guard = ConnectionGuard(ConnectionLimits(per_peer=2, total=16, reserve=0), nofile=1024)
    bob, alice = peer_of(1001, None), peer_of(1002, None)
    assert guard.admit(bob) is None
    assert guard.admit(bob) is None
    refused = guard.admit(bob)
    assert refused is not None
    assert refused[0] == 429
    assert "uid 1001" in refused[1]
    assert guard.admit(alice) is None  # bob's cap is his alone
    guard.release(bob)
    assert guard.admit(bob) is None
    # TCP peers count per address, whatever the port
    tcp = [peer_of(None, ("192.0.2.7", port)) for port in range(1000, 1014)]
    assert [guard.admit(p) for p in tcp[:2]] == [None, None]
    assert guard.admit(tcp[2]) is not None
    many = [peer_of(uid, None) for uid in range(2000, 2020)]
    answers = [guard.admit(p) for p in many]
    assert guard.open_connections == 16
    first_refused = next(a for a in answers if a is not None)
    assert first_refused[0] == 503
    assert "--max-connections 16" in first_refused[1]
    assert guard.refused == 2 + sum(a is not None for a in answers)


def test_refusals_are_logged_once_per_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttled = ThrottledLog("refused connections", interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="fgpu.server"):
        for _ in range(1000):
            throttled.note("too many")
        now[0] = 61.0
        throttled.note("too many")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused connections: too many",
        "refused connections: too many (999 more since the last report)",
    ]


def test_the_closing_answer_is_whole_http() -> None:
    raw = closing_response(429, "connection", "too many")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert body == b'{"detail": {"field": "connection", "reason": "too many"}}'


def test_the_total_is_lowered_by_what_the_workloads_hold() -> None:
    held = [0]
    guard = ConnectionGuard(
        ConnectionLimits(per_peer=100, total=40, reserve=0),
        nofile=1024,
        workload_fds=lambda: held[0],
    )
    assert guard.cap() == 40
    held[0] = 4 * 5  # five running workloads
    assert guard.cap() == 20
    peers = [peer_of(uid, None) for uid in range(3000, 3030)]
    answers = [guard.admit(p) for p in peers]
    assert guard.open_connections == 20
    refused = next(a for a in answers if a is not None)
    assert refused[0] == 503
    assert "--max-connections 40, less what its workloads hold: 20" in refused[1]
    held[0] = 4 * 1000  # never below the floor: users can still cancel their work
    assert guard.cap() == 16
