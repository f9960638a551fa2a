"""Slurm's forms of ``--time``, ``--dependency`` and ``--array`` (:mod:`fgpu.rules.slurm`):
what each form means, and what each bad one gets (the field, the value echoed, why)."""

from __future__ import annotations

import math

import pytest

from fgpu.rules.errors import BadRequest
from fgpu.rules.slurm import (
    MAX_ARRAY_TASKS,
    ArraySpec,
    Dependency,
    array_task_env,
    format_time,
    parse_array,
    parse_dependency,
    parse_time,
    task_name,
)
from fgpu.server.jobrules import time_limit
from fgpu.store.records import QueueConfig, StoredArrayTask


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400.0),  # minutes
        ("5:30", 330.0),  # minutes:seconds
        ("0:02", 2.0),
        ("1:30:00", 5400.0),  # hours:minutes:seconds
        ("2-12", 2 * 86400.0 + 12 * 3600),  # days-hours
        ("2-12:30", 2 * 86400.0 + 12 * 3600 + 30 * 60),  # days-hours:minutes
        ("2-00:00:00", 2 * 86400.0),  # days-hours:minutes:seconds
        (" 1:00 ", 60.0),
        ("0", None),  # no limit
        ("UNLIMITED", None),
        ("infinite", None),
        ("0:00:00", None),
    ],
)
def test_time_forms(text: str, seconds: float | None) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is not a time limit"),
        ("1:2:3:4", "is not a time limit"),
        ("1h", "is not a time limit"),
        ("-5", "is not a time limit"),
        ("1.5", "is not a time limit"),
        ("1-2-3", "is not a time limit"),
        ("366-00:00:00", "above the longest"),
        ("1:99:99", "99 minutes is not less than an hour"),  # a trial: it meant 2:40:39
        ("5:60", "60 seconds is not less than a minute"),
        ("2-24", "24 hours is not less than a day"),
        ("1-23:60", "60 minutes is not less than an hour"),
    ],
)
def test_bad_times_are_refused_naming_the_field_and_echoing_the_value(
    text: str, words: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_time(text, "time")
    assert caught.value.field == "time"
    assert repr(text) in caught.value.reason
    assert words in caught.value.reason


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(2.0, "00:00:02"), (5400.0, "01:30:00"), (2 * 86400.0, "2-00:00:00"), (0.5, "00:00:01")],
)
def test_format_time(seconds: float, text: str) -> None:
    assert format_time(seconds) == text
    assert parse_time(text) == float(math.ceil(seconds))  # read back, whole seconds


QUEUE = QueueConfig("short", default_time_s=300.0, max_time_s=3600.0)
OPEN = QueueConfig("open")


@pytest.mark.parametrize(
    ("queue", "text", "limit"),
    [
        (QUEUE, None, 300.0),  # the queue's default
        (QUEUE, "30", 1800.0),
        (QUEUE, "1:00:00", 3600.0),  # the maximum itself
        (QueueConfig("capped", max_time_s=600.0), None, 600.0),  # no default: the maximum
        (OPEN, None, None),
        (OPEN, "UNLIMITED", None),
        (OPEN, "2-00:00:00", 2 * 86400.0),
    ],
    ids=["default", "given", "at-max", "max-as-default", "none", "unlimited", "days"],
)
def test_time_limit_of_a_submission(queue: QueueConfig, text: str | None, limit: float) -> None:
    assert time_limit(text, queue) == limit


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1:00:01", "above queue short's maximum 01:00:00"),
        ("UNLIMITED", "asks for no limit"),
        ("", "is empty"),  # not taken as "no --time" (the queue's default)
        ("  ", "is empty"),
    ],
)
def test_a_time_beyond_the_queues_maximum_is_refused(text: str, words: str) -> None:
    with pytest.raises(BadRequest) as caught:
        time_limit(text, QUEUE)
    assert caught.value.field == "time"
    assert words in caught.value.reason
    assert repr(text) in caught.value.reason


@pytest.mark.parametrize(
    ("text", "conditions"),
    [
        ("afterok:abc", [Dependency("afterok", "abc")]),
        ("afterok:a:b", [Dependency("afterok", "a"), Dependency("afterok", "b")]),
        (
            "afterany:a,afternotok:b",
            [Dependency("afterany", "a"), Dependency("afternotok", "b")],
        ),
        ("AfterOK:train", [Dependency("afterok", "train")]),
    ],
)
def test_dependency_forms(text: str, conditions: list[Dependency]) -> None:
    assert parse_dependency(text) == conditions


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("after:abc", "'after' is not a dependency type"),
        ("singleton", "'singleton' is not a dependency type"),
        ("afterok", "afterok needs workload ids or names"),
        ("afterok:", "afterok needs workload ids or names"),
        ("afterok:a::b", "afterok needs workload ids or names"),
        ("afterok:a?afterany:b", "'?' (any one of several) is not supported"),
    ],
)
def test_bad_dependencies_are_refused(text: str, words: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_dependency(text)
    assert caught.value.field == "dependency"
    assert words in caught.value.reason


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("0-3", ArraySpec((0, 1, 2, 3))),
        ("1,3,5", ArraySpec((1, 3, 5))),
        ("0-15:4", ArraySpec((0, 4, 8, 12))),
        ("0-3%2", ArraySpec((0, 1, 2, 3), 2)),
        ("7", ArraySpec((7,))),
        ("5,0-2,2", ArraySpec((0, 1, 2, 5))),
    ],
)
def test_array_forms(text: str, spec: ArraySpec) -> None:
    assert parse_array(text) == spec


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is not an index or a range"),
        ("a-b", "is not an index or a range"),
        ("5-2", "ends below its start"),
        ("0-9:0", "step of 0-9:0 must be at least 1"),
        ("0-9%0", "%N needs N of at least 1"),
        ("0-9%x", "%N needs N of at least 1"),
        ("0-1000000", "above 999999"),
        (f"0-{MAX_ARRAY_TASKS}", f"more than {MAX_ARRAY_TASKS} tasks"),
        ("-1", "is not an index or a range"),
    ],
)
def test_bad_arrays_are_refused(text: str, words: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_array(text)
    assert caught.value.field == "array"
    assert words in caught.value.reason
    assert repr(text) in caught.value.reason


def test_task_names_and_environment() -> None:
    assert task_name("sweep", 7) == "sweep_7"
    env = array_task_env(StoredArrayTask("a1b2c3d4", "sweep", 7, 10, 2))
    assert env["FGPU_ARRAY_INDEX"] == env["SLURM_ARRAY_TASK_ID"] == "7"
    assert env["FGPU_ARRAY_ID"] == env["SLURM_ARRAY_JOB_ID"] == "a1b2c3d4"
    assert env["SLURM_ARRAY_TASK_COUNT"] == "10"
    assert env["FGPU_ARRAY_NAME"] == "sweep"
    assert array_task_env(None) == {}
