"""Suspend to host memory end to end (issue 28): the real ``fgpu serve --fake-driver`` on a
simulated A100-80GB, driven through the command line, with real CUDA processes on the fake
driver (a stand-in for the CUDA driver's checkpoint API).

A low-priority CUDA workload writes a pattern into its device memory and keeps launching
kernels; a critical one needs the whole GPU. The low one is suspended, not evicted: its
device memory is freed in the fake driver's ledger, its processes are stopped, ``fgpu ls``
says ``suspended (N GiB in host memory)``, ``describe`` has the event with the copy time.
The critical one runs and ends; the low one is restored on its GPU (event with the copy
time), goes on with the same process and ends succeeded, which it does only when its memory
still holds the pattern. A suspended workload that is cancelled ends at once and its processes go.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fgpu import states
from fgpu.agent.interposer.preload import default_segment_root
from fgpu.native import ensure_built, fake_driver_dir, lib_dir
from tests.integration.test_metrics import scrape, value
from tests.serverproc import ServerProcess, sleeper, wait_for

WORKER = Path(__file__).parents[1] / "native" / "ckpt_worker.py"
PROBE = Path(__file__).parents[1] / "native" / "fakecuda_probe.py"
GRACE = ("--grace", "1")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    ensure_built()
    srv = ServerProcess(
        tmp_path, "1xA100-80GB", extra=["--fake-driver", "--suspend-host-memory", "8GiB"]
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


def worker(mib: int, *args: str) -> list[str]:
    return [sys.executable, str(WORKER), str(mib), "--step-ms", "20", *args]


def fake_env(server: ServerProcess) -> dict[str, str]:
    """The environment of a process outside fgpu on the service's fake GPUs."""
    state = next(default_segment_root(server.state_dir).glob("fake-gpus-*.state"))
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FGPU_", "LD_PRELOAD"))},
        "LD_LIBRARY_PATH": str(fake_driver_dir()),
        "FGPU_FAKE_GPU_STATE": str(state),
    }


def fake_used(server: ServerProcess, uuid: str | None = None) -> dict[int, int]:
    """Device memory per pid on GPU ``uuid`` (default: the first) in the fake driver's
    ledger (its NVML), bytes."""
    uuid = uuid or server.json("nodes")[0]["gpus"][0]["uuid"]
    out = subprocess.run(
        [sys.executable, str(PROBE), "nvml-procs", uuid],
        env=fake_env(server),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    procs = json.loads(out.stdout.strip().splitlines()[-1])["procs"]
    return {int(pid): int(used) for pid, used in procs}


def stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "tT"


def kinds(detail: dict[str, Any]) -> list[str]:
    return [e["kind"] for e in detail["events"]]


def test_low_work_is_suspended_for_critical_work_and_restored_with_its_memory(
    server: ServerProcess,
) -> None:
    release = server.root / "release-low"
    low = server.submit(
        "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
        command=worker(256, "--until", str(release)),
    )  # fmt: skip
    server.wait_phase(low, "running")
    pid = server.handle(low)["pgid"]  # the worker leads its process group
    wait_for(lambda: fake_used(server).get(pid) == 256 << 20, "the low workload's memory")

    crit = server.submit(
        "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
        command=worker(512, "--steps", "5"),
    )  # fmt: skip

    listing = server.wait_listing(
        lambda ls: ls[low]["suspended_host_mib"] is not None, "the low workload suspended"
    )
    assert listing[low]["phase"] == "pending"
    assert listing[low]["restarts"] == 0
    detail = server.describe(low)
    assert "suspended" in kinds(detail)
    assert "preempted" not in kinds(detail)
    (event,) = [e for e in detail["events"] if e["kind"] == "suspended"]
    assert "device-to-host copy" in event["message"]
    assert stopped(pid)  # frozen, and its device memory is free in the driver's ledger
    assert fake_used(server).get(pid, 0) == 0
    wide = {"COLUMNS": "300"}
    # the state's word and its detail, as every view says it (fgpu.states)
    words = states.state_text("suspended", suspended_host_mib=listing[low]["suspended_host_mib"])
    assert listing[low]["state_text"] == words
    assert words in server.cli("ls", env_extra=wide).stdout

    server.wait_phase(crit, "succeeded")
    server.wait_phase(low, "running")
    wait_for(lambda: "restored" in kinds(server.describe(low)), "the restore's event")
    restored = [e for e in server.describe(low)["events"] if e["kind"] == "restored"]
    assert any("host-to-device copy" in e["message"] for e in restored)
    assert server.handle(low)["pgid"] == pid  # the same process goes on
    wait_for(lambda: not stopped(pid), "the low workload thawed")
    assert fake_used(server).get(pid) == 256 << 20

    release.touch()
    server.wait_phase(low, "succeeded")  # exit 0: its device memory held the pattern
    assert server.describe(low)["restarts"] == 0
    samples, _ = scrape(server)  # copy time counted as lost; nothing evicted
    lost = "fgpu_gpu_seconds_lost_total"
    for reason in ("suspend", "restore"):
        assert (value(samples, lost, queue="default", reason=reason) or 0) > 0, reason
    assert value(samples, lost, queue="default", reason="preempt") is None


def test_a_suspended_workload_cancelled_ends_and_its_processes_go(
    server: ServerProcess,
) -> None:
    release = server.root / "never"
    low = server.submit(
        "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
        command=worker(64, "--until", str(release)),
    )  # fmt: skip
    server.wait_phase(low, "running")
    pid = server.handle(low)["pgid"]
    crit_end = server.root / "crit-end"
    crit = server.submit(
        "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
        command=worker(64, "--until", str(crit_end)),
    )  # fmt: skip
    server.wait_listing(lambda ls: ls[low]["suspended_host_mib"] is not None, "suspended")
    server.cli("cancel", low)
    server.wait_phase(low, "cancelled")
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or zombie(pid), "its process gone")
    crit_end.touch()
    server.wait_phase(crit, "succeeded")


def zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_a_suspended_workload_survives_a_restart_of_the_service(server: ServerProcess) -> None:
    release = server.root / "release-low"
    low = server.submit(
        "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
        command=worker(128, "--until", str(release)),
    )  # fmt: skip
    server.wait_phase(low, "running")
    pid = server.handle(low)["pgid"]
    crit_end = server.root / "crit-end"
    crit = server.submit(
        "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
        command=worker(64, "--until", str(crit_end)),
    )  # fmt: skip
    server.wait_listing(lambda ls: ls[low]["suspended_host_mib"] is not None, "suspended")
    assert server.stop() == 0
    server.start()
    listing = server.workloads()
    assert listing[low]["phase"] == "pending"
    assert listing[low]["suspended_host_mib"] is not None
    assert "readopted" in kinds(server.describe(low))
    assert stopped(pid)
    assert fake_used(server).get(pid, 0) == 0
    crit_end.touch()
    server.wait_phase(crit, "succeeded")
    server.wait_phase(low, "running")
    assert server.handle(low)["pgid"] == pid
    release.touch()
    server.wait_phase(low, "succeeded")
    assert server.describe(low)["restarts"] == 0


def test_a_victim_without_cuda_is_evicted_with_an_event_saying_why(
    server: ServerProcess,
) -> None:
    end = server.root / "end"
    plain = [sys.executable, "-c", "import os, sys, time\nwhile True: time.sleep(0.05)"]
    low = server.submit(
        "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
        command=plain,
    )  # fmt: skip
    server.wait_phase(low, "running")
    crit = server.submit(
        "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
        command=worker(64, "--until", str(end)),
    )  # fmt: skip
    server.wait_phase(crit, "running")
    detail = server.describe(low)
    assert "suspend-failed" in kinds(detail)
    (failed,) = [e for e in detail["events"] if e["kind"] == "suspend-failed"]
    assert "is a CUDA process" in failed["message"]
    assert "preempted" in kinds(detail)
    assert detail["restarts"] == 1
    samples, _ = scrape(server)  # its run since it started is lost: 0.5 GPU x seconds
    lost = value(samples, "fgpu_gpu_seconds_lost_total", queue="default", reason="preempt")
    assert lost is not None
    assert lost > 0
    end.touch()
    server.wait_phase(crit, "succeeded")


def test_a_restart_during_a_restore_finishes_it(server: ServerProcess) -> None:
    """The service died between recording a restore and carrying it out: the workload is
    running in the store while its process is still checkpointed and stopped. The restarted
    service restores it (made here by checkpointing and stopping it from outside)."""
    from tests.native.test_fakecuda_checkpoint import CONTROL, Proc

    release = server.root / "release-low"
    low = server.submit(
        "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
        command=worker(64, "--until", str(release)),
    )  # fmt: skip
    server.wait_phase(low, "running")
    pid = server.handle(low)["pgid"]
    wait_for(lambda: fake_used(server).get(pid) == 64 << 20, "the low workload's memory")
    assert server.stop() == 0
    ctl = Proc([str(CONTROL)], fake_env(server))
    try:
        assert ctl.read()["ready"]
        assert ctl.ask(f"lock {pid}")["ok"]
        assert ctl.ask(f"checkpoint {pid}")["ok"]
        os.killpg(pid, signal.SIGSTOP)
        wait_for(lambda: stopped(pid), "the low workload stopped")
        server.start()
        wait_for(lambda: ctl.ask(f"state {pid}")["state"] == "running", "the restore finished")
    finally:
        ctl.close()
    wait_for(lambda: not stopped(pid), "the low workload thawed")
    assert fake_used(server).get(pid) == 64 << 20
    release.touch()
    server.wait_phase(low, "succeeded")  # its memory came back intact


def test_a_restore_without_room_waits_suspended_and_is_tried_again(
    server: ServerProcess,
) -> None:
    """Memory taken outside fgpu (the core cannot see it) leaves no room when the critical
    workload ends: the restore fails with the driver's out-of-memory error, the workload is
    suspended again (event), and restored once the memory is free."""
    release = server.root / "release-low"
    low = server.submit(
        "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
        command=worker(256, "--until", str(release)),
    )  # fmt: skip
    server.wait_phase(low, "running")
    pid = server.handle(low)["pgid"]
    crit_end = server.root / "crit-end"
    crit = server.submit(
        "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
        command=worker(64, "--until", str(crit_end)),
    )  # fmt: skip
    server.wait_listing(lambda ls: ls[low]["suspended_host_mib"] is not None, "suspended")
    server.wait_phase(crit, "running")
    crit_pid = server.handle(crit)["pgid"]
    wait_for(lambda: fake_used(server).get(crit_pid) == 64 << 20, "the critical one's memory")
    total_mib = server.json("nodes")[0]["gpus"][0]["memory_mib"]
    outsider = subprocess.Popen(
        [str(lib_dir() / "bin" / "fgpu-cudemo"), "hold", str((total_mib - 128) << 20)],
        env=fake_env(server),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert outsider.stdout is not None
        held = json.loads(outsider.stdout.readline())
        assert held["result"] == 0, held
        crit_end.touch()
        server.wait_phase(crit, "succeeded")

        def failed_restore() -> bool:
            return any(
                e["kind"] == "suspended" and "lacks room" in e["message"]
                for e in server.describe(low)["events"]
            )

        wait_for(failed_restore, "a restore that found no room")
        # Each retry thaws it for the driver's restore thread, so it is seen stopped and off
        # the GPU between tries rather than at one instant.
        wait_for(
            lambda: stopped(pid) and fake_used(server).get(pid, 0) == 0,
            "the low workload frozen again with its memory off the GPU",
        )
    finally:
        assert outsider.stdin is not None
        outsider.stdin.close()  # it frees its memory and ends
        outsider.wait(timeout=60)
        if outsider.stdout is not None:
            outsider.stdout.close()
    server.wait_phase(low, "running")
    wait_for(lambda: fake_used(server).get(pid) == 256 << 20, "the low workload's memory back")
    release.touch()
    server.wait_phase(low, "succeeded")
    assert server.describe(low)["restarts"] == 0


def test_a_suspended_workload_is_restored_onto_another_free_gpu_of_its_model(
    tmp_path: Path,
) -> None:
    """Two GPUs: low is suspended from GPU X for critical work that stays on X; when the
    other GPU frees, low is restored onto it (the fake driver, like CUDA 13's, takes GPU
    pairs): same process, its memory contents intact, the ledger shows it on the other
    GPU, and the events say the move."""
    ensure_built()
    srv = ServerProcess(
        tmp_path, "2xA100-80GB", extra=["--fake-driver", "--suspend-host-memory", "8GiB"]
    )
    srv.start()
    try:
        release = srv.root / "release-low"
        low = srv.submit(
            "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
            command=worker(128, "--until", str(release)),
        )  # fmt: skip
        (own,) = srv.wait_phase(low, "running")["gpus"]
        pid = srv.handle(low)["pgid"]
        wait_for(lambda: fake_used(srv, own["uuid"]).get(pid) == 128 << 20, "low's memory")
        steady = srv.submit("-p", "critical", "-g", "1", "--name", "steady", command=sleeper(600))
        (other,) = srv.wait_phase(steady, "running")["gpus"]
        assert other["uuid"] != own["uuid"]
        crit_end = srv.root / "crit-end"
        crit = srv.submit(
            "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
            command=worker(64, "--until", str(crit_end)),
        )  # fmt: skip
        srv.wait_listing(lambda ls: ls[low]["suspended_host_mib"] is not None, "suspended")
        assert [g["uuid"] for g in srv.wait_phase(crit, "running")["gpus"]] == [own["uuid"]]
        assert fake_used(srv, own["uuid"]).get(pid, 0) == 0

        srv.cli("cancel", steady)  # the other GPU frees while crit keeps low's own GPU
        srv.wait_phase(steady, "cancelled")
        back = srv.wait_phase(low, "running")
        assert [g["uuid"] for g in back["gpus"]] == [other["uuid"]]
        wait_for(lambda: "restored" in kinds(srv.describe(low)), "the restore's event")
        detail = srv.describe(low)
        (restored,) = [e for e in detail["events"] if e["kind"] == "restored"]
        assert f"onto GPUs {other['uuid']} (was {own['uuid']})" in restored["message"]
        restoring = [e for e in detail["events"] if e["kind"] == "restoring"]
        assert any(
            f"{own['uuid']} -> {other['uuid']}" in (e["reason"] or "") + (e["message"] or "")
            for e in restoring
        ), restoring
        assert "preempted" not in kinds(detail)
        assert srv.handle(low)["pgid"] == pid  # the same process goes on
        wait_for(lambda: not stopped(pid), "the low workload thawed")
        # the fake driver's ledger (NVML per process): its memory is on the other GPU now
        assert fake_used(srv, other["uuid"]).get(pid) == 128 << 20
        assert fake_used(srv, own["uuid"]).get(pid, 0) == 0

        # the interposer's segment names the new GPU, and counts the memory there
        def segment_lines() -> list[str]:
            lines = srv.describe(low).get("enforcement") or []
            return [ln.strip() for ln in lines if ln.strip().startswith("GPU-")]

        wait_for(lambda: segment_lines(), "the interposer's lines in describe")
        (line,) = segment_lines()
        assert line.startswith(f"{other['uuid']}: 128 of 2048 MiB reserved"), line
        release.touch()
        srv.wait_phase(low, "succeeded")  # exit 0: its device memory held the pattern
        assert srv.describe(low)["restarts"] == 0
        crit_end.touch()
        srv.wait_phase(crit, "succeeded")
    finally:
        srv.cleanup()


def test_a_driver_that_refuses_to_move_a_restore_gets_it_back_on_its_own_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same two GPUs, on a driver that refuses restores onto other GPUs (the fake's knob
    for what r580 drivers are reported to do when the process sees only some GPUs): the
    refused move is not an eviction; the workload stays suspended, says why, and is
    restored onto the GPU it was suspended from once that frees, its memory intact."""
    ensure_built()
    srv = ServerProcess(
        tmp_path, "2xA100-80GB", extra=["--fake-driver", "--suspend-host-memory", "8GiB"]
    )
    monkeypatch.setenv("FGPU_FAKE_REMAP_REFUSED", "1")  # the server's environment
    srv.start()
    try:
        release = srv.root / "release-low"
        low = srv.submit(
            "-p", "low", "-g", "0.5", "--gpu-memory", "2GiB", "--name", "low", *GRACE,
            command=worker(128, "--until", str(release)),
        )  # fmt: skip
        (own,) = srv.wait_phase(low, "running")["gpus"]
        pid = srv.handle(low)["pgid"]
        wait_for(lambda: fake_used(srv, own["uuid"]).get(pid) == 128 << 20, "low's memory")
        steady = srv.submit("-p", "critical", "-g", "1", "--name", "steady", command=sleeper(600))
        srv.wait_phase(steady, "running")
        crit_end = srv.root / "crit-end"
        crit = srv.submit(
            "-p", "critical", "-g", "1", "--name", "crit", *GRACE,
            command=worker(64, "--until", str(crit_end)),
        )  # fmt: skip
        srv.wait_listing(lambda ls: ls[low]["suspended_host_mib"] is not None, "suspended")
        srv.wait_phase(crit, "running")

        srv.cli("cancel", steady)  # the other GPU frees: the move is tried, and refused
        srv.wait_phase(steady, "cancelled")

        def refused() -> bool:
            return any(
                "refused to restore it onto other GPUs" in (e["message"] or "")
                for e in srv.describe(low)["events"]
            )

        wait_for(refused, "the refused move's event")
        assert "preempted" not in kinds(srv.describe(low))
        wait_for(
            lambda: stopped(pid) and fake_used(srv, own["uuid"]).get(pid, 0) == 0,
            "low frozen again with its memory off the GPU",
        )
        crit_end.touch()  # its own GPU frees: restored there
        srv.wait_phase(crit, "succeeded")
        back = srv.wait_phase(low, "running")
        assert [g["uuid"] for g in back["gpus"]] == [own["uuid"]]
        wait_for(lambda: fake_used(srv, own["uuid"]).get(pid) == 128 << 20, "memory back")
        assert srv.handle(low)["pgid"] == pid
        release.touch()
        srv.wait_phase(low, "succeeded")  # exit 0: its device memory held the pattern
        assert srv.describe(low)["restarts"] == 0
    finally:
        srv.cleanup()
