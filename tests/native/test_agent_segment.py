"""The agent's side of the interposer segment: layout, creation, ownership, gate, environment.

The Python mirror of ``native/include/fgpu_seg.h`` must agree with the C compiler field by
field; a segment belongs to the workload's user alone; the environment preloads libfgpu first.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fgpu.agent.interposer.preload import (
    FakeGpu,
    SegmentDir,
    fake_driver_env,
    fake_gpus_spec,
    interposer_disabled,
    preload_env,
)
from fgpu.agent.interposer.segment import Segment, SegmentError, Snapshot, agent_library

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "native" / "include" / "fgpu_seg.h"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def test_the_snapshot_layout_is_the_native_librarys() -> None:
    lib = agent_library()
    assert lib.fgpu_agent_snapshot_size() == ctypes.sizeof(Snapshot)
    assert lib.fgpu_agent_segment_size() == _c_segment_size()


def _c_segment_size() -> int:
    """sizeof(struct fgpu_seg) as the C compiler lays the header out."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "size.c"
        source.write_text(
            '#include <stdio.h>\n#include "fgpu_seg.h"\n'
            'int main(void){printf("%zu\\n", sizeof(struct fgpu_seg));return 0;}\n'
        )
        program = Path(tmp) / "size"
        subprocess.run(
            [
                "cc",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                f"-I{HEADER.parent}",
                str(source),
                "-o",
                str(program),
            ],
            check=True,
        )
        return int(
            subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
        )


def test_created_segment_reads_back(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path / "w.seg", "w-1", [UUID, "GPU-b"], [4 << 30, 0], max_inflight=2)
    try:
        st = seg.stats()
        assert seg.uuids == (UUID, "GPU-b")
        assert [g.memory_limit for g in st.gpus] == [4 << 30, 0]
        assert (st.gate_closed, st.max_inflight, st.processes, st.live_processes) == (
            False,
            2,
            0,
            0,
        )
        assert oct((tmp_path / "w.seg").stat().st_mode & 0o777) == "0o600"
        assert not list(tmp_path.glob(".*tmp"))  # written under a temporary name, renamed
        seg.set_gate(closed=True)
        assert Segment.open(tmp_path / "w.seg").stats().gate_closed  # another mapping sees it
        seg.set_max_inflight(0)
        assert seg.stats().max_inflight == 0
    finally:
        seg.remove()
    assert not (tmp_path / "w.seg").exists()


def test_set_uuids_renames_the_gpus_for_every_mapping_and_refuses_bad_names(
    tmp_path: Path,
) -> None:
    seg = Segment.create(tmp_path / "w.seg", "w-1", [UUID, "GPU-b"], [4 << 30, 0], max_inflight=2)
    try:
        seg.set_uuids(["GPU-c", "GPU-d"])  # a restore onto other GPUs
        assert seg.uuids == ("GPU-c", "GPU-d")
        again = Segment.open(tmp_path / "w.seg")  # another mapping (the interposer's) sees it
        assert [g.uuid for g in again.stats().gpus] == ["GPU-c", "GPU-d"]
        assert [g.memory_limit for g in again.stats().gpus] == [4 << 30, 0]  # caps kept
        again.close()
        with pytest.raises(ValueError, match="uuids: 1 given for a segment of 2 GPUs"):
            seg.set_uuids(["GPU-e"])
        with pytest.raises(ValueError, match="uuids: 'GGG"):
            seg.set_uuids(["GPU-e", "G" * 96])
        assert seg.uuids == ("GPU-c", "GPU-d")  # nothing half-written
        assert [g.uuid for g in seg.stats().gpus] == ["GPU-c", "GPU-d"]
    finally:
        seg.remove()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uuids": []}, "uuids: 0 GPUs"),
        ({"uuids": [f"GPU-{i}" for i in range(17)], "memory_limits": [0] * 17}, "uuids: 17 GPUs"),
        ({"memory_limits": [1, 2]}, "memory_limits: 2 values for 1 GPUs"),
        ({"workload_id": "x" * 64}, "workload_id: 'xxxx"),
        ({"workload_id": ""}, "workload_id: ''"),
        ({"uuids": ["G" * 96]}, "uuids: 'GGG"),
        ({"memory_limits": [-1]}, "memory_limits: -1 must be 0"),
    ],
    ids=["no-gpu", "17-gpus", "limits-length", "long-id", "empty-id", "long-uuid", "negative"],
)
def test_bad_arguments_name_the_field_and_write_nothing(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"workload_id": "w", "uuids": [UUID], "memory_limits": [0]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Segment.create(tmp_path / "w.seg", **args)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_open_refuses_what_is_not_a_segment(tmp_path: Path) -> None:
    size = agent_library().fgpu_agent_segment_size()
    for name, content in (("empty", b""), ("zeros", b"\0" * size)):
        path = tmp_path / f"{name}.seg"
        path.write_bytes(content)
        with pytest.raises(SegmentError, match=re.escape(str(path))):
            Segment.open(path)
    with pytest.raises(SegmentError, match=r"missing\.seg"):
        Segment.open(tmp_path / "missing.seg")


def test_preload_env_puts_libfgpu_first_and_keeps_the_rest() -> None:
    env = preload_env(Path("/opt/fgpu"), Path("/dev/shm/x/w.seg"), {"LD_PRELOAD": "/a.so:/b.so"})
    assert env == {"LD_PRELOAD": "/opt/fgpu/libfgpu.so /a.so /b.so", "FGPU_SEG": "/dev/shm/x/w.seg"}
    again = preload_env(Path("/opt/fgpu"), Path("/s"), {"LD_PRELOAD": env["LD_PRELOAD"]})
    assert again["LD_PRELOAD"] == env["LD_PRELOAD"]  # never twice


@pytest.mark.parametrize(
    ("value", "off"),
    [
        ("off", True),
        ("OFF", True),
        ("0", True),
        ("no", True),
        ("false", True),
        ("on", False),
        ("", False),
    ],
)
def test_interposer_off_switch(value: str, off: bool) -> None:
    assert interposer_disabled({"FGPU_INTERPOSER": value}) is off


def test_fake_driver_env_describes_the_gpus() -> None:
    gpus = [FakeGpu("GPU-a", "A100-80GB", 81920), FakeGpu("GPU-b", "H100-80GB", 81559)]
    assert fake_gpus_spec(gpus) == "GPU-a=A100-80GB:81920,GPU-b=H100-80GB:81559"
    env = fake_driver_env(Path("/fake"), Path("/s/state"), gpus, {"LD_LIBRARY_PATH": "/x"})
    assert env["LD_LIBRARY_PATH"] == "/fake:/x"
    assert env["FGPU_FAKE_GPU_STATE"] == "/s/state"


def test_segment_dir_refuses_ids_that_are_not_file_names(tmp_path: Path) -> None:
    folder = SegmentDir(tmp_path / "segs")
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match="workload_id"):
            folder.path(bad)


def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", name], check=True)
        return pwd.getpwnam(name)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create and switch users")
def test_a_segment_belongs_to_its_workloads_user_alone(tmp_path: Path) -> None:
    """Root's agent makes alice's segment: alice can map it, bob cannot even open it."""
    alice, bob = _user("fgpu-test-alice"), _user("fgpu-test-bob")
    base = Path(tempfile.mkdtemp(prefix="fgpu-test-", dir="/dev/shm"))
    base.chmod(0o755)
    folder = SegmentDir(base / "segs")
    seg = folder.create("w-alice", [UUID], [1024], max_inflight=2, uid=alice.pw_uid, gid=None)
    info = seg.path.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (alice.pw_uid, 0o600)
    assert folder.root.stat().st_mode & 0o777 == 0o711
    probe = ["sh", "-c", ': 1<>"$0" && echo opened', str(seg.path)]
    as_alice = subprocess.run(probe, user=alice.pw_uid, capture_output=True, text=True)
    as_bob = subprocess.run(probe, user=bob.pw_uid, capture_output=True, text=True)
    listing = subprocess.run(["ls", str(folder.root)], user=bob.pw_uid, capture_output=True)
    try:
        assert as_alice.stdout.strip() == "opened", as_alice.stderr
        assert as_bob.returncode != 0
        assert "Permission denied" in as_bob.stderr
        assert listing.returncode != 0  # the folder cannot be listed by others
    finally:
        seg.remove()
        shutil.rmtree(base)
