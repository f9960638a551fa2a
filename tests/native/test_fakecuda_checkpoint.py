"""The fake driver's checkpoint API (native/fakecuda/checkpoint.c) with real processes: a
workload (ckpt_worker.py) and a controller (ckpt_control.py, fgpu.agent.checkpoint on the
fake) in processes of their own, the fake's ledger read through its NVML."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.native.fakecuda_support import GPU_A, MIB, FakeGpus
from tests.native.test_fakecuda import asan_runtime

HERE = Path(__file__).parent
WORKER = HERE / "ckpt_worker.py"
CONTROL = HERE / "ckpt_control.py"

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_ILLEGAL_STATE = 401


class Proc:
    """A line-oriented JSON child process."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def read(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            assert self.p.stderr is not None
            raise AssertionError(f"{self.p.args} ended: {self.p.wait()} {self.p.stderr.read()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def ask(self, line: str) -> dict[str, Any]:
        self.send(line)
        return self.read()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(args: list[str], env: dict[str, str]) -> Proc:
        p = Proc(args, env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def used_mib(fake: FakeGpus, env: dict[str, str] | None = None) -> int:
    out = fake.probe("nvml-memory", GPU_A, env=env)
    return int(out["used"]) // MIB


def run_cycle(fake: FakeGpus, procs: Callable[..., Proc], env: dict[str, str]) -> None:
    worker = procs([str(WORKER), "300"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    assert ctl.read()["ready"]
    assert used_mib(fake, env) == 300
    assert ctl.ask(f"state {pid}")["state"] == "running"
    tid = ctl.ask(f"tid {pid}")
    assert tid["ok"]
    assert tid["tid"] > 0
    assert Path(f"/proc/{pid}/task/{tid['tid']}").exists()

    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"state {pid}")["state"] == "locked"
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    assert ctl.ask(f"state {pid}")["state"] == "checkpointed"
    assert used_mib(fake, env) == 0  # its device memory is free for others
    assert Path(f"{fake.state}.ckpt.{pid}.{proc_start(pid)}").exists()

    assert ctl.ask(f"restore {pid}")["ok"]
    assert ctl.ask(f"state {pid}")["state"] == "locked"
    assert used_mib(fake, env) == 300
    assert not list(fake.state.parent.glob(f"{fake.state.name}.ckpt.*"))
    assert ctl.ask(f"unlock {pid}")["ok"]
    assert ctl.ask(f"state {pid}")["state"] == "running"
    assert worker.ask("check") == {"intact": True}
    worker.send("exit")
    assert worker.p.wait(timeout=60) == 0


def proc_start(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def test_suspend_and_restore_keep_the_memory_contents_and_free_the_gpu_meanwhile(
    fake_gpus: FakeGpus, procs: Callable[..., Proc]
) -> None:
    run_cycle(fake_gpus, procs, fake_gpus.env(CUDA_VISIBLE_DEVICES=GPU_A))


def test_restore_without_room_fails_out_of_memory_and_can_be_retried(
    make_fake_gpus: Callable[[str], FakeGpus], procs: Callable[..., Proc]
) -> None:
    fake = make_fake_gpus(f"{GPU_A}=A100-80GB:1024")
    env = fake.env()
    worker = procs([str(WORKER), "600"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    ctl.read()
    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    other = procs([str(WORKER), "600"], env)  # takes the room the suspended one left
    other.read()
    assert used_mib(fake) == 600
    failed = ctl.ask(f"restore {pid}")
    assert failed["ok"] is False
    assert failed["code"] == CUDA_ERROR_OUT_OF_MEMORY
    assert ctl.ask(f"state {pid}")["state"] == "checkpointed"
    assert used_mib(fake) == 600  # nothing half-taken
    other.send("exit")
    assert other.p.wait(timeout=60) == 0
    assert ctl.ask(f"restore {pid}")["ok"]
    assert ctl.ask(f"unlock {pid}")["ok"]
    assert worker.ask("check") == {"intact": True}


def test_launches_of_a_locked_process_wait_for_the_unlock(
    fake_gpus: FakeGpus, procs: Callable[..., Proc]
) -> None:
    env = fake_gpus.env()
    worker = procs([str(WORKER), "8"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    ctl.read()
    assert ctl.ask(f"lock {pid}")["ok"]
    worker.send("launch 1000")
    # the launch cannot return while locked; the state still says locked after it was sent
    assert ctl.ask(f"state {pid}")["state"] == "locked"
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    restored = ctl.ask(f"restore {pid}")
    assert restored["ok"]
    assert ctl.ask(f"unlock {pid}")["ok"]
    # the launch sent before the checkpoint returned only after the restore (both
    # CLOCK_MONOTONIC): it waited while the process was locked and checkpointed
    assert worker.read()["launched"] > restored["t"]
    assert worker.ask("check") == {"intact": True}


def test_invalid_transitions_and_unknown_pids_get_the_drivers_errors(
    fake_gpus: FakeGpus, procs: Callable[..., Proc]
) -> None:
    env = fake_gpus.env()
    worker = procs([str(WORKER), "8"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    ctl.read()
    for op in ("checkpoint", "restore", "unlock"):  # from RUNNING
        assert ctl.ask(f"{op} {pid}")["code"] == CUDA_ERROR_ILLEGAL_STATE, op
    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"lock {pid}")["code"] == CUDA_ERROR_ILLEGAL_STATE
    assert ctl.ask(f"restore {pid}")["code"] == CUDA_ERROR_ILLEGAL_STATE
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    for op in ("lock", "checkpoint", "unlock"):  # from CHECKPOINTED
        assert ctl.ask(f"{op} {pid}")["code"] == CUDA_ERROR_ILLEGAL_STATE, op
    # a process that is not a CUDA process of the fake, and the controller itself
    assert ctl.ask(f"raw cuCheckpointProcessLock {ctl.p.pid}")["code"] == CUDA_ERROR_INVALID_VALUE
    assert ctl.ask("raw cuCheckpointProcessLock 999999999")["code"] == CUDA_ERROR_INVALID_VALUE
    assert ctl.ask(f"state {ctl.p.pid}")["state"] is None


def test_a_checkpointed_process_that_dies_leaves_no_file_and_no_memory(
    fake_gpus: FakeGpus, procs: Callable[..., Proc]
) -> None:
    env = fake_gpus.env()
    worker = procs([str(WORKER), "100"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    ctl.read()
    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    assert list(fake_gpus.state.parent.glob(f"{fake_gpus.state.name}.ckpt.*"))
    worker.p.kill()
    worker.p.wait()
    assert used_mib(fake_gpus) == 0  # the probe's NVML query sweeps the dead process
    assert not list(fake_gpus.state.parent.glob(f"{fake_gpus.state.name}.ckpt.*"))


def test_checkpoint_is_clean_under_asan_and_ubsan(
    sanitized_dir: Path, make_fake_gpus: Callable[[str], FakeGpus], procs: Callable[..., Proc]
) -> None:
    fake = make_fake_gpus(f"{GPU_A}=A100-80GB:1024")
    fake.native = sanitized_dir
    env = fake.env(
        LD_PRELOAD=asan_runtime(),
        ASAN_OPTIONS="halt_on_error=1:detect_leaks=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    run_cycle(fake, procs, env)


# ---------------------------------------------------------------- restore onto other GPUs

GPU_B2 = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
GPU_H = "GPU-cccccccc-0000-0000-0000-000000000003"
GPU_UNKNOWN = "GPU-dddddddd-0000-0000-0000-000000000004"
THREE_GPUS = f"{GPU_A}=A100-80GB:1024,{GPU_B2}=A100-80GB:1024,{GPU_H}=H100-80GB:2048"


def gpu_mib(fake: FakeGpus, uuid: str, env: dict[str, str] | None = None) -> int:
    return int(fake.probe("nvml-memory", uuid, env=env)["used"]) // MIB


def gpu_procs(fake: FakeGpus, uuid: str, env: dict[str, str] | None = None) -> dict[int, int]:
    """pid -> MiB of the processes NVML lists on ``uuid``."""
    return {pid: used // MIB for pid, used in fake.probe("nvml-procs", uuid, env=env)["procs"]}


def run_remap(fake: FakeGpus, procs: Callable[..., Proc], env: dict[str, str]) -> None:
    """A 300 MiB worker on GPU_A checkpointed, restored onto GPU_B2 (same model)."""
    worker = procs([str(WORKER), "300"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    assert ctl.read()["ready"]
    assert ctl.ask("remap 0") == {"ok": True, "can_remap": True, "version": 13000, "t": ANY}
    assert worker.ask("uuid")["uuid"] == GPU_A[4:].replace("-", "")
    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    assert gpu_mib(fake, GPU_A, env) == 0
    assert ctl.ask(f"restore {pid} {GPU_A}>{GPU_B2}")["ok"]
    assert ctl.ask(f"state {pid}")["state"] == "locked"
    # the ledger: the memory is on GPU_B2 now, GPU_A is free, NVML lists it on GPU_B2
    assert gpu_mib(fake, GPU_A, env) == 0
    assert gpu_mib(fake, GPU_B2, env) == 300
    assert pid not in gpu_procs(fake, GPU_A, env)
    assert gpu_procs(fake, GPU_B2, env)[pid] == 300
    assert ctl.ask(f"unlock {pid}")["ok"]
    assert worker.ask("check") == {"intact": True}
    # its ordinal 0 stands for GPU_B2: cuDeviceGetUuid and cuMemGetInfo say so
    assert worker.ask("uuid") == {"uuid": GPU_B2[4:].replace("-", ""), "device": 0}
    info = worker.ask("meminfo")
    assert info["total"] == 1024 * MIB
    assert info["free"] == (1024 - 300) * MIB
    assert worker.ask("launch 1000")["launched"] > 0  # it runs on the new GPU
    # a second suspend and a restore back where it came from
    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    assert gpu_mib(fake, GPU_B2, env) == 0
    assert ctl.ask(f"restore {pid} {GPU_B2}>{GPU_A}")["ok"]
    assert ctl.ask(f"unlock {pid}")["ok"]
    assert gpu_procs(fake, GPU_A, env)[pid] == 300
    assert gpu_mib(fake, GPU_B2, env) == 0
    assert worker.ask("uuid")["uuid"] == GPU_A[4:].replace("-", "")
    assert worker.ask("check") == {"intact": True}
    worker.send("exit")
    assert worker.p.wait(timeout=60) == 0
    assert gpu_mib(fake, GPU_A, env) == 0


class _Any:
    def __eq__(self, other: object) -> bool:
        return True


ANY = _Any()


def test_restore_with_gpu_pairs_moves_the_memory_to_the_other_gpu(
    make_fake_gpus: Callable[[str], FakeGpus], procs: Callable[..., Proc]
) -> None:
    fake = make_fake_gpus(THREE_GPUS)
    run_remap(fake, procs, fake.env())


def test_restore_with_bad_gpu_pairs_is_refused_and_leaves_the_process_checkpointed(
    make_fake_gpus: Callable[[str], FakeGpus], procs: Callable[..., Proc]
) -> None:
    fake = make_fake_gpus(THREE_GPUS)
    env = fake.env()
    worker = procs([str(WORKER), "300"], env)
    pid = worker.read()["pid"]
    ctl = procs([str(CONTROL)], env)
    ctl.read()
    assert ctl.ask(f"lock {pid}")["ok"]
    assert ctl.ask(f"checkpoint {pid}")["ok"]
    refused = {
        "another model": f"{GPU_A}>{GPU_H}",
        "an unknown new uuid": f"{GPU_A}>{GPU_UNKNOWN}",
        "an unknown old uuid": f"{GPU_UNKNOWN}>{GPU_B2}",
        "a new GPU named twice": f"{GPU_A}>{GPU_B2} {GPU_H}>{GPU_B2}",
        "the checkpointed GPU left out": f"{GPU_B2}>{GPU_A}",
    }
    for why, pairs in refused.items():
        assert ctl.ask(f"restore {pid} {pairs}")["code"] == CUDA_ERROR_INVALID_VALUE, why
    assert ctl.ask(f"restore-reserved {pid}")["code"] == CUDA_ERROR_INVALID_VALUE
    # no room on the new GPU: out of memory, nothing taken anywhere
    other = procs([str(WORKER), "800"], fake.env(CUDA_VISIBLE_DEVICES=GPU_B2))
    other.read()
    oom = ctl.ask(f"restore {pid} {GPU_A}>{GPU_B2}")
    assert oom["code"] == CUDA_ERROR_OUT_OF_MEMORY
    assert ctl.ask(f"state {pid}")["state"] == "checkpointed"
    assert gpu_mib(fake, GPU_A) == 0
    assert gpu_mib(fake, GPU_B2) == 800
    other.send("exit")
    assert other.p.wait(timeout=60) == 0
    assert ctl.ask(f"restore {pid} {GPU_A}>{GPU_B2}")["ok"]  # retried once there is room
    assert ctl.ask(f"unlock {pid}")["ok"]
    assert gpu_procs(fake, GPU_B2)[pid] == 300
    assert worker.ask("check") == {"intact": True}


def test_restore_with_gpu_pairs_is_clean_under_asan_and_ubsan(
    sanitized_dir: Path, make_fake_gpus: Callable[[str], FakeGpus], procs: Callable[..., Proc]
) -> None:
    fake = make_fake_gpus(THREE_GPUS)
    fake.native = sanitized_dir
    env = fake.env(
        LD_PRELOAD=asan_runtime(),
        ASAN_OPTIONS="halt_on_error=1:detect_leaks=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    run_remap(fake, procs, env)
