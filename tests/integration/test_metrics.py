"""``/metrics`` of ``fgpu serve`` during a scripted scenario (issue 15): two ``-g 0.5`` on
one GPU allocate it whole, a third waits with its reason, a cancel removes the workload's
series; the exposition parses with prometheus-client's own parser, every fixed family has
its declared type, and the same series are served on the API socket, the TCP listener (with
the token only) and ``--metrics-listen``."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fgpu.metrics.names import SERIES
from tests.serverproc import ServerProcess, sleeper, wait_for

TOKEN = "metrics-token-0123456789abcdef"
GIB = 1024**3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Samples by name, and each family's type, through the client library's parser."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return samples, types


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerProcess, int, int]]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    tcp, plain = free_port(), free_port()
    extra = ["--listen", f"127.0.0.1:{tcp}", "--token-file", str(token)]
    # a token caller may not be root (issue 27): nobody, when the tests run as root
    token_user = "65534" if os.geteuid() == 0 else str(os.geteuid())
    extra += ["--token-user", token_user, "--metrics-listen", f"127.0.0.1:{plain}"]
    proc = ServerProcess(tmp_path, "1xA100-40GB", extra)
    proc.start()
    try:
        yield proc, tcp, plain
    finally:
        proc.cleanup()


def scrape(proc: ServerProcess) -> tuple[Samples, dict[str, str]]:
    transport = httpx.HTTPTransport(uds=str(proc.socket))
    with httpx.Client(transport=transport, base_url="http://fgpu", timeout=30) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return parse(answer.text)


def value(samples: Samples, series: str, /, **labels: str) -> float | None:
    """The one sample of ``series`` whose labels include ``labels`` (None: none)."""
    found = [v for ls, v in samples.get(series, []) if labels.items() <= ls.items()]
    assert len(found) <= 1, f"{series}{labels}: {found}"
    return found[0] if found else None


def test_a_scripted_scenario_shows_in_the_series(server: tuple[ServerProcess, int, int]) -> None:
    proc, tcp, plain = server
    samples, types = scrape(proc)
    for name, series in SERIES.items():  # every family declared, with its type
        family = name.removesuffix("_total") if series.type == "counter" else name
        if name.startswith("fgpu_workload_"):
            continue  # no workload yet: these families are empty (and so absent)
        assert types.get(family) == series.type, f"{name}: {types.get(family)}"
    gpu = {"node": os.uname().nodename, "gpu": "0", "model": "A100-40GB"}
    assert value(samples, "fgpu_gpu_compute_allocated_ratio", **gpu) == 0.0
    assert value(samples, "fgpu_gpu_memory_total_bytes", **gpu) == 40 * GIB
    assert value(samples, "fgpu_gpu_memory_used_bytes", **gpu) == 0.0
    assert value(samples, "fgpu_gpu_utilization_ratio", **gpu) == 0.0
    assert value(samples, "fgpu_queue_quota_gpus", queue="default") == 1.0

    a = proc.submit("-g", "0.5", "--name", "train-a", command=sleeper(300))
    b = proc.submit("-g", "0.5", "--name", "train-b", command=sleeper(300))
    proc.wait_phase(a, "running")
    proc.wait_phase(b, "running")
    samples, types = scrape(proc)
    assert value(samples, "fgpu_gpu_compute_allocated_ratio", **gpu) == 1.0
    assert value(samples, "fgpu_gpu_memory_allocated_bytes", **gpu) == 40 * GIB
    for wid, name in ((a, "train-a"), (b, "train-b")):
        labels = {"workload": wid, "name": name, "queue": "default", "gpu": "0"}
        assert value(samples, "fgpu_workload_compute_share_ratio", **labels) == 0.5
        assert value(samples, "fgpu_workload_gpu_memory_limit_bytes", **labels) == 20 * GIB
        assert value(samples, "fgpu_workload_gpu_memory_used_bytes", **labels) == 0.0
        achieved = value(samples, "fgpu_workload_compute_achieved_ratio", **labels)
        assert achieved is not None
        assert 0.0 <= achieved <= 1.0
        for reason in ("share", "priority"):
            paused = value(samples, "fgpu_workload_paused_seconds_total", reason=reason, **labels)
            assert paused is not None
            assert paused >= 0.0
    assert types["fgpu_workload_paused_seconds"] == "counter"
    assert value(samples, "fgpu_queue_allocated_gpus", queue="default") == 1.0
    assert value(samples, "fgpu_submission_to_start_seconds_count", queue="default") == 2.0
    assert value(samples, "fgpu_scheduling_round_seconds_count") >= 1.0  # type: ignore[operator]
    frag = value(samples, "fgpu_fragmentation_ratio")
    assert frag is not None
    assert 0.0 <= frag <= 1.0

    c = proc.submit("-g", "0.5", "--name", "third", command=sleeper(300))

    def third_waits() -> bool:
        got = scrape(proc)[0]
        return value(got, "fgpu_queue_pending_workloads", queue="default", reason="capacity") == 1

    wait_for(third_waits, "the third workload pending for capacity in the series")

    proc.cli("cancel", a)

    def a_gone() -> bool:
        got = scrape(proc)[0]
        return not any(ls.get("workload") == a for s in got.values() for ls, _ in s)

    wait_for(a_gone, "the cancelled workload's series to disappear")
    proc.wait_phase(c, "running")
    samples, _ = scrape(proc)
    assert value(samples, "fgpu_workloads_total", phase="cancelled") == 1.0
    assert value(samples, "fgpu_queue_pending_workloads", queue="default", reason="capacity") == 0
    assert {v for _, v in samples["fgpu_queue_pending_workloads"]} == {0.0}
    assert value(samples, "fgpu_workload_compute_share_ratio", workload=c) == 0.5

    # the same series on the TCP listener (token only) and on --metrics-listen
    with httpx.Client(base_url=f"http://127.0.0.1:{tcp}", timeout=30) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401
        assert refused.json()["detail"]["field"] == "authorization"
        answer = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200
        assert value(parse(answer.text)[0], "fgpu_workload_compute_share_ratio", workload=c)
    answer = httpx.get(f"http://127.0.0.1:{plain}/metrics", timeout=30)
    assert answer.status_code == 200
    for other in ("/", "/metricsx", "/v1/workloads"):  # only /metrics
        assert httpx.get(f"http://127.0.0.1:{plain}{other}", timeout=30).status_code == 404
    assert "not a loopback address" not in proc.server_log()  # 127.0.0.1: no warning
    got = parse(answer.text)[0]
    assert value(got, "fgpu_gpu_compute_allocated_ratio", **gpu) == 1.0
    assert {n for n in got if n.startswith("fgpu_")} == {
        n for n in samples if n.startswith("fgpu_")
    }


@pytest.mark.parametrize(
    ("given", "why"),
    [("nohost", "expected HOST:PORT"), ("", "empty"), ("  ", "empty"), (":0", "port must be")],
)
def test_metrics_listen_refuses_a_bad_address(tmp_path: Path, given: str, why: str) -> None:
    from typer.testing import CliRunner

    from fgpu.cli import app

    sock = tmp_path / "run" / "fgpu.sock"
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--socket",
            str(sock),
            "--state-dir",
            str(tmp_path / "s"),
            "--metrics-listen",
            given,
        ],
    )
    assert result.exit_code == 2
    assert f"--metrics-listen: {given!r}" in result.stderr
    assert why in result.stderr
    assert not sock.exists()


def test_a_metrics_port_off_loopback_is_warned_about(tmp_path: Path) -> None:
    """``--metrics-listen`` on every address serves names without a token: said at start."""
    port = free_port()
    proc = ServerProcess(tmp_path, "1xA100-40GB", ["--metrics-listen", f"0.0.0.0:{port}"])
    proc.start()
    try:
        wait_for(
            lambda: "not a loopback address" in proc.server_log(), "the warning in the server log"
        )
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
    finally:
        proc.cleanup()


def test_a_restart_after_preemption_is_not_a_new_start(tmp_path: Path) -> None:
    """In-process service: a low-priority workload preempted by a critical one and started
    again counts once in ``fgpu_submission_to_start_seconds``; the preemption counts once;
    the series read from the service's memory agree with its API listing."""
    import asyncio
    import sys
    import time

    from fgpu.server.service import Caller, Service
    from fgpu.wire import SubmitRequest

    me = Caller(os.getuid(), admin=True)
    release = tmp_path / "may-end"
    waits = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)"

    def job(name: str, priority: str, gpu: str) -> SubmitRequest:
        command = [sys.executable, "-c", waits, str(release if name == "infer" else "/none")]
        return SubmitRequest(command=command, gpu=gpu, priority=priority, name=name, grace_s=1.0)

    async def until(check: Callable[[], bool], what: str) -> None:
        end = time.monotonic() + 60
        while not check():
            assert time.monotonic() < end, f"not reached in 60 s: {what}"
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        svc = Service.create(
            simulate_gpus="1xA100-40GB", state_dir=tmp_path / "s", db=str(tmp_path / "m.db")
        )
        await svc.start()
        try:
            phase = lambda wid: svc.get_workload(wid).phase  # noqa: E731
            batch = svc.submit(me, job("batch", "low", "0.7")).id
            await until(lambda: phase(batch) == "running", "batch running")
            infer = svc.submit(me, job("infer", "critical", "0.5")).id
            await until(lambda: phase(infer) == "running", "infer running")
            samples = parse(svc.metrics.exposition().decode())[0]
            assert value(samples, "fgpu_preemptions_total", kind="preempt") == 1.0
            waiting = samples["fgpu_queue_pending_workloads"]
            assert sum(v for ls, v in waiting if ls["queue"] == "default") == 1.0
            release.touch()
            await until(lambda: phase(infer) == "succeeded", "infer done")
            await until(lambda: svc.get_workload(batch).restarts == 1, "batch restarted")
            await until(lambda: phase(batch) == "running", "batch running again")
            samples = parse(svc.metrics.exposition().decode())[0]
            started = "fgpu_submission_to_start_seconds_count"
            assert value(samples, started, queue="default", priority="critical") == 1.0
            assert value(samples, started, queue="default", priority="low") == 1.0  # not 2
            for node in svc.nodes():  # memory and the API listing agree
                for g in node.gpus:
                    labels = {"node": node.name, "gpu": str(g.index)}
                    ratio = value(samples, "fgpu_gpu_compute_allocated_ratio", **labels)
                    assert ratio == g.allocated_milli / 1000
            share = value(samples, "fgpu_workload_compute_share_ratio", workload=batch)
            assert share == 0.7
            svc.cancel(me, batch)
            await until(lambda: phase(batch) == "cancelled", "batch stopped")
        finally:
            await svc.stop()

    asyncio.run(scenario())
