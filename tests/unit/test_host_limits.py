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
