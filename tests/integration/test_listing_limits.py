"""Heavy listings cost the server a bounded amount (issue 27, trial finding: a page of 1,000
workloads with 256 KiB commands was ~256 MB per answer).

- A page stops before the workload that would cross ``--listing-max-bytes``; its cursor goes
  on, and ``fgpu ls`` (which follows cursors) still gets every workload (a real server).
- ``brief=true`` (what ``fgpu ls``'s table asks) cuts each command to 200 characters (the
  page is still bounded by the bytes it reads from the store: memory, not only the answer).
- At most ``--listings-at-once`` listings are made at once; beyond the queue a listing gets
  503 with ``Retry-After`` naming the limit (the app in-process, its gate held by the test).
- One user has at most one listing made at once and two waiting (one more gets 503 naming
  the per-user rule); a freed turn goes to the user served longest ago (the gate alone; the
  real multi-user flood is in test_listing_fairness.py).
- A bad ``--listing-max-bytes`` is refused at start, naming the flag.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fgpu.rules.errors import Unavailable
from fgpu.server.app import PEER_UID, create_app
from fgpu.server.listing import BRIEF_COMMAND_CHARS, ListingGate, brief_command, encode_page
from fgpu.server.service import Service
from fgpu.wire import NEXT_CURSOR_HEADER
from tests.serverproc import FGPU, ServerProcess, started_server, wait_for

BUDGET = 1024 * 1024
ARG = 100_000  # two arguments: ~200 KB of command per workload
COUNT = 12


@pytest.fixture(scope="module")
def heavy() -> Iterator[tuple[ServerProcess, list[str]]]:
    extra = ["--listing-max-bytes", "1MiB", "--max-active-per-user", "100"]
    with started_server("fgpu-heavy-", "1xA100-40GB", extra=extra) as server:
        ids = [
            server.submit(
                "--gpu", "0.5", "--gpu-model", "A100-40GB",
                command=["true", "a" * ARG, "b" * ARG],
            )
            for _ in range(COUNT)
        ]  # fmt: skip
        for workload_id in ids:  # finished: the --all listing reads them from the store
            server.cli("cancel", workload_id, check=False)
        server.wait_listing(
            lambda seen: all(seen[i]["phase"] in ("cancelled", "succeeded") for i in ids),
            "the heavy workloads to end",
        )
        yield server, ids


def get(server: ServerProcess, **params: str) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(server.socket))
    with httpx.Client(transport=transport, base_url="http://fgpu", timeout=60) as http:
        return http.get("/v1/workloads", params=params)


def test_a_page_stops_at_the_byte_budget_and_ls_follows_to_the_end(
    heavy: tuple[ServerProcess, list[str]],
) -> None:
    server, ids = heavy
    pages, cursor, seen = 0, None, []
    while True:
        params = {"all": "true", "limit": "1000"}
        if cursor:
            params["cursor"] = cursor
        answer = get(server, **params)
        assert answer.status_code == 200, answer.text
        assert len(answer.content) <= BUDGET, len(answer.content)
        page = answer.json()
        assert page, "a page holds at least one workload"
        seen += [w["id"] for w in page]
        pages += 1
        cursor = answer.headers.get(NEXT_CURSOR_HEADER)
        if not cursor:
            break
    assert pages >= COUNT * 2 * ARG // BUDGET  # ~2.4 MB of commands: at least 2 pages
    assert [i for i in seen if i in ids] == ids
    listed = server.json("ls", "--all", "--all-users")
    assert [w["id"] for w in listed if w["id"] in ids] == ids
    assert all(len(w["command"][1]) == ARG for w in listed if w["id"] in ids)


def test_brief_cuts_each_command_for_the_table(
    heavy: tuple[ServerProcess, list[str]],
) -> None:
    server, ids = heavy
    page: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:  # pages are still cut by the bytes read from the store, not only sent
        params = {"all": "true", "brief": "true"}
        if cursor:
            params["cursor"] = cursor
        answer = get(server, **params)
        assert answer.status_code == 200
        assert len(answer.content) < 20_000  # ~300 bytes a workload
        page.update((w["id"], w) for w in answer.json())
        cursor = answer.headers.get(NEXT_CURSOR_HEADER)
        if not cursor:
            break
    assert set(ids) <= page.keys()
    for workload_id in ids:
        command = page[workload_id]["command"]
        assert sum(len(a) for a in command) <= BRIEF_COMMAND_CHARS
        assert command[0] == "true"
        assert command[-1].endswith("...")
    table = server.cli("ls", "--all")
    assert table.returncode == 0
    assert ids[0] in table.stdout


@pytest.mark.parametrize(
    ("argv", "cut"),
    [
        pytest.param(["sleep", "60"], ["sleep", "60"], id="short-kept"),
        pytest.param(["x" * 300], ["x" * 197 + "..."], id="one-long"),
        pytest.param(["a" * 150, "b" * 100], ["a" * 150, "b" * 47 + "..."], id="second-cut"),
        pytest.param(["a" * 200, "b"], ["a" * 200, "..."], id="exactly-full"),
    ],
)
def test_brief_command(argv: list[str], cut: list[str]) -> None:
    assert brief_command(argv) == cut


def test_encode_page_stops_before_crossing_and_keeps_one() -> None:
    items = [b'"' + b"x" * 98 + b'"'] * 5  # 100 bytes each
    body, count = encode_page(items, lambda b: b, 2 + 100 * 3 + 2)
    assert count == 3
    assert len(body) == 2 + 300 + 2
    assert json.loads(body) == ["x" * 98] * 3
    body, count = encode_page(items, lambda b: b, 10)
    assert count == 1  # a page holds at least one


def test_the_gate_queues_then_refuses() -> None:
    gate = ListingGate(concurrent=1, queued=1, wait_s=60)
    release = threading.Event()
    inside = threading.Event()
    second_done = threading.Event()

    def first() -> None:
        with gate.turn():
            inside.set()
            release.wait(60)

    def second() -> None:
        with gate.turn():
            second_done.set()

    one = threading.Thread(target=first)
    one.start()
    assert inside.wait(60)
    two = threading.Thread(target=second)
    two.start()
    wait_for(lambda: gate.waiting == 1, "the second listing to wait")
    with pytest.raises(Unavailable) as refused, gate.turn():
        pass
    assert refused.value.status == 503
    assert "at most 1 listings are made at once and 1 wait" in refused.value.reason
    assert not second_done.is_set()
    release.set()
    assert second_done.wait(60)
    one.join(60)
    two.join(60)
    assert (gate.running, gate.waiting) == (0, 0)


def test_a_listing_beyond_the_queue_gets_503_with_retry_after(tmp_path: Path) -> None:
    service = Service.create(
        db=str(tmp_path / "fgpu.db"), simulate_gpus="1xA100-40GB", state_dir=tmp_path / "s"
    )
    service.listing_gate = ListingGate(concurrent=1, queued=0)
    app = create_app(service)

    async def as_root(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app({**scope, PEER_UID: 0} if scope["type"] == "http" else scope, receive, send)

    async def listing() -> httpx.Response:
        transport = httpx.ASGITransport(app=as_root)
        async with httpx.AsyncClient(transport=transport, base_url="http://fgpu") as http:
            return await http.get("/v1/workloads")

    try:
        assert asyncio.run(listing()).status_code == 200
        with service.listing_gate.turn():  # another listing is being made
            busy = asyncio.run(listing())
        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "1"
        assert busy.json()["detail"]["field"] == "listing"
        assert "at most 1 listings are made at once" in busy.json()["detail"]["reason"]
        assert asyncio.run(listing()).status_code == 200  # the turn is back
    finally:
        service.store.close()


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        pytest.param("--listing-max-bytes", "1KiB", "at least 65536", id="too-small"),
        pytest.param("--listing-max-bytes", "lots", "'lots'", id="not-a-size"),
        pytest.param("--listings-at-once", "0", "must be at least 1", id="no-listing"),
    ],
)
def test_bad_listing_flags_are_refused_at_start(
    tmp_path: Path, flag: str, value: str, words: str
) -> None:
    where = ["--socket", str(tmp_path / "s.sock"), "--state-dir", str(tmp_path)]
    result = subprocess.run(
        [*FGPU, "serve", *where, "--simulate-gpus", "1xA100-40GB", flag, value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr, result.stderr
    assert words in result.stderr, result.stderr


class Holder:
    """A thread holding a turn of ``gate`` as ``user`` until :attr:`release` is set."""

    def __init__(self, gate: ListingGate, user: int) -> None:
        self.release = threading.Event()
        self.inside = threading.Event()
        self.error: Unavailable | None = None
        self._gate = gate
        self._user = user
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._gate.turn(self._user):
                self.inside.set()
                self.release.wait(60)
        except Unavailable as refused:
            self.error = refused

    def finish(self) -> None:
        self.release.set()
        self._thread.join(60)


def test_the_gate_gives_one_user_one_turn_and_two_waiting() -> None:
    gate = ListingGate(concurrent=2, queued=16, wait_s=60)
    bob, alice = 1001, 1002
    first = Holder(gate, bob)
    assert first.inside.wait(60)
    waiters = [Holder(gate, bob), Holder(gate, bob)]  # bob's other turn stays for others
    wait_for(lambda: gate.waiting_of(bob) == 2, "bob's two listings to wait")
    assert gate.running == 1
    with pytest.raises(Unavailable) as refused, gate.turn(bob):
        pass
    assert refused.value.status == 503
    assert refused.value.retry_after_s == 1
    assert "uid 1001 already has 1 being made and 2 waiting" in refused.value.reason
    assert "each user gets at most 1 made at once and 2 waiting" in refused.value.reason
    with gate.turn(alice):  # the other turn is alice's at once, bob's queue or not
        assert (gate.running_of(alice), gate.running_of(bob)) == (1, 1)
    first.finish()
    wait_for(lambda: sum(w.inside.is_set() for w in waiters) == 1, "one of bob's to go")
    assert gate.running_of(bob) == 1  # never two of bob's at once
    for waiter in waiters:
        waiter.finish()
    assert [w.error for w in waiters] == [None, None]
    assert all(w.inside.is_set() for w in waiters)
    assert (gate.running, gate.waiting) == (0, 0)


def test_a_freed_turn_goes_to_the_user_served_longest_ago() -> None:
    gate = ListingGate(concurrent=1, queued=16, wait_s=60, per_user_queued=2)
    bob, alice = 1001, 1002
    first = Holder(gate, bob)
    assert first.inside.wait(60)
    bob_next = Holder(gate, bob)  # waits first
    wait_for(lambda: gate.waiting == 1, "bob's second listing to wait")
    alice_next = Holder(gate, alice)  # waits after, but alice was not served yet
    wait_for(lambda: gate.waiting == 2, "alice's listing to wait")
    first.finish()
    assert alice_next.inside.wait(60)
    assert not bob_next.inside.is_set()
    alice_next.finish()
    assert bob_next.inside.wait(60)
    bob_next.finish()
    assert (gate.running, gate.waiting) == (0, 0)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        pytest.param({"per_user": 0}, "per_user 0 must be >= 1", id="per-user"),
        pytest.param({"per_user_queued": -1}, "per_user_queued -1 >= 0", id="queued"),
    ],
)
def test_the_gate_refuses_bad_shares(options: dict[str, int], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ListingGate(**options)
