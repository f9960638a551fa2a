"""The API fuzzed from its own OpenAPI document (issue 14, point 8): schemathesis generates
requests for every operation the served ``/openapi.json`` lists, valid and invalid, and
checks every answer: no server error, every status and body as the document says. The real
service on simulated GPUs, served over TCP with a token (uvicorn in a thread), as a
client elsewhere would call it.

Commands are forced to ``/bin/true`` (whatever else a generated submission says), so the
fuzzer never runs anything of its own. Bounded: a fixed number of examples per operation
(:data:`EXAMPLES`), a few minutes at most on a loaded 2-core machine.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a dev dependency")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from fgpu.client import Client  # noqa: E402
from fgpu.server.app import create_app  # noqa: E402
from fgpu.server.service import Service  # noqa: E402
from fgpu.server.uds import ApiServer  # noqa: E402

TOKEN = "fuzz-token-0123456789abcdef"
EXAMPLES = 100
HARMLESS = ["/bin/true"]


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """The real API over TCP; its base URL."""
    folder = Path(tempfile.mkdtemp(prefix="fgpu-fuzz-", dir="/tmp"))
    service = Service.create(
        db=str(folder / "fgpu.db"), simulate_gpus="2xA100-40GB", state_dir=folder / "state"
    )
    server = ApiServer(folder / "run" / "fgpu.sock", ("127.0.0.1", 0), log_level="warning")
    server.bind()
    tcp = server.tcp_address
    assert tcp is not None
    thread = threading.Thread(target=server.run, args=(create_app(service, token=TOKEN),))
    thread.start()
    try:
        assert server.started.wait(30), "the server did not start"
        yield f"http://{tcp[0]}:{tcp[1]}"
    finally:
        with Client(folder / "run" / "fgpu.sock") as client:
            for view in client.list_workloads():
                client.cancel(view.id)
        server.stop()
        thread.join(30)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def api_schema(served: str) -> Any:
    return schemathesis.openapi.from_url(
        f"{served}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}
    )


def harmless(body: Any) -> Any:
    """A submission's command replaced by :data:`HARMLESS` (other bodies as they are)."""
    if isinstance(body, dict) and isinstance(body.get("command"), list):
        return {**body, "command": HARMLESS, "shell": False}
    return body


def _excluded() -> list[Any]:
    from schemathesis.checks import CHECKS, load_all_checks

    load_all_checks()
    return [check for check in CHECKS.get_all() if check.__name__ == "positive_data_acceptance"]


EXCLUDED = _excluded()
"""``positive_data_acceptance`` expects every request the document allows to succeed; the
service refuses many of them for reasons a JSON schema cannot state (a GPU fraction
``"abc"``, a relative ``cwd``, an unknown queue) with a 422 that the document lists, which
is no violation of it. Every other default check runs."""


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_answer_is_what_the_document_says(api_schema: Any, mode: str) -> None:
    """Every operation, :data:`EXAMPLES` generated requests each (valid ones, then ones
    that break the document), every default check of schemathesis on every answer."""
    generation = schemathesis.GenerationMode(mode)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=generation))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: Any) -> None:
            if case.operation.method.upper() == "POST" and case.operation.path == "/v1/workloads":
                case.body = harmless(case.body)
            case.call_and_validate(
                headers={"Authorization": f"Bearer {TOKEN}"}, excluded_checks=EXCLUDED
            )

        try:
            run()
        except Unsatisfiable:  # nothing to break: an operation without parameters or body
            assert generation is schemathesis.GenerationMode.NEGATIVE
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
