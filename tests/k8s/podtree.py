"""An imitation of the kubelet's pod cgroups for the node agent's tests, and what those tests
share: a GPU backend whose NVML activity the test sets, pods' assignments, waiting.

:class:`Kubelet` makes pod cgroups (one container cgroup each) in a directory of its own
under the cgroup v2 mount (root only; the ``kubelet`` fixture in ``conftest.py`` makes it and
removes it afterwards), and moves a real process into each container cgroup, as the kubelet
and the container runtime do."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fgpu.agent.backend import GpuDevice, GpuProcess, ProcessUtilization
from fgpu.k8s import wire
from fgpu.k8s.agent import PlacedContainer

TIMEOUT_S = 60.0  # a guard against hanging: generous, a loaded machine starts processes slowly
GPU = "GPU-00000000-test-0000-000000000000"
SLEEP = "import time; time.sleep(600)"


def wait_for(check: Callable[[], bool], what: str, limit_s: float = TIMEOUT_S) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` (a guard against hanging)."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@dataclass
class Backend:
    """A GPU backend whose per-process figures the test sets: pids in ``busy`` keep the
    GPU's SMs busy (the governor's NVML activity source), ``memory`` is what each pid holds
    on the GPU. ``reads`` counts the utilization reads."""

    busy: set[int] = field(default_factory=set)
    reads: int = 0
    memory: dict[int, int] = field(default_factory=dict)  # pid -> MiB it holds on the GPU

    @property
    def kind(self) -> str:
        return "test"

    def gpus(self) -> list[GpuDevice]:
        return [GpuDevice(0, GPU, "A100-40GB", 40960, sm_count=None, mig_enabled=False)]

    def process_memory(self) -> list[GpuProcess]:
        return [GpuProcess(pid, GPU, mib) for pid, mib in sorted(self.memory.items())]

    def utilization(self) -> dict[str, int]:
        return {}

    def process_utilization(self) -> list[ProcessUtilization]:
        self.reads += 1
        return [ProcessUtilization(pid, GPU, 90) for pid in sorted(self.busy)]

    def close(self) -> None:
        pass


HINTER = """
import sys
import fgpu.sdk
for line in sys.stdin:
    kind = line.strip()
    sent = fgpu.sdk.mark_busy() if kind == "busy" else fgpu.sdk.mark_idle()
    print(sent, flush=True)
"""


class Hinter:
    """A real process that sends :mod:`fgpu.sdk` hints when told to (one per line on its
    stdin), with ``FGPU_AGENT_SOCKET`` and ``FGPU_WORKLOAD_ID`` set as in a pod."""

    def __init__(self, socket: Path, workload_id: str) -> None:
        env = {
            **_python_env(),
            "FGPU_AGENT_SOCKET": str(socket),
            "FGPU_WORKLOAD_ID": workload_id,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HINTER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, kind: str) -> None:
        """Have the process call ``mark_busy``/``mark_idle``; returns once it did, and fails
        unless the kernel took the datagram."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "True", f"fgpu.sdk did not send {kind!r} (answered {answer!r})"

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _python_env() -> Mapping[str, str]:
    """This process's environment without any ``FGPU_`` variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}


class Kubelet:
    """Pod cgroups (one container cgroup each, holding a real process) in a test tree."""

    def __init__(self, root: Path, layout: str) -> None:
        self.root = root
        self.layout = layout
        self.procs: list[subprocess.Popen[bytes]] = []
        self.hinters: list[Hinter] = []

    def group(self, uid: str, qos: str = "burstable") -> Path:
        """Where the kubelet puts pod ``uid`` of ``qos`` in this tree's layout."""
        if self.layout == "systemd":
            u = uid.replace("-", "_")
            group = self.root / "kubepods.slice" / f"kubepods-{qos}.slice"
            return group / f"kubepods-{qos}-pod{u}.slice"
        return self.root / "kubepods" / qos / f"pod{uid}"

    def start(self, uid: str, qos: str = "burstable", pid: int | None = None) -> Path:
        """Make pod ``uid``'s cgroup and one container cgroup, and move ``pid`` (default: a
        new sleeping process) into it. Returns the pod cgroup."""
        group = self.group(uid, qos)
        container = group / "cri-containerd-0123.scope"
        container.mkdir(parents=True)
        if pid is None:
            proc = subprocess.Popen([sys.executable, "-c", SLEEP])
            self.procs.append(proc)
            pid = proc.pid
        (container / "cgroup.procs").write_text(str(pid))
        return group

    def pod(self, name: str, qos: str = "burstable") -> tuple[PlacedContainer, Path, int]:
        """A pod with a sleeping process: its placement, cgroup and the process's pid."""
        uid = str(uuid.uuid4())
        group = self.start(uid, qos)
        pid = self.procs[-1].pid
        return placed(name, uid), group, pid

    def hinting_pod(
        self,
        name: str,
        socket: Path,
        qos: str = "burstable",
        uid: str | None = None,
        claim: str | None = None,
    ) -> tuple[PlacedContainer, Path, Hinter]:
        """A pod whose process sends hints (:class:`Hinter`) naming ``claim`` (default: its
        own id, ``default/<name>``, as the pod's environment ConfigMap sets it)."""
        uid = uid or str(uuid.uuid4())
        hinter = self.hinter(socket, claim or f"default/{name}")
        group = self.start(uid, qos, pid=hinter.pid)
        return placed(name, uid), group, hinter

    def hinter(self, socket: Path, workload_id: str) -> Hinter:
        """A hint-sending process in no pod (cleaned up with the tree)."""
        hinter = Hinter(socket, workload_id)
        self.hinters.append(hinter)
        return hinter

    def cleanup(self) -> None:
        for group in sorted(self.root.rglob("*"), key=lambda p: -len(p.parts)):
            if group.is_dir():
                with contextlib.suppress(OSError):
                    (group / "cgroup.freeze").write_text("0")
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        for hinter in self.hinters:
            hinter.stop()
        deadline = time.monotonic() + TIMEOUT_S
        while self.root.exists() and time.monotonic() < deadline:
            for group in sorted(self.root.rglob("*"), key=lambda p: -len(p.parts)):
                if group.is_dir():
                    with contextlib.suppress(OSError):
                        group.rmdir()
            with contextlib.suppress(OSError):
                self.root.rmdir()
            time.sleep(0.01)


def placed(
    name: str, uid: str, priority: int = 50, milli: int = 500, gpu: str = GPU
) -> PlacedContainer:
    return PlacedContainer(
        f"default/{name}",
        uid,
        wire.Assignment(
            node="n",
            uuids=(gpu,),
            gpus=(0,),
            gpu_milli=(milli,),
            gpu_memory_mib=(1024,),
            cpu_milli=0,
            memory_mib=0,
            priority=priority,
        ),
    )


def with_priority(p: PlacedContainer, priority: int, milli: int | None = None) -> PlacedContainer:
    a = p.assignment
    return PlacedContainer(
        p.workload_id,
        p.uid,
        wire.Assignment(
            node=a.node,
            uuids=a.uuids,
            gpus=a.gpus,
            gpu_milli=a.gpu_milli if milli is None else (milli,),
            gpu_memory_mib=a.gpu_memory_mib,
            cpu_milli=a.cpu_milli,
            memory_mib=a.memory_mib,
            priority=priority,
        ),
    )


def frozen(group: Path) -> bool:
    """``frozen 1`` in the cgroup's ``cgroup.events`` (the kernel's word)."""
    return "frozen 1" in (group / "cgroup.events").read_text().split("\n")


def freeze_file(group: Path) -> str:
    return (group / "cgroup.freeze").read_text().strip()
