"""The client without a server: socket resolution, how answers and refusals become wire
models and :class:`ClientError`, and the CLI's text rendering of units."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from fgpu.addresses import SYSTEM_SOCKET, default_socket_path
from fgpu.cli import render
from fgpu.cli.common import exit_code
from fgpu.client import Client, ClientError, ServerUnavailable, resolve_socket
from fgpu.client.client import foreign_default
from fgpu.wire import LOG_OFFSET_HEADER, ResourceRequest, SubmitRequest, WorkloadView


@pytest.mark.parametrize(
    ("env", "uid", "expected"),
    [
        ({"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000, "/run/user/1000/fgpu/fgpu.sock"),
        ({}, 1000, "/tmp/fgpu-1000/fgpu.sock"),
        ({"XDG_RUNTIME_DIR": ""}, 1000, "/tmp/fgpu-1000/fgpu.sock"),
        ({}, 0, "/run/fgpu/fgpu.sock"),
        ({"XDG_RUNTIME_DIR": "/run/user/0"}, 0, "/run/fgpu/fgpu.sock"),
    ],
    ids=["xdg", "no-xdg", "empty-xdg", "root", "root-with-xdg"],
)
def test_default_socket_path(env: dict[str, str], uid: int, expected: str) -> None:
    assert default_socket_path(env, uid) == Path(expected)


def test_resolve_socket_prefers_the_option_then_the_environment(tmp_path: Path) -> None:
    env = {"FGPU_SOCKET": str(tmp_path / "env.sock"), "XDG_RUNTIME_DIR": str(tmp_path)}
    assert resolve_socket(tmp_path / "opt.sock", env) == tmp_path / "opt.sock"
    assert resolve_socket(None, env) == tmp_path / "env.sock"


def test_resolve_socket_falls_back_to_the_system_server(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    own = tmp_path / "xdg" / "fgpu" / "fgpu.sock"
    system = tmp_path / "system.sock"
    assert resolve_socket(None, env, uid=1000, system=system) == own  # neither is there
    system.touch()
    assert resolve_socket(None, env, uid=1000, system=system) == system
    own.parent.mkdir(parents=True)
    own.touch()
    assert resolve_socket(None, env, uid=1000, system=system) == own
    nowhere = tmp_path / "none.sock"
    assert resolve_socket(None, env, uid=0, system=nowhere) == SYSTEM_SOCKET


def test_resolve_socket_skips_a_default_that_belongs_to_another_user(tmp_path: Path) -> None:
    # another user can create /tmp/fgpu-UID before its user: such a default never shadows
    # the system server; a socket named explicitly is used as given
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another uid")
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    own = tmp_path / "xdg" / "fgpu" / "fgpu.sock"
    own.parent.mkdir(parents=True)
    own.touch()
    system = tmp_path / "nowhere.sock"
    me = 1000
    assert resolve_socket(None, env, uid=me, system=system) == own
    assert foreign_default(own, me) is None
    os.chown(own.parent, 4242, 4242)
    assert resolve_socket(None, env, uid=me, system=system) == system
    assert foreign_default(own, me) == f"{own.parent} belongs to uid 4242"
    os.chown(own.parent, me, me)
    os.chown(own, 4242, 4242)
    assert resolve_socket(None, env, uid=me, system=system) == system
    assert foreign_default(own, me) == f"{own} belongs to uid 4242"
    assert resolve_socket(own, env, uid=me, system=system) == own


def mock_client(handler: httpx.MockTransport) -> Client:
    return Client(Path("/nonexistent.sock"), transport=handler)


def answer_with(status: int, body: object, headers: dict[str, str] | None = None) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=content, headers=headers)

    return mock_client(httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("status", "body", "field", "reason"),
    [
        (
            422,
            {"detail": {"field": "gpu", "reason": "must be in (0, 1)"}},
            "gpu",
            "must be in (0, 1)",
        ),
        (403, {"detail": {"field": "id", "reason": "not yours"}}, "id", "not yours"),
        (404, {"detail": "Not Found"}, "", "Not Found"),
        (500, b"Internal Server Error", "", "HTTP 500: Internal Server Error"),
        (502, b"", "", "HTTP 502: Bad Gateway"),
    ],
    ids=["field-reason", "forbidden", "string-detail", "text-body", "empty-body"],
)
def test_refusals_become_client_errors(status: int, body: object, field: str, reason: str) -> None:
    with answer_with(status, body) as client, pytest.raises(ClientError) as caught:
        client.nodes()
    assert (caught.value.status, caught.value.field, caught.value.reason) == (
        status,
        field,
        reason,
    )


def test_an_unexpected_answer_is_a_client_error() -> None:
    with answer_with(200, {"not": "a list"}) as client, pytest.raises(ClientError) as caught:
        client.nodes()
    assert "unexpected answer" in caught.value.reason


def test_a_refused_connection_says_how_to_start_a_server() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with (
        mock_client(httpx.MockTransport(refuse)) as client,
        pytest.raises(ServerUnavailable) as caught,
    ):
        client.list_workloads()
    assert caught.value.status == 0
    assert "start one with `fgpu serve`" in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file another user owns")
def test_a_submission_is_not_sent_to_a_socket_another_user_owns(tmp_path: Path) -> None:
    """Anyone may make /tmp/fgpu-UID first; the command and environment must not go there."""
    planted = tmp_path / "fgpu.sock"
    planted.touch()
    os.chown(planted, 1001, 1001)
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, content=b"{}")

    client = Client(planted, transport=httpx.MockTransport(record))
    with pytest.raises(ClientError) as caught:
        client.submit(SubmitRequest(command=["true"], gpu="0.5", env={"SECRET": "x"}))
    assert caught.value.field == "socket"
    assert "belongs to uid 1001, neither you (uid 0) nor root" in caught.value.reason
    assert sent == []
    os.chown(planted, 0, 0)  # root's own socket is fine
    with pytest.raises(ClientError):  # the mock answers {}, not a workload: but it was sent
        client.submit(SubmitRequest(command=["true"], gpu="0.5"))
    assert len(sent) == 1


def test_requests_carry_the_right_method_path_and_query() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"[]")

    with mock_client(httpx.MockTransport(record)) as client:
        client.list_workloads(include_done=True)
        client.events(after=7, limit=5)
    assert seen[0].method == "GET"
    assert seen[0].url.path == "/v1/workloads"
    assert seen[0].url.params["all"] == "true"
    assert dict(seen[1].url.params) == {"after": "7", "limit": "5"}


def test_ids_are_one_path_segment() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(404, json={"detail": {"field": "id", "reason": "no"}})

    with mock_client(httpx.MockTransport(record)) as client, pytest.raises(ClientError):
        client.cancel("../queues/x")
    assert seen == ["/v1/workloads/..%2Fqueues%2Fx/cancel"]


def test_logs_use_the_offset_header() -> None:
    with answer_with(200, b"abc", {LOG_OFFSET_HEADER: "10"}) as client:
        assert client.logs("w", offset=7) == (b"abc", 10)
    with answer_with(200, b"abc") as client:
        assert client.logs("w", offset=7) == (b"abc", 10)


def test_a_token_is_sent_as_bearer_to_a_url() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"version": "0", "server_uid": 0})

    with Client(
        base_url="http://h:1/", token="t0k", transport=httpx.MockTransport(record)
    ) as client:
        client.health()
    assert seen[0].headers["authorization"] == "Bearer t0k"
    assert str(seen[0].url) == "http://h:1/v1/healthz"


@pytest.mark.parametrize(
    ("status", "code"), [(422, 2), (400, 2), (403, 1), (404, 1), (409, 1), (0, 1), (500, 1)]
)
def test_exit_codes(status: int, code: int) -> None:
    assert exit_code(ClientError(status, "", "x")) == code


@pytest.mark.parametrize(
    ("milli", "text"), [(500, "0.5"), (1000, "1"), (2250, "2.25"), (0, "0"), (1, "0.001")]
)
def test_gpus_text(milli: int, text: str) -> None:
    assert render.gpus_text(milli) == text


@pytest.mark.parametrize(
    ("mib", "text"), [(20480, "20GiB"), (1536, "1.5GiB"), (512, "512MiB"), (None, "-")]
)
def test_memory_text(mib: int | None, text: str) -> None:
    assert render.memory_text(mib) == text


def request(
    count: int = 1,
    milli: int | None = None,
    mib: int | None = None,
    models: list[str] | None = None,
) -> ResourceRequest:
    return ResourceRequest(
        gpu_count=count,
        gpu_milli=milli,
        gpu_memory_mib=mib,
        gpu_models=models or [],
        cpu_milli=0,
        memory_mib=0,
    )


@pytest.mark.parametrize(
    ("req", "text"),
    [
        (request(1, 500), "0.5 GPU"),
        (request(2, None), "2 GPUs"),
        (request(2, 300), "2 x 0.3 GPU"),
        (request(1, 125, 5120), "0.125 GPU, 5GiB"),
        (request(1, None, 4096), "4GiB share of a GPU"),
        (request(2, None, 4096, ["A100-40GB"]), "4GiB share of each of 2 GPUs on A100-40GB"),
        (request(2, 1000, None, ["A100-80GB", "H100-80GB"]), "2 GPUs on A100-80GB or H100-80GB"),
        (request(0, None), "no GPU"),
        (
            request(1, 428, 40192).model_copy(
                update={"isolation": "mig", "mig_profile": "3g.40gb"}
            ),
            "MIG 3g.40gb",
        ),
        (request(1, None, 18432).model_copy(update={"isolation": "mig"}), "MIG, 18GiB"),
    ],
    ids=[
        "fraction",
        "whole",
        "fraction-each",
        "memory",
        "memory-only",
        "memory-only-each",
        "models",
        "none",
        "mig",
        "mig-memory",
    ],
)
def test_request_text(req: ResourceRequest, text: str) -> None:
    assert render.request_text(req) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(5, "5s"), (61, "1m"), (3 * 3600 + 5, "3h"), (2 * 86400, "2d")]
)
def test_age_text(seconds: float, text: str) -> None:
    assert render.age_text(1000.0, now=1000.0 + seconds) == text


def test_priority_text() -> None:
    assert render.priority_text(125) == "critical (125)"
    assert render.priority_text(70) == "70"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name", "plain name"),
        ("ünïcode ok", "ünïcode ok"),
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("two\nlines\ttab", "two\\nlines\\ttab"),
        ("c1\x9bcontrol", "c1\\x9bcontrol"),
    ],
    ids=["plain", "unicode", "escape", "newline-tab", "c1"],
)
def test_safe_shows_control_characters_as_escapes(text: str, shown: str) -> None:
    assert render.safe(text) == shown


def test_mig_grants_and_instances_render_with_their_profile_and_holder() -> None:
    from fgpu.wire import GpuGrant, GpuHolder, GpuView, MigInstanceView, NodeView

    grant = GpuGrant(
        node="vm/mig",
        index=1,
        uuid="GPU-1",
        compute_milli=428,
        memory_mib=40192,
        mig_profile="3g.40gb",
        mig_start=4,
        mig_uuid="MIG-a",
    )
    view = WorkloadView.model_construct(gpus=[grant])
    assert render.grants_text(view) == "vm/mig/1: MIG 3g.40gb@4 (39.25GiB) MIG-a"
    instances = [
        MigInstanceView(
            profile="3g.40gb",
            start=4,
            uuid="MIG-a",
            compute_milli=428,
            memory_mib=40192,
            workload_id="w1",
            name="train",
        ),
        MigInstanceView(
            profile="1g.10gb", start=0, uuid="MIG-b", compute_milli=142, memory_mib=9728
        ),
        MigInstanceView(
            profile="1g.10gb",
            start=1,
            uuid="MIG-c",
            compute_milli=142,
            memory_mib=9728,
            in_use_outside=True,
        ),
    ]
    gpu = GpuView(
        index=1,
        uuid="GPU-1",
        model="A100-80GB",
        memory_mib=81920,
        allocated_milli=428,
        allocated_memory_mib=40192,
        holders=[GpuHolder(workload_id="w1", name="train", compute_milli=428, memory_mib=40192)],
        mig_enabled=True,
        mig_instances=instances,
    )
    node = NodeView(name="vm/mig", backend="simulated", cpu_milli=0, memory_mib=0, gpus=[gpu])
    console = Console(width=200, record=True)
    console.print(render.top_table([node]))
    shown = console.export_text()
    assert "3g.40gb@4 MIG-a: w1 train" in shown
    assert "1g.10gb@0 MIG-b: free" in shown
    assert "1g.10gb@1 MIG-c: in use outside fgpu" in shown
