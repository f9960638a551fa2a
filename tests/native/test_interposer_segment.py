"""libfgpu-agent.so: creating, reading and sweeping a workload's segment (no driver needed).

The sweep is the code the interposers run too (seg.c is compiled into both libraries), so
these tests pin the reclaim rules: a dead process's entry (or one whose pid now belongs to a
new process) is given back exactly once, a live one never.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest
from tests.native.interposer_support import (
    FLAG_GATING,
    FLAG_MEMORY_CAP,
    GATE_CLOSED,
    GATE_OPEN,
    MIB,
    AgentLib,
    Snapshot,
)

from fgpu import native as fgpu_native

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

OFFSETS_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "fgpu_seg.h"
int main(void) {
    printf("{\"size\": %zu, \"magic\": %zu, \"version\": %zu, \"gpus\": %zu, \"gpu_size\": %zu,"
           " \"memory_reserved\": %zu, \"procs\": %zu, \"proc_size\": %zu, \"pid\": %zu,"
           " \"start_ticks\": %zu, \"pidns_dev\": %zu, \"pidns_ino\": %zu, \"reserved\": %zu,"
           " \"inflight\": %zu}\n",
           sizeof(struct fgpu_seg), offsetof(struct fgpu_seg, magic),
           offsetof(struct fgpu_seg, version), offsetof(struct fgpu_seg, gpus),
           sizeof(struct fgpu_seg_gpu), offsetof(struct fgpu_seg_gpu, memory_reserved),
           offsetof(struct fgpu_seg, procs), sizeof(struct fgpu_seg_proc),
           offsetof(struct fgpu_seg_proc, pid), offsetof(struct fgpu_seg_proc, start_ticks),
           offsetof(struct fgpu_seg_proc, pidns_dev), offsetof(struct fgpu_seg_proc, pidns_ino),
           offsetof(struct fgpu_seg_proc, reserved), offsetof(struct fgpu_seg_proc, inflight));
    return 0;
}
"""


@pytest.fixture(scope="module")
def agent_native() -> Path:
    return fgpu_native.ensure_built()


@pytest.fixture(scope="module")
def offsets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Field offsets of fgpu_seg.h as the C compiler lays them out."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("offsets")
    (d / "off.c").write_text(OFFSETS_C)
    include = Path(__file__).resolve().parents[2] / "native" / "include"
    subprocess.run([cc, f"-I{include}", "-o", str(d / "off"), str(d / "off.c")], check=True)
    out: dict[str, int] = json.loads(subprocess.check_output([str(d / "off")]))
    return out


@pytest.fixture
def agent(agent_native: Path):
    lib = AgentLib(agent_native)
    yield lib
    lib.close()


def start_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


def own_pidns() -> tuple[int, int]:
    """(st_dev, st_ino) of this process's pid namespace, as the interposer records it."""
    st = os.stat("/proc/self/ns/pid")
    return st.st_dev, st.st_ino


class Raw:
    """Direct reads and writes of a segment file at the compiler's offsets."""

    def __init__(self, path: Path, off: dict[str, int]) -> None:
        self.f = open(path, "r+b")  # noqa: SIM115 - closed by close()
        self.m = mmap.mmap(self.f.fileno(), off["size"])
        self.off = off

    def close(self) -> None:
        self.m.close()
        self.f.close()

    def _proc(self, i: int) -> int:
        return self.off["procs"] + i * self.off["proc_size"]

    def put_proc(
        self, i: int, pid: int, ticks: int, reserved0: int, pidns: tuple[int, int] | None = None
    ) -> None:
        """Fill entry i as a claimer does (pid last); ``pidns`` defaults to ours."""
        base = self._proc(i)
        dev, ino = own_pidns() if pidns is None else pidns
        struct.pack_into("<Q", self.m, base + self.off["start_ticks"], ticks)
        struct.pack_into("<Q", self.m, base + self.off["pidns_dev"], dev)
        struct.pack_into("<Q", self.m, base + self.off["pidns_ino"], ino)
        struct.pack_into("<Q", self.m, base + self.off["reserved"], reserved0)
        struct.pack_into("<i", self.m, base + self.off["pid"], pid)

    def proc_pid(self, i: int) -> int:
        return int(struct.unpack_from("<i", self.m, self._proc(i) + self.off["pid"])[0])

    def set_gpu_reserved(self, g: int, value: int) -> None:
        at = self.off["gpus"] + g * self.off["gpu_size"] + self.off["memory_reserved"]
        struct.pack_into("<Q", self.m, at, value)

    def poke_u32(self, field: str, value: int) -> None:
        struct.pack_into("<I", self.m, self.off[field], value)


def test_create_writes_the_header_and_the_caps(agent: AgentLib, tmp_path: Path) -> None:
    seg = tmp_path / "seg"
    agent.create(seg, [UUID0, UUID1], [512 * MIB, 0], max_inflight=3, workload_id="w-42")
    assert stat.S_IMODE(seg.stat().st_mode) == 0o600
    assert seg.stat().st_size == agent.lib.fgpu_agent_segment_size()
    assert ctypes.sizeof(Snapshot) == agent.lib.fgpu_agent_snapshot_size()
    snap = agent.snapshot()
    assert (snap.ngpus, snap.flags, snap.gate, snap.max_inflight) == (
        2,
        FLAG_MEMORY_CAP | FLAG_GATING,
        GATE_OPEN,
        3,
    )
    assert snap.gpus[0].uuid.decode() == UUID0
    assert snap.gpus[1].uuid.decode() == UUID1
    assert [snap.gpus[0].memory_limit, snap.gpus[1].memory_limit] == [512 * MIB, 0]
    assert (snap.live_processes, snap.inflight, snap.waiting, snap.launches) == (0, 0, 0, 0)
    assert not list(tmp_path.glob("seg.tmp.*")), "the temporary file was renamed into place"


@pytest.mark.parametrize(
    ("uuids", "want"),
    [
        pytest.param([UUID0] * 17, errno.EINVAL, id="17-gpus"),
        pytest.param(["GPU-" + "x" * 100], errno.ENAMETOOLONG, id="uuid-too-long"),
        pytest.param([""], errno.EINVAL, id="empty-uuid"),
    ],
)
def test_create_refuses_bad_input(
    agent: AgentLib, tmp_path: Path, uuids: list[str], want: int
) -> None:
    with pytest.raises(OSError, match=os.strerror(want)):
        agent.create(tmp_path / "seg", uuids, [0] * len(uuids))
    assert not (tmp_path / "seg").exists()


def test_create_refuses_a_long_workload_id(agent: AgentLib, tmp_path: Path) -> None:
    with pytest.raises(OSError, match=os.strerror(errno.ENAMETOOLONG)):
        agent.create(tmp_path / "seg", [UUID0], [0], workload_id="w" * 64)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        pytest.param("magic", 0x12345678, "magic 0x12345678 is not 0x55504746", id="magic"),
        pytest.param("version", 99, "version 99, this library reads version", id="version"),
    ],
)
def test_open_says_why_a_segment_is_refused(
    agent: AgentLib, tmp_path: Path, offsets: dict[str, int], field: str, value: int, reason: str
) -> None:
    seg = tmp_path / "seg"
    agent.create(seg, [UUID0], [0])
    agent.close()
    raw = Raw(seg, offsets)
    raw.poke_u32(field, value)
    raw.close()
    with pytest.raises(OSError, match=reason):
        agent.open(seg)


def test_open_says_why_a_short_or_missing_file_is_refused(agent: AgentLib, tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_bytes(b"\0" * 64)
    with pytest.raises(OSError, match="file size 64 is smaller than the segment"):
        agent.open(short)
    with pytest.raises(OSError, match=r"cannot open .*missing: No such file"):
        agent.open(tmp_path / "missing")


def test_sweep_gives_back_a_dead_process_once_and_keeps_live_ones(
    agent: AgentLib, tmp_path: Path, offsets: dict[str, int]
) -> None:
    seg = tmp_path / "seg"
    agent.create(seg, [UUID0], [1024 * MIB])
    dead = subprocess.Popen(["true"])
    dead_ticks = start_ticks(dead.pid)
    dead.wait()
    me = os.getpid()
    raw = Raw(seg, offsets)
    raw.put_proc(0, dead.pid, dead_ticks, 300 * MIB)
    raw.put_proc(1, me, start_ticks(me), 100 * MIB)
    raw.put_proc(2, me, start_ticks(me) + 1, 50 * MIB)  # our pid, another start: pid reused
    raw.set_gpu_reserved(0, 450 * MIB)
    assert agent.snapshot().live_processes == 3

    assert agent.sweep() == 350 * MIB
    snap = agent.snapshot()
    assert snap.gpus[0].memory_reserved == 100 * MIB
    assert snap.live_processes == 1
    assert [raw.proc_pid(0), raw.proc_pid(1), raw.proc_pid(2)] == [0, me, 0]
    assert agent.sweep() == 0, "an entry is given back exactly once"
    assert agent.snapshot().gpus[0].memory_reserved == 100 * MIB
    raw.close()


def test_gate_inflight_and_limits_are_written(agent: AgentLib, tmp_path: Path) -> None:
    agent.create(tmp_path / "seg", [UUID0, UUID1], [MIB, MIB])
    agent.set_gate(GATE_CLOSED)
    agent.set_max_inflight(7)
    agent.set_memory_limit(1, 5 * MIB)
    snap = agent.snapshot()
    assert (snap.gate, snap.max_inflight, snap.gpus[1].memory_limit) == (GATE_CLOSED, 7, 5 * MIB)
    assert agent.lib.fgpu_agent_set_memory_limit(agent.seg, 2, MIB) == -errno.EINVAL
    assert agent.lib.fgpu_agent_set_gate(agent.seg, 5) == -errno.EINVAL
    agent.set_gate(GATE_OPEN)
    assert agent.snapshot().gate == GATE_OPEN
