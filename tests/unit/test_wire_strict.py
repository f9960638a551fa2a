"""Request bodies take the JSON types their OpenAPI document names (the fuzzer found
``"quota": false`` taken as 0 and ``"squeeze": 0.0`` taken as false)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fgpu.wire import QueueBody, SubmitRequest


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "a", "quota": False}, "quota"),
        ({"name": "a", "limit": True}, "limit"),
        ({"name": "a", "squeeze": 0.0}, "squeeze"),
        ({"name": "a", "nonpreemptible": 1}, "nonpreemptible"),
        ({"name": "a", "priority": "3"}, "priority"),
        ({"name": 7}, "name"),
    ],
)
def test_a_queue_body_of_the_wrong_json_type_is_refused_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        QueueBody.model_validate(body)
    assert [e["loc"][0] for e in caught.value.errors()] == [field]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": ["x"], "preemptible": 0}, "preemptible"),
        ({"command": ["x"], "shell": "yes"}, "shell"),
        ({"command": ["x"], "grace_s": "30"}, "grace_s"),
        ({"command": ["x"], "gpu": 0.5}, "gpu"),
    ],
)
def test_a_submission_of_the_wrong_json_type_is_refused_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        SubmitRequest.model_validate(body)
    assert [e["loc"][0] for e in caught.value.errors()] == [field]


def test_numbers_stay_numbers_whole_or_not() -> None:
    assert QueueBody.model_validate({"name": "a", "quota": 2}).quota == 2.0
    assert QueueBody.model_validate({"name": "a", "max_priority": 100}).max_priority == 100
    body = SubmitRequest.model_validate({"command": ["x"], "grace_s": 30, "preemptible": True})
    assert (body.grace_s, body.preemptible) == (30.0, True)
