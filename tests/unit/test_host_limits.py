"""What ``fgpu nodes`` says when ``--cpu``/``--memory`` cannot be limited (no usable
cgroups), read from mount tables and cgroup folders made for the test; the limits themselves
are tested with real processes in tests/integration/test_host_limits.py."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from fgpu.agent.hostlimits import HostLimiter, LimitSupport, cpu_stat, memory_text, oom_kills
from fgpu.cli.render import nodes_view
from fgpu.server.views import host_limit_layers
from fgpu.wire import NodeView


def mounts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "mounts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def shown(node: NodeView) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(nodes_view([node]))
    return console.export_text()


def test_without_any_cgroup_mount_both_limits_are_off_and_say_why(tmp_path: Path) -> None:
    limiter = HostLimiter("t", mounts=mounts(tmp_path, "proc /proc proc rw 0 0"))
    support = limiter.support
    assert (support.kind, support.cpu, support.memory) == ("none", False, False)
    assert support.cpu_why == (
        "no cgroup v2 hierarchy is mounted; no cgroup v1 cpu hierarchy; "
        "no cgroup v1 memory hierarchy"
    )
    assert limiter.prepare("job", cpu_milli=500, memory_mib=100) is None


def test_cgroup_v2_without_the_controllers_says_which_are_missing(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("hugetlb\n")
    table = mounts(tmp_path, f"cgroup2 {root} cgroup2 rw,relatime 0 0")
    support = HostLimiter("t", mounts=table, prefer="v2").support
    assert not support.cpu
    assert not support.memory
    assert support.memory_why == (
        f"cgroup v2 at {root} has no cpu and no memory controller (bound to a cgroup v1 "
        "hierarchy, or not delegated to this cgroup)"
    )


def test_cgroup_v2_not_delegated_below_the_mount(tmp_path: Path) -> None:
    # the mount offers both controllers, but the folder fgpu creates gets none: what an
    # unprivileged user sees outside a delegated subtree
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")
    table = mounts(tmp_path, f"cgroup2 {root} cgroup2 rw 0 0")
    support = HostLimiter("t", mounts=table, prefer="v2").support
    assert not support.memory
    assert support.memory_why.startswith("cgroup v2 at ")
    assert "not writable here" in support.memory_why or "not delegated" in support.memory_why


def test_fgpu_nodes_shows_why_the_limits_are_not_enforced() -> None:
    why = "no cgroup v2 hierarchy is mounted; no cgroup v1 cpu hierarchy"
    layers = host_limit_layers(LimitSupport("none", False, False, why, why))
    assert [(la.name, la.active) for la in layers] == [
        ("cpu-limit", False),
        ("memory-limit", False),
    ]
    assert layers[1].why == f"not enforced: {why} (--memory counts for placement only)"
    node = NodeView(
        name="vm", backend="simulated", cpu_milli=2000, memory_mib=4096, gpus=[], host_limits=layers
    )
    text = shown(node)
    assert "Host limits (--cpu, --memory) on vm:" in text
    assert "memory-limit  off  not enforced: no cgroup v2 hierarchy is mounted" in text
    assert "cpu-limit     off  not enforced:" in text


def test_fgpu_nodes_shows_enforced_limits_as_on() -> None:
    support = LimitSupport("cgroup-v2", True, True, "cgroup v2 cpu.max at X", "memory.max at X")
    layers = host_limit_layers(support)
    assert [(la.active, la.why) for la in layers] == [
        (True, "cgroup v2 cpu.max at X"),
        (True, "memory.max at X"),
    ]
    text = shown(NodeView(name="vm", backend="nvml", cpu_milli=1, memory_mib=1, gpus=[]))
    assert "Host limits" not in text  # an older server sends none: nothing is claimed


def test_oom_kill_count_and_cpu_stat_are_read_from_the_kernel_files(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 900\nnr_throttled 4\nthrottled_usec 77\n")
    assert oom_kills(tmp_path / "memory.events") == 1
    assert oom_kills(tmp_path / "missing") == 0
    assert cpu_stat(tmp_path) == {"usage_usec": 900, "nr_throttled": 4, "throttled_usec": 77}
    assert (memory_text(100), memory_text(2048), memory_text(1536)) == (
        "100 MiB",
        "2 GiB",
        "1536 MiB",
    )


def fake_v2(tmp_path: Path, name: str) -> Path:
    """A stand-in for a cgroup v2 mount (plain folders and files, named as the kernel
    names them) down to fgpu's folder ``fgpu/NAME``, with both controllers offered."""
    root = tmp_path / "v2"
    for step in (root, root / "fgpu", root / "fgpu" / name):
        step.mkdir(parents=True)
        (step / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (step / "cgroup.subtree_control").write_text("")
    return root


def test_on_cgroup_v2_the_limits_are_written_as_the_kernel_reads_them(tmp_path: Path) -> None:
    # a stand-in folder tree: what is written, and where (real processes under real limits:
    # tests/integration/test_host_limits.py, on hosts where cgroup v2 has the controllers)
    root = fake_v2(tmp_path, "svc")
    limiter = HostLimiter("svc", mounts=mounts(tmp_path, f"cgroup2 {root} cgroup2 rw 0 0"))
    assert (limiter.support.kind, limiter.support.cpu, limiter.support.memory) == (
        "cgroup-v2",
        True,
        True,
    )
    assert (root / "fgpu" / "svc" / "cgroup.subtree_control").read_text() == "+memory"
    group = limiter.prepare("job/1", cpu_milli=500, memory_mib=100)
    assert group is not None
    (where,) = (Path(d) for d in group.join)
    assert where.parent == root / "fgpu" / "svc"
    assert where.name.startswith("job_1-l")
    assert (where / "cpu.max").read_text() == "50000 100000"
    assert (where / "memory.max").read_text() == str(100 << 20)
    assert (where / "memory.oom.group").read_text() == "1"
    assert group.oom_file == str(where / "memory.events")
    assert group.memory_limit == "100 MiB"
    # nothing to limit: still a cgroup of its own, which holds all it forks (issue 27)
    idle = limiter.prepare("idle", cpu_milli=0, memory_mib=0)
    assert idle is not None
    assert (idle.oom_file, idle.memory_limit) == (None, None)
    assert Path(idle.join[0]).parent == where.parent
    assert not (Path(idle.join[0]) / "cpu.max").exists()
    cpu_only = limiter.prepare("cpu", cpu_milli=5, memory_mib=0)  # below the kernel's minimum
    assert cpu_only is not None
    assert cpu_only.oom_file is None
    assert (Path(cpu_only.join[0]) / "cpu.max").read_text() == "1000 100000"


def test_on_cgroup_v1_each_controller_gets_its_own_cgroup(tmp_path: Path) -> None:
    table = mounts(
        tmp_path,
        f"cgroup {tmp_path}/cpu cgroup rw,cpu 0 0",
        f"cgroup {tmp_path}/memory cgroup rw,memory 0 0",
    )
    limiter = HostLimiter("svc", mounts=table, prefer="v1")
    assert (limiter.support.kind, limiter.support.cpu, limiter.support.memory) == (
        "cgroup-v1",
        True,
        True,
    )
    assert "swap not limited" in limiter.support.memory_why  # no memsw file in the stand-in
    group = limiter.prepare("job", cpu_milli=1500, memory_mib=2048)
    assert group is not None
    cpu, memory = (Path(d) for d in group.join)
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(2048 << 20)
    assert group.oom_file == str(memory / "memory.oom_control")
    assert group.memory_limit == "2 GiB"
