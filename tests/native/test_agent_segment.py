"""The agent's side of the interposer segment: layout, creation, ownership, gate, environment.

The Python mirror of ``native/include/fgpu_seg.h`` must agree with the C compiler field by
field; a segment belongs to the workload's user alone; the environment preloads libfgpu first.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
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
from fgpu.agent.interposer.segment import (
    SIZE,
    SegGpu,
    SegLayout,
    Segment,
    SegmentError,
    SegProc,
)

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "native" / "include" / "fgpu_seg.h"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def _c_offsets(tmp_path: Path) -> dict[str, int]:
    """Offsets and sizes as the C compiler lays the header out."""
    fields = {
        "fgpu_seg": [name for name, *_ in SegLayout._fields_],
        "fgpu_seg_gpu": [name for name, *_ in SegGpu._fields_],
        "fgpu_seg_proc": [name for name, *_ in SegProc._fields_],
    }
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        '#include "fgpu_seg.h"',
        "int main(void){",
    ]
    for struct, names in fields.items():
        lines.append(f'printf("{struct} %zu\\n", sizeof(struct {struct}));')
        for name in names:
            lines.append(f'printf("{struct}.{name} %zu\\n", offsetof(struct {struct}, {name}));')
    lines.append("return 0;}")
    source = tmp_path / "offsets.c"
    source.write_text("\n".join(lines))
    program = tmp_path / "offsets"
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
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_python_layout_matches_the_c_header(tmp_path: Path) -> None:
    c = _c_offsets(tmp_path)
    for struct, cls in (
        ("fgpu_seg", SegLayout),
        ("fgpu_seg_gpu", SegGpu),
        ("fgpu_seg_proc", SegProc),
    ):
        assert c[struct] == ctypes.sizeof(cls), struct
        for name, *_ in cls._fields_:
            assert c[f"{struct}.{name}"] == getattr(cls, name).offset, f"{struct}.{name}"
    assert c["fgpu_seg"] == SIZE


def test_created_segment_reads_back(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path / "w.seg", "w-1", [UUID, "GPU-b"], [4 << 30, 0], max_inflight=2)
    try:
        st = seg.stats()
        assert seg.workload_id == "w-1"
        assert seg.uuids == (UUID, "GPU-b")
        assert [g.memory_limit for g in st.gpus] == [4 << 30, 0]
        assert (st.gate_closed, st.max_inflight, st.processes, st.live_pids) == (False, 2, 0, ())
        assert oct((tmp_path / "w.seg").stat().st_mode & 0o777) == "0o600"
        assert not list(tmp_path.glob(".*tmp"))  # written under a temporary name, renamed
        seg.set_gate(closed=True)
        assert Segment.open(tmp_path / "w.seg").stats().gate_closed  # another mapping sees it
        seg.set_max_inflight(0)
        assert seg.stats().max_inflight == 0
    finally:
        seg.remove()
    assert not (tmp_path / "w.seg").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uuids": []}, "uuids: 0 GPUs"),
        ({"uuids": [f"GPU-{i}" for i in range(17)], "memory_limits": [0] * 17}, "uuids: 17 GPUs"),
        ({"memory_limits": [1, 2]}, "memory_limits: 2 values for 1 GPUs"),
        ({"workload_id": "x" * 64}, "workload_id: 'xxxx"),
        ({"workload_id": ""}, "workload_id: ''"),
        ({"uuids": ["G" * 96]}, "uuids: 'GGG"),
        ({"memory_limits": [-1]}, "memory_limits: -1 must not be negative"),
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


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "shorter than a segment"), (b"\0" * SIZE, "not an fgpu segment")],
    ids=["empty", "zeros"],
)
def test_open_refuses_what_is_not_a_segment(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "bad.seg"
    path.write_bytes(content)
    with pytest.raises(SegmentError, match=why):
        Segment.open(path)
    with pytest.raises(SegmentError, match="cannot open"):
        Segment.open(tmp_path / "missing.seg")


def test_opening_the_gate_wakes_a_futex_waiter(tmp_path: Path) -> None:
    """A thread blocked in FUTEX_WAIT on the gate word (as the interposer waits) returns when
    the agent opens the gate."""
    seg = Segment.create(tmp_path / "w.seg", "w", [UUID], [0])
    seg.set_gate(closed=True)
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.addressof(seg._view) + SegLayout.gate.offset
    woke = threading.Event()

    def wait() -> None:
        # FUTEX_WAIT (0) while the word is 1 (closed); no timeout
        libc.syscall(202, ctypes.c_void_p(address), 0, 1, None, None, 0)
        woke.set()

    if os.uname().machine != "x86_64":
        pytest.skip("the futex syscall number in this test is x86-64's")
    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert not woke.wait(0.2)  # still blocked (a negative check; a false pass is impossible)
    seg.set_gate(closed=False)
    assert woke.wait(30)
    seg.remove()


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
