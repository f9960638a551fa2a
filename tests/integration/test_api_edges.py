"""API edges (issue 14, point 5): values out of range are 422 naming the field, malformed
bodies get the status the OpenAPI document lists, the document declares the limits the
server enforces, and a 405 says in ``Allow`` what the path serves.

The real application and service in-process (httpx's ASGI transport, the caller as root as
the Unix socket would report it); every answer is also checked against the document.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fgpu.server.app import MAX_BODY_BYTES, MAX_ID, PEER_UID, create_app
from fgpu.server.service import Service


class Api:
    """Requests to the application with the peer credentials of root."""

    def __init__(self, tmp: Path) -> None:
        self.service = Service.create(
            db=str(tmp / "fgpu.db"), simulate_gpus="1xA100-40GB", state_dir=tmp / "state"
        )
        self.app = create_app(self.service)

    async def _peer(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, PEER_UID: 0}
        await self.app(scope, receive, send)

    def call(
        self, method: str, path: str, body: bytes | None = None, content_type: str = ""
    ) -> httpx.Response:
        transport = httpx.ASGITransport(app=self._peer, raise_app_exceptions=False)
        headers = {"content-type": content_type} if content_type else {}

        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=transport, base_url="http://fgpu") as http:
                return await http.request(method, path, content=body, headers=headers)

        return asyncio.run(go())


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    instance = Api(tmp_path_factory.mktemp("api-edges"))
    yield instance
    instance.service.store.close()


@pytest.fixture(scope="module")
def spec(api: Api) -> dict[str, Any]:
    answer = api.call("GET", "/openapi.json")
    assert answer.status_code == 200
    return dict(answer.json())


def listed(spec: dict[str, Any], template: str, method: str, status: int) -> bool:
    """Whether the document lists ``status`` for ``method template``."""
    return str(status) in spec["paths"][template][method.lower()]["responses"]


@pytest.mark.parametrize(
    ("method", "path", "template", "field"),
    [
        ("GET", f"/v1/events?after={MAX_ID + 1}", "/v1/events", "after"),
        ("GET", "/v1/events?after=99999999999999999999999999", "/v1/events", "after"),
        ("GET", "/v1/events?limit=10001", "/v1/events", "limit"),
        (
            "GET",
            f"/v1/workloads/x/logs?offset={MAX_ID + 1}",
            "/v1/workloads/{workload_id}/logs",
            "offset",
        ),
        ("GET", "/v1/workloads/" + "a" * 129, "/v1/workloads/{workload_id}", "workload_id"),
        (
            "POST",
            "/v1/workloads/" + "a" * 129 + "/cancel",
            "/v1/workloads/{workload_id}/cancel",
            "workload_id",
        ),
        ("DELETE", "/v1/queues/" + "q" * 129, "/v1/queues/{name}", "name"),
    ],
    ids=["after-2^63", "after-huge", "limit", "offset", "id", "cancel-id", "queue-name"],
)
def test_values_out_of_range_are_422_with_the_field(
    api: Api, spec: dict[str, Any], method: str, path: str, template: str, field: str
) -> None:
    answer = api.call(method, path)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]["field"] == field
    assert listed(spec, template, method, 422)


def test_the_largest_event_id_is_a_plain_empty_answer(api: Api) -> None:
    answer = api.call("GET", f"/v1/events?after={MAX_ID}")
    assert answer.status_code == 200
    assert answer.json() == []


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"\xff\xfe{", "application/json"),
        ('{"command": ["caf\u00e9"]}'.encode("latin-1"), "application/json"),
        (b'{"command": ["true"]', "application/json"),
        (b'{"command": ["true"]}', "text/plain"),
        (b"", "application/json"),
    ],
    ids=["not-utf8", "latin-1", "truncated", "not-json-type", "empty"],
)
def test_malformed_bodies_get_the_listed_422(
    api: Api, spec: dict[str, Any], body: bytes, content_type: str
) -> None:
    before = api.call("GET", "/v1/workloads?all=true").json()
    answer = api.call("POST", "/v1/workloads", body, content_type)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]["field"] == "body"
    assert listed(spec, "/v1/workloads", "POST", 422)
    assert api.call("GET", "/v1/workloads?all=true").json() == before


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PATCH", "/v1/workloads", "GET, POST"),
        ("DELETE", "/v1/nodes", "GET"),
        ("POST", "/v1/queues/default", "DELETE, PUT"),
        ("GET", "/v1/workloads/abc/cancel", "POST"),
        ("PUT", "/v1/healthz", "GET"),
    ],
)
def test_a_405_allows_every_method_the_path_serves(
    api: Api, method: str, path: str, allow: str
) -> None:
    answer = api.call(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    assert answer.json()["detail"] == {
        "field": "method",
        "reason": f"{method} is not allowed here; allowed: {allow}",
    }


def test_the_document_declares_the_limits_the_server_enforces(spec: dict[str, Any]) -> None:
    paths = spec["paths"]
    events = {p["name"]: p["schema"] for p in paths["/v1/events"]["get"]["parameters"]}
    assert events["after"]["anyOf"][0]["maximum"] == MAX_ID
    assert (events["limit"]["minimum"], events["limit"]["maximum"]) == (1, 10_000)
    logs = {
        p["name"]: p["schema"]
        for p in paths["/v1/workloads/{workload_id}/logs"]["get"]["parameters"]
    }
    assert logs["offset"]["maximum"] == MAX_ID
    assert logs["workload_id"]["maxLength"] == 128  # an id, an id prefix or a name
    for template, method in (("/v1/workloads", "post"), ("/v1/queues", "post")):
        too_large = paths[template][method]["responses"]["413"]
        assert str(MAX_BODY_BYTES) in too_large["description"]
    submit = spec["components"]["schemas"]["SubmitRequest"]["properties"]
    assert (submit["grace_s"]["minimum"], submit["grace_s"]["maximum"]) == (0, 3600)
    assert "1048576 bytes" in submit["command"]["description"]
    queue = spec["components"]["schemas"]["QueueBody"]["properties"]
    assert queue["name"]["maxLength"] == 128
    assert queue["quota"]["maximum"] == 1_000_000


def test_a_body_over_the_limit_is_the_listed_413(api: Api, spec: dict[str, Any]) -> None:
    answer = api.call(
        "POST", "/v1/workloads", b"{" + b" " * MAX_BODY_BYTES + b"}", "application/json"
    )
    assert answer.status_code == 413
    assert answer.json()["detail"]["field"] == "body"
    assert listed(spec, "/v1/workloads", "POST", 413)


def test_a_name_over_the_declared_length_is_refused_not_cut(api: Api) -> None:
    body = b'{"command": ["/bin/true"], "name": "' + "\u00e9".encode() * 129 + b'"}'
    answer = api.call("POST", "/v1/workloads", body, "application/json")
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == {
        "field": "name",
        "reason": "129 characters; the limit is 128",
    }
