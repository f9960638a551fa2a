"""The limit on wrong tokens (issue 27, point 5), on a fake clock: per (account, client key)
after five within the window, a server-wide slow-down that makes only clients with a wrong
token of their own wait, a right token forgetting its key's failures, and the log line
throttled however many."""

from __future__ import annotations

import logging

import pytest

from fgpu.server.guesses import GuessThrottle

ACCOUNT = "uid 65534"


def clocked(**limits: float) -> tuple[GuessThrottle, list[float]]:
    now = [1000.0]
    return GuessThrottle(clock=lambda: now[0], **limits), now  # type: ignore[arg-type]


def test_a_client_waits_after_its_failures_until_the_oldest_leaves_the_window() -> None:
    throttle, now = clocked(failures=3, window_s=60.0)
    for _ in range(3):
        assert throttle.check(ACCOUNT, "uid 1001") is None
        throttle.failed(ACCOUNT, "uid 1001")
        now[0] += 10
    wait = throttle.check(ACCOUNT, "uid 1001")
    assert wait is not None
    assert wait.seconds == 30  # the first failure (at 1000) leaves the window at 1060
    assert wait.reason == (
        "3 wrong tokens from uid 1001 within 60 s (the limit: 3 per client); try again in 30 s"
    )
    # another client key, the same account: not touched
    assert throttle.check(ACCOUNT, "uid 1002") is None
    assert throttle.check(ACCOUNT, "address 192.0.2.7") is None
    now[0] = 1060.0
    assert throttle.check(ACCOUNT, "uid 1001") is None


def test_a_right_token_forgets_the_failures_of_its_key_only() -> None:
    throttle, _ = clocked(failures=2, window_s=60.0)
    for client in ("uid 1001", "uid 1002"):
        throttle.failed(ACCOUNT, client)
    throttle.succeeded(ACCOUNT, "uid 1001")
    throttle.failed(ACCOUNT, "uid 1001")
    throttle.failed(ACCOUNT, "uid 1002")
    assert throttle.check(ACCOUNT, "uid 1001") is None  # one failure since its success
    assert throttle.check(ACCOUNT, "uid 1002") is not None


def test_the_server_wide_slow_down_spares_clients_without_failures() -> None:
    throttle, now = clocked(failures=5, window_s=100.0, global_failures=10)
    # ten clients, one wrong token each: the server-wide count is reached
    for n in range(10):
        throttle.failed(ACCOUNT, f"address 192.0.2.{n}")
        now[0] += 1
    # each of them, under its own limit of five, waits now ...
    wait = throttle.check(ACCOUNT, "address 192.0.2.9")
    assert wait is not None
    assert "10 wrong tokens from all clients within 100 s (the server-wide limit" in wait.reason
    # ... until its own failure leaves the window or the count falls (the oldest of the
    # ten, at 1000, leaves at 1100): here that is 90 s
    assert wait.seconds == 90
    # a client that typed nothing wrong is never made to wait
    assert throttle.check(ACCOUNT, "uid 1002") is None
    now[0] = 1100.0
    assert throttle.check(ACCOUNT, "address 192.0.2.9") is None


def test_the_longer_of_both_waits_is_said() -> None:
    throttle, now = clocked(failures=2, window_s=100.0, global_failures=3)
    throttle.failed(ACCOUNT, "a")
    now[0] += 50
    throttle.failed(ACCOUNT, "b")
    throttle.failed(ACCOUNT, "b")
    wait = throttle.check(ACCOUNT, "b")
    assert wait is not None
    # its own limit: its first failure (1050) leaves at 1150; the server-wide count (from
    # 1000) falls at 1100
    assert wait.seconds == 100
    assert "per client" in wait.reason


def test_the_log_has_one_line_for_many_failures(caplog: pytest.LogCaptureFixture) -> None:
    throttle, _ = clocked(failures=3, window_s=60.0)
    with caplog.at_level(logging.WARNING, logger="fgpu.server"):
        for _ in range(50):
            if throttle.check(ACCOUNT, "uid 1001") is None:
                throttle.failed(ACCOUNT, "uid 1001")
    lines = [r.getMessage() for r in caplog.records if "wrong or refused tokens" in r.getMessage()]
    assert lines == ["wrong or refused tokens: a wrong token from uid 1001"]
    assert throttle.log.lines == 1
