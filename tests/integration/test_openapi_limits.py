"""The OpenAPI document's limits are the server's (issue 27, point 7: the fuzzer found five
values the document allowed and the server refused).

The served ``/openapi.json`` is walked: every bound of every request body field and query or
path parameter (``minimum``, ``maximum``, ``minLength``, ``maxLength``, ``minItems``,
``maxItems``, ``uniqueItems``, ``pattern``, ``propertyNames``, ``additionalProperties``) is
tried on the real service (simulated GPUs, served over TCP with a token): a value at the
bound must not be refused for that field, a value one step past it must be refused naming
that field (400 or 422). Patterns are tried with probes, each of which the document and the
server must judge alike. A bound the walk does not know fails the test, so a new kind cannot
slip by.
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fgpu.server.app import create_app
from fgpu.server.service import Service
from fgpu.server.uds import ApiServer

TOKEN = "limits-token-0123456789abcdef"
KNOWN = {
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "pattern",
    "propertyNames",
    "additionalProperties",
    "enum",
}
"""The bound keywords the walk tries; any other keyword with a bound fails the test."""
IGNORED = {"type", "title", "description", "default", "anyOf", "items", "$ref", "format"}

PROBES: dict[str, list[str]] = {
    # strings whose only possible refusal is the pattern (a member must also exist here, so
    # the probes that fit the pattern name root, uids or everyone)
    "members": ["*", "0", "@0", "root", "@root", "1000", "a b", "@", "", "r" * 40, "*x", "!x"],
    "default": [
        "a",
        "A9",
        "a.b_c-d",
        "-a",
        ".",
        "..",
        "...",
        " ",
        " a",
        "a b",
        "a/b",
        "/abs",
        "a\x00b",
        "é",
        "a\u202eb",
        "a\u2028b",
        "a\x07b",
        "*",
        "@grp",
        "A=B",
        "_x",
        "1",
    ],
}
_names = itertools.count()


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    """An HTTP client of the real API over TCP, and the document it serves."""
    folder = Path(tempfile.mkdtemp(prefix="fgpu-limits-", dir="/tmp"))
    service = Service.create(
        db=str(folder / "fgpu.db"), simulate_gpus="2xA100-80GB", state_dir=folder / "state"
    )
    server = ApiServer(folder / "run" / "fgpu.sock", ("127.0.0.1", 0), log_level="warning")
    server.bind()
    tcp = server.tcp_address
    assert tcp is not None
    thread = threading.Thread(target=server.run, args=(create_app(service, token=TOKEN),))
    thread.start()
    try:
        assert server.started.wait(30), "the server did not start"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=f"http://{tcp[0]}:{tcp[1]}", headers=headers) as client:
            doc = client.get("/openapi.json").json()
            yield client, doc
            for view in client.get("/v1/workloads").json():
                client.post(f"/v1/workloads/{view['id']}/cancel")
    finally:
        server.stop()
        thread.join(30)
        shutil.rmtree(folder, ignore_errors=True)


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return dict(doc["components"]["schemas"][ref.rsplit("/", 1)[-1]])


def kind_of(schema: dict[str, Any]) -> str:
    """The JSON type a (nullable) schema takes apart from null."""
    if "type" in schema:
        return str(schema["type"])
    kinds = [b.get("type") for b in schema.get("anyOf", []) if b.get("type") != "null"]
    if not kinds:
        return "string"  # propertyNames: names are strings
    return "integer" if "integer" in kinds else str(kinds[0])


def filler(op: str, field: str) -> str:
    """A character every pattern of the field takes (its own per field, so that queues
    made for one check are not another's)."""
    grammar = {"time": "0", "default_time": "0", "max_time": "0"}  # 000... reads as 0
    if field in grammar:
        return grammar[field]
    return {("workloads", "queue"): "s", ("queues", "parent"): "p"}.get((op, field), "a")


def tries(op: str, field: str, schema: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """(label, value, the document accepts it) for every bound of a field."""
    unknown = set(schema) - KNOWN - IGNORED
    assert not unknown, f"{op}.{field}: bound keywords the walk does not try: {unknown}"
    kind = kind_of(schema)
    out: list[tuple[str, Any, bool]] = []
    step: Any = 1 if kind == "integer" else 0.5
    if "minimum" in schema:
        low = int(schema["minimum"]) if kind == "integer" else schema["minimum"]
        out += [(f"minimum {low}", low, True), (f"below minimum {low}", low - step, False)]
    if "maximum" in schema:
        high = int(schema["maximum"]) if kind == "integer" else schema["maximum"]
        out += [(f"maximum {high}", high, True), (f"above maximum {high}", high + step, False)]
    for member in schema.get("enum", []):
        out.append((f"enum {member!r}", member, True))
    if "enum" in schema:
        out.append(("not in the enum", "not-" + str(schema["enum"][0]), False))
    char = filler(op, field)
    start = "/" if field == "cwd" else ""
    if "minLength" in schema and schema["minLength"] > 0:
        n = schema["minLength"]
        out += [(f"minLength {n}", start + char * n, True)]
        out += [(f"below minLength {n}", start + char * (n - 1 - len(start)), False)]
    if "maxLength" in schema:
        n = schema["maxLength"]
        body = n - len(start)  # a path keeps its leading /
        out += [(f"maxLength {n}", start + char * body, True)]
        out += [(f"above maxLength {n}", start + char * (body + 1), False)]
    if "pattern" in schema:
        pattern = re.compile(schema["pattern"])
        for probe in PROBES.get(field, PROBES["default"]):
            value = start + probe if field == "cwd" and probe and probe[0] != "/" else probe
            out.append((f"pattern on {value!r}", value, pattern.search(value) is not None))
    if kind == "array":
        item = resolve({}, schema.get("items", {}))
        base = ["/bin/true"] if field == "command" else []
        if "minItems" in schema:
            n = schema["minItems"]
            out += [(f"minItems {n}", ["/bin/true"] * n, True), ("no items", [], False)]
        if "maxItems" in schema:
            n = schema["maxItems"]
            many = [str(1000 + i) for i in range(n + 1)]
            out += [(f"maxItems {n}", many[:n], True), (f"above maxItems {n}", many, False)]
        if schema.get("uniqueItems"):
            out += [("unique items", ["0", "1"], True), ("a repeated item", ["0", "0"], False)]
        for label, value, fits in tries(op, field, item):
            out.append((f"item {label}", [*base, value], fits))
    if kind == "object":
        names = schema.get("propertyNames", {})
        for label, value, fits in tries(op, field, names):
            out.append((f"name {label}", {value: "v"}, fits))
        values = schema.get("additionalProperties", {})
        if isinstance(values, dict):
            for label, value, fits in tries(op, field, values):
                out.append((f"value {label}", {"K": value}, fits))
    return out


def base_body(op: str) -> dict[str, Any]:
    if op == "workloads":
        return {"command": ["/bin/true"], "gpu": "0.01", "grace_s": 1.0}
    return {"name": f"q{next(_names)}", "members": ["*"]}


def prepare(client: httpx.Client, op: str, field: str, value: Any) -> None:
    """Make a queue that a value names, where the field names an existing queue."""
    names_queue = (op, field) in (("workloads", "queue"), ("queues", "parent"))
    if names_queue and isinstance(value, str) and 0 < len(value) <= 128:
        client.post("/v1/queues", json={"name": value, "members": ["*"]})


def refused_for(answer: httpx.Response, field: str) -> bool:
    if answer.status_code not in (400, 422):
        return False
    said = str(answer.json()["detail"]["field"])
    return said == field or said.startswith((f"{field}.", f"{field}["))


def test_every_body_bound_of_the_document_is_the_servers(
    api: tuple[httpx.Client, dict[str, Any]],
) -> None:
    client, doc = api
    wrong: list[str] = []
    tried = 0
    for op, path in (("workloads", "/v1/workloads"), ("queues", "/v1/queues")):
        body_ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        schema = resolve(doc, body_ref["schema"])
        for field, prop in schema["properties"].items():
            for label, value, fits in tries(op, field, resolve(doc, prop)):
                prepare(client, op, field, value)
                body = base_body(op)
                body[field] = value
                answer = client.post(path, json=body)
                tried += 1
                refused = refused_for(answer, field)
                if refused == fits:
                    detail = answer.text[:300]
                    verdict = "refuses" if refused else "accepts"
                    wrong.append(
                        f"{op}.{field} {label}: the document {'accepts' if fits else 'refuses'}, "
                        f"the server {verdict} ({answer.status_code} {detail})"
                    )
                if answer.status_code == 201 and op == "workloads":
                    client.post(f"/v1/workloads/{answer.json()['id']}/cancel")
    assert tried > 100, tried
    assert not wrong, "\n".join(wrong)


def test_every_parameter_bound_of_the_document_is_the_servers(
    api: tuple[httpx.Client, dict[str, Any]],
) -> None:
    client, doc = api
    wrong: list[str] = []
    tried = 0
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method not in ("get", "delete"):
                continue  # the bodies are the other test's; these change nothing
            for parameter in operation.get("parameters", []):
                name = parameter["name"]
                where = parameter["in"]
                for label, value, fits in tries(path, name, resolve(doc, parameter["schema"])):
                    if where == "path":
                        target = path.replace("{" + name + "}", str(value) or "%20")
                        params: dict[str, Any] = {}
                    else:
                        target = re.sub(r"\{[^}]+\}", "x", path)
                        params = {name: value}
                    if not fits and where == "path" and value == "":
                        continue  # an empty segment routes elsewhere
                    answer = client.request(method.upper(), target, params=params)
                    tried += 1
                    refused = refused_for(answer, name)
                    if refused == fits:
                        wrong.append(
                            f"{method.upper()} {path} {name} {label}: the document "
                            f"{'accepts' if fits else 'refuses'}, the server answers "
                            f"{answer.status_code} {answer.text[:200]}"
                        )
    assert tried > 10, tried
    assert not wrong, "\n".join(wrong)


def test_the_servers_own_checks_read_the_same_constants() -> None:
    """The validators and the document share one source: a change there moves both."""
    from fgpu import wire_limits
    from fgpu.rules import names, requests
    from fgpu.store import schema, validate

    assert validate.QUEUE_NAME.pattern == wire_limits.QUEUE_NAME_PATTERN
    assert validate.MEMBER.pattern == wire_limits.MEMBER_PATTERN
    assert validate.MAX_AMOUNT == wire_limits.MAX_AMOUNT
    assert float(wire_limits.MAX_AMOUNT) == wire_limits.MAX_AMOUNT  # a double says it exactly
    assert requests.MAX_GRACE_S == wire_limits.MAX_GRACE_S
    assert requests.MAX_ARGUMENT_BYTES == wire_limits.MAX_ARGUMENT_BYTES
    assert names.NAME_LENGTH == schema.NAME_LENGTH == wire_limits.NAME_LENGTH


def document_accepts(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` meets the bound keywords of ``schema`` (JSON Schema's meaning of
    each; type-specific keywords apply to their type only)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf)
    if isinstance(value, str):
        pattern = schema.get("pattern")
        return (
            schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", math.inf)
            and (pattern is None or re.search(pattern, value) is not None)
            and value in schema.get("enum", [value])
        )
    if isinstance(value, list):
        items = schema.get("items", {})
        return (
            schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf)
            and (not schema.get("uniqueItems") or len(set(map(repr, value))) == len(value))
            and all(document_accepts(items, v) for v in value)
        )
    if isinstance(value, dict):
        names = schema.get("propertyNames", {})
        values = schema.get("additionalProperties", {})
        values = values if isinstance(values, dict) else {}
        return all(
            document_accepts(names, k) and document_accepts(values, v) for k, v in value.items()
        )
    return True


REFUSED = [
    ("workloads", "command", []),
    ("workloads", "command", ["/bin/true", ""]),
    ("workloads", "command", ["/bin/true", "a\x00b"]),
    ("workloads", "name", ""),
    ("workloads", "name", "-x"),
    ("workloads", "name", "a/b"),
    ("workloads", "name", ".."),
    ("workloads", "name", "   "),
    ("workloads", "name", "a\u202eb"),
    ("workloads", "queue", ""),
    ("workloads", "cwd", "relative/dir"),
    ("workloads", "env", {"A=B": "1"}),
    ("workloads", "env", {"": "1"}),
    ("workloads", "grace_s", 3600.5),
    ("queues", "name", "-bad"),
    ("queues", "name", "a b"),
    ("queues", "parent", ""),
    ("queues", "members", ["a b"]),
    ("queues", "members", ["0", "0"]),
    ("queues", "max_priority", 1001),
    ("queues", "priority", 2**62),
    ("queues", "max_active_per_user", 0),
    ("queues", "max_stored_bytes", 1023),
]
"""Values the server refuses for a bound (the fuzzer's five among them: an empty command,
an empty name, a repeated member, a malformed queue name, and 2**62 - 1 written as a
double): the document must refuse each too."""


@pytest.mark.parametrize(("op", "field", "value"), REFUSED, ids=lambda v: repr(v)[:30])
def test_the_document_refuses_what_the_server_refuses(
    api: tuple[httpx.Client, dict[str, Any]], op: str, field: str, value: Any
) -> None:
    client, doc = api
    path = f"/v1/{op}"
    body_ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    prop = resolve(doc, resolve(doc, body_ref["schema"])["properties"][field])
    body = base_body(op)
    body[field] = value
    answer = client.post(path, json=body)
    assert refused_for(answer, field), answer.text  # the server refuses it, naming the field
    assert not document_accepts(prop, value), prop  # and so does the document
