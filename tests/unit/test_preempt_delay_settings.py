"""Wait before evict as configured (issue 28, point 4): the duration syntax of
``--preempt-delay``, a queue's delay through the API's rules and the store (persisted, down
to the core's ``QueueSpec``), and the defaults of ``fgpu serve`` and ``fgpu k8s scheduler``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fgpu.model.types import InvalidRequestError
from fgpu.model.units import UnitError, format_duration_s, parse_duration_s
from fgpu.rules.errors import BadRequest
from fgpu.rules.requests import queue_config
from fgpu.sched.decide import PREEMPT_DELAY_S
from fgpu.store import QueueConfig, Store
from fgpu.wire import QueueBody
from tests.unit.test_store_support import open_store


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("300s", 300.0),
        ("5m", 300.0),
        (" 1.5m ", 90.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("0", 0.0),
        ("0.25s", 0.25),
        ("10M", 600.0),
        (42, 42.0),
    ],
)
def test_durations_people_type(text: str | int, seconds: float) -> None:
    assert parse_duration_s(text, "--preempt-delay") == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("soon", "not a duration; use seconds (90) or a number with s, m, h or d"),
        ("5x", "not a duration"),
        ("5 minutes", "not a duration"),
        ("", "not a duration"),
        ("1e3", "not a duration"),
        ("-1", "a duration must not be negative"),
        ("-5m", "a duration must not be negative"),
        (-2.0, "a duration must not be negative"),
        (float("nan"), "a duration must not be negative"),
        ("1000000001", "must be at most 1e+09 seconds"),
        ("9" * 50, "too long for a number"),
        (True, "not a duration"),
    ],
)
def test_malformed_durations_are_refused_naming_the_flag(text: object, why: str) -> None:
    with pytest.raises(UnitError) as caught:
        parse_duration_s(text, "--preempt-delay")  # type: ignore[arg-type]
    assert caught.value.field == "--preempt-delay"
    assert why in caught.value.reason
    assert str(caught.value).startswith("--preempt-delay: ")


@pytest.mark.parametrize(
    ("seconds", "text"), [(300, "5m"), (90, "90s"), (7200, "2h"), (1.5, "1.5s"), (0, "0s")]
)
def test_durations_shown(seconds: float, text: str) -> None:
    assert format_duration_s(seconds) == text


def test_a_queue_delay_goes_from_the_api_to_the_core() -> None:
    config = queue_config(QueueBody(name="q", preempt_delay_s=2))
    assert config.preempt_delay_s == 2.0
    assert config.to_spec().preempt_delay_s == 2.0
    assert queue_config(QueueBody(name="q")).to_spec().preempt_delay_s is None


@pytest.mark.parametrize("value", [-1.0, 1e9 + 1, float("inf"), float("nan")])
def test_the_api_refuses_a_delay_outside_0_to_1e9_seconds(value: float) -> None:
    with pytest.raises(BadRequest) as caught:
        queue_config(QueueBody(name="q", preempt_delay_s=value))
    assert caught.value.field == "preempt_delay_s"
    assert repr(value) in caught.value.reason


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(tmp_path / "fgpu.db") as opened:
        yield opened


def test_the_store_keeps_a_queue_delay_across_a_reopen(store: Store, tmp_path: Path) -> None:
    store.create_queue(QueueConfig("short", preempt_delay_s=2.5))
    store.create_queue(QueueConfig("follows"))
    store.close()
    with open_store(tmp_path / "fgpu.db") as again:
        kept = {q.name: q.config.preempt_delay_s for q in again.list_queues()}
        assert (kept["short"], kept["follows"]) == (2.5, None)
        again.update_queue(QueueConfig("short"))  # back to the service's setting
        assert again.get_queue("short").config.preempt_delay_s is None


@pytest.mark.parametrize("value", [-1.0, 1e9 + 1, float("nan"), "5m"])
def test_the_store_refuses_a_bad_delay(store: Store, value: object) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        store.create_queue(QueueConfig("q", preempt_delay_s=value))  # type: ignore[arg-type]
    assert caught.value.field == "preempt_delay_s"
    assert [q.name for q in store.list_queues() if q.name == "q"] == []


def test_serve_and_the_kubernetes_scheduler_default_to_the_recommended_delay() -> None:
    from fgpu.cli import app
    from fgpu.server.main import DEFAULT_PREEMPT_DELAY

    assert parse_duration_s(DEFAULT_PREEMPT_DELAY) == PREEMPT_DELAY_S == 300.0
    for command in (["serve"], ["k8s", "scheduler"]):
        shown = CliRunner().invoke(app, [*command, "--help"], terminal_width=200).output
        assert "--preempt-delay" in shown, command
        assert "5m" in shown, command


def test_the_kubernetes_scheduler_refuses_a_malformed_delay() -> None:
    from fgpu.cli import app

    result = CliRunner().invoke(
        app, ["k8s", "scheduler", "--server", "http://127.0.0.1:9", "--preempt-delay", "x"]
    )
    assert result.exit_code == 2, result.output
    assert "--preempt-delay 'x': not a duration" in result.stderr
