"""CPU and host-memory limits for a workload, through the kernel's cgroups (``--cpu``,
``--memory``; issue 25 point 2).

A workload that asks for ``--cpu 500m --memory 100MiB`` runs in a cgroup of its own whose
limits are those figures, as Slurm (``--cpus-per-task``, ``--mem`` with its cgroup plugin)
and Kubernetes (container limits) apply them:

- **cgroup v2** (the unified hierarchy; Linux admin guide, "Control Group v2", sections
  "CPU Interface Files" and "Memory Interface Files"): ``cpu.max`` = ``"QUOTA PERIOD"`` in
  microseconds (``cpu_milli * 100`` per 100 000), ``memory.max`` = the limit in bytes,
  ``memory.swap.max`` = ``0`` (the limit holds: the workload cannot page out past it) and
  ``memory.oom.group`` = ``1`` (an out-of-memory kill takes the whole workload, not one of
  its processes at random). The controllers are enabled by writing ``+cpu``/``+memory`` to
  ``cgroup.subtree_control`` of every cgroup from the mount down to fgpu's folder.
- **cgroup v1** (hybrid hosts, where the ``cpu`` and ``memory`` controllers are still bound to
  v1 hierarchies; kernel documentation ``admin-guide/cgroup-v1/memory.rst`` and
  ``scheduler/sched-bwc.rst``): ``cpu.cfs_quota_us``/``cpu.cfs_period_us``,
  ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes`` (memory plus swap, same
  figure) under the agent's own cgroup of each hierarchy.

An out-of-memory kill is counted by the kernel in ``oom_kill N`` of ``memory.events`` (v2)
or ``memory.oom_control`` (v1); the wrapper (:mod:`fgpu.agent.runner`) reads it when the
command ends and records the reason ``out of host memory (limit X)``.

How a workload gets into its cgroup: :meth:`HostLimiter.prepare` creates it and writes the
limits; the wrapper joins it before starting the command (so the command's first byte is
already counted) and leaves it right after, so only the workload's own processes are in it.
On cgroup v2 the freezer then governs the workload in that same cgroup
(:class:`fgpu.agent.governor.freezer.CgroupFreezer` finds it).

Every workload gets a cgroup v2 of its own where that hierarchy is writable
(:attr:`HostLimiter.track`), with or without limits (on hybrid hosts beside the v1 ones), so
that nothing it forks can leave it; when the command ends the wrapper kills what is left in
its cgroups and removes them (:mod:`fgpu.agent.cgroupkill`; issue 27).

When neither is writable (no cgroup v2 with the controllers delegated, not root, no v1
hierarchy) :attr:`HostLimiter.support` says why, ``fgpu nodes`` shows it, and ``--cpu``/
``--memory`` stay what the scheduler counts for placement only.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from fgpu.agent.cgroupkill import end_cgroups
from fgpu.agent.cgroupsweep import remove_stale_neighbours

CPU_PERIOD_US = 100_000
"""The CFS period, microseconds (the kernel's default)."""

MIN_QUOTA_US = 1_000
"""The smallest quota the kernel accepts, microseconds (``cpu_milli`` 10)."""

OUT_OF_HOST_MEMORY = "out of host memory"
"""How the reason of a workload killed by its memory limit starts (the wrapper writes
``out of host memory (limit 100 MiB)``)."""

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class LimitSupport:
    """Whether fgpu can enforce ``--cpu`` and ``--memory`` on this host, and why.

    Attributes:
        kind: ``"cgroup-v2"``, ``"cgroup-v1"`` or ``"none"``.
        cpu: ``--cpu`` is a limit (``cpu.max`` / CFS quota).
        memory: ``--memory`` is a limit (``memory.max`` / ``memory.limit_in_bytes``).
        cpu_why: how it is enforced, or why it cannot be.
        memory_why: how it is enforced, or why it cannot be.
    """

    kind: str
    cpu: bool
    memory: bool
    cpu_why: str
    memory_why: str


@dataclass(frozen=True, slots=True)
class LimitGroup:
    """The cgroup(s) prepared for one workload's run (what the wrapper joins).

    Attributes:
        join: the cgroup directories the wrapper enters before starting the command (one on
            v2; one per controller hierarchy on v1).
        home: the directories it returns to afterwards (the agent's own cgroups, same
            order).
        oom_file: the file whose ``oom_kill N`` line counts out-of-memory kills, or None
            when memory is not limited.
        memory_limit: the memory limit as shown to users (``"100 MiB"``), or None.
        stat_dirs: the directory that holds ``cpu.stat`` (to read throttling), or None.
    """

    join: tuple[str, ...]
    home: tuple[str, ...]
    oom_file: str | None = None
    memory_limit: str | None = None
    stat_dirs: dict[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, object]:
        """The JSON form the wrapper reads (``cgroups`` of its launch settings)."""
        return {
            "join": list(self.join),
            "home": list(self.home),
            "oom_file": self.oom_file,
            "memory_limit": self.memory_limit,
        }


def memory_text(mib: int) -> str:
    """``100`` -> ``"100 MiB"``, ``2048`` -> ``"2 GiB"`` (whole GiB only)."""
    return f"{mib // 1024} GiB" if mib >= 1024 and mib % 1024 == 0 else f"{mib} MiB"


def oom_kills(path: str | Path) -> int:
    """The ``oom_kill N`` count of a ``memory.events`` (v2) or ``memory.oom_control`` (v1)
    file; 0 when the file or the line is missing."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def cpu_stat(directory: str | Path) -> dict[str, int]:
    """``cpu.stat`` of a cgroup as name -> value (v2: ``nr_throttled``, ``throttled_usec``;
    v1: ``nr_throttled``, ``throttled_time`` in ns); empty when unreadable."""
    out: dict[str, int] = {}
    try:
        text = (Path(directory) / "cpu.stat").read_text(encoding="ascii")
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def _mounts(path: str = "/proc/self/mounts") -> list[tuple[str, str, str]]:
    """``(mount point, type, options)`` of every cgroup mount."""
    found: list[tuple[str, str, str]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                    found.append((parts[1], parts[2], parts[3]))
    except OSError:
        pass
    return found


def own_cgroups(path: str = "/proc/self/cgroup") -> dict[str, str]:
    """This process's cgroup path per hierarchy: ``""`` for v2 (``0::/x``), each controller
    name for v1 (``4:memory:/x``)."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out[""] = parts[2]
        for name in parts[1].split(","):
            if name:
                out[name] = parts[2]
    return out


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def _under(mount: str, relative: str) -> Path:
    return Path(mount) / relative.lstrip("/")


class HostLimiter:
    """Creates per-workload cgroups with ``--cpu``/``--memory`` as limits (module docstring).

    Args:
        name: this service's subtree (the same as the freezer's: ``<v2 mount>/fgpu/<name>``;
            on v1 ``<hierarchy>/<own cgroup>/fgpu/<name>``). None: ``fgpu`` itself.
        mounts: the mount table to read (tests pass another).
        prefer: ``"auto"`` (v2 when it has both controllers, else v1), ``"v2"``, ``"v1"`` or
            ``"off"``.

    Never raises at construction: what cannot be set up shows in :attr:`support`.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        mounts: str = "/proc/self/mounts",
        prefer: str = "auto",
    ) -> None:
        self.name = name
        self._dirs: dict[str, Path] = {}  # controller -> fgpu folder ("" on v2: both)
        self._homes: dict[str, Path] = {}
        self.support = self._probe(mounts, prefer)
        self.track: Path | None = None
        """The cgroup v2 folder every workload starts in a cgroup of (whatever its limits),
        so that nothing it forks can leave it (:mod:`fgpu.agent.cgroupkill`); None where no
        cgroup v2 hierarchy is writable (then only its process group is reached)."""
        self._track_home: Path | None = None
        if prefer != "off":
            self._probe_track(mounts)

    def _probe_track(self, mounts: str) -> None:
        if "" in self._dirs:
            self.track, self._track_home = self._dirs[""], self._homes[""]
            return
        v2 = next((m for m in _mounts(mounts) if m[1] == "cgroup2"), None)
        if v2 is None:
            return
        folder = self._folder(Path(v2[0]))
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return
        if (folder / "cgroup.procs").exists() and os.access(folder / "cgroup.procs", os.W_OK):
            self.track = folder
            self._track_home = _under(v2[0], own_cgroups().get("", "/"))

    # ------------------------------------------------------------------ probing
    def _probe(self, mounts: str, prefer: str) -> LimitSupport:
        if prefer == "off":
            why = "off"
            return LimitSupport("none", False, False, why, why)
        table = _mounts(mounts)
        own = own_cgroups()
        v2_why = "no cgroup v2 hierarchy is mounted"
        if prefer in ("auto", "v2"):
            v2 = next((m for m in table if m[1] == "cgroup2"), None)
            if v2 is not None:
                found = self._probe_v2(Path(v2[0]), own.get("", "/"))
                if isinstance(found, LimitSupport):
                    return found
                v2_why = found
            if prefer == "v2":
                return LimitSupport("none", False, False, v2_why, v2_why)
        found_v1 = self._probe_v1(table, own)
        if isinstance(found_v1, LimitSupport):
            return found_v1
        why = f"{v2_why}; {found_v1}" if prefer == "auto" else found_v1
        return LimitSupport("none", False, False, why, why)

    def _folder(self, base: Path) -> Path:
        folder = base / "fgpu"
        return folder / self.name if self.name else folder

    def _probe_v2(self, mount: Path, own: str) -> LimitSupport | str:
        """Enable cpu and memory from the mount down to fgpu's folder; the support, or why
        not (a string)."""
        try:
            available = (mount / "cgroup.controllers").read_text(encoding="ascii").split()
        except OSError as exc:
            return f"cgroup v2 at {mount} is unreadable: {exc.strerror or exc}"
        missing = [c for c in ("cpu", "memory") if c not in available]
        if missing:
            return (
                f"cgroup v2 at {mount} has no {' and no '.join(missing)} controller (bound "
                f"to a cgroup v1 hierarchy, or not delegated to this cgroup)"
            )
        folder = self._folder(mount)
        chain = [mount, mount / "fgpu", folder] if self.name else [mount, folder]
        try:
            for step in chain:
                step.mkdir(exist_ok=True)
                have = (step / "cgroup.controllers").read_text(encoding="ascii").split()
                wanted = [c for c in ("cpu", "memory") if c in have]
                if len(wanted) < 2:
                    return f"the cpu and memory controllers are not delegated to {step}"
                enabled = (step / "cgroup.subtree_control").read_text(encoding="ascii").split()
                for controller in wanted:
                    if controller not in enabled:
                        _write(step / "cgroup.subtree_control", f"+{controller}")
        except OSError as exc:
            return (
                f"cgroup v2 at {mount} is not writable here ({exc.strerror or exc}; fgpu "
                "needs root or a delegated subtree)"
            )
        self._dirs[""] = folder
        self._homes[""] = _under(str(mount), own)
        swap = (
            "swap off (memory.swap.max 0)"
            if (folder / "memory.swap.max").exists()
            else "swap not limited (no swap accounting)"
        )
        return LimitSupport(
            "cgroup-v2",
            True,
            True,
            f"cgroup v2 cpu.max at {folder}: --cpu is a limit (CFS quota per "
            f"{CPU_PERIOD_US // 1000} ms)",
            f"cgroup v2 memory.max at {folder}, {swap}: over --memory the workload is "
            "killed (reason: out of host memory)",
        )

    def _probe_v1(
        self, table: list[tuple[str, str, str]], own: dict[str, str]
    ) -> LimitSupport | str:
        whys: list[str] = []
        for controller in ("cpu", "memory"):
            mount = next(
                (m for m in table if m[1] == "cgroup" and controller in m[2].split(",")), None
            )
            if mount is None:
                whys.append(f"no cgroup v1 {controller} hierarchy")
                continue
            folder = self._folder(_under(mount[0], own.get(controller, "/")))
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                whys.append(f"cgroup v1 {controller} at {folder}: {exc.strerror or exc}")
                continue
            self._dirs[controller] = folder
            self._homes[controller] = _under(mount[0], own.get(controller, "/"))
        if not self._dirs:
            return "; ".join(whys) or "no cgroup hierarchy"
        cpu_dir = self._dirs.get("cpu")
        memory_dir = self._dirs.get("memory")
        swap = (
            "memory+swap limited too"
            if memory_dir is not None and (memory_dir / "memory.memsw.limit_in_bytes").exists()
            else "swap not limited (no swap accounting)"
        )
        return LimitSupport(
            "cgroup-v1",
            cpu_dir is not None,
            memory_dir is not None,
            f"cgroup v1 CFS quota at {cpu_dir}: --cpu is a limit"
            if cpu_dir is not None
            else next(w for w in whys if "cpu" in w),
            f"cgroup v1 memory.limit_in_bytes at {memory_dir}, {swap}: over --memory the "
            "workload is killed (reason: out of host memory)"
            if memory_dir is not None
            else next(w for w in whys if "memory" in w),
        )

    # ------------------------------------------------------------------ per workload
    def prepare(self, workload_id: str, *, cpu_milli: int, memory_mib: int) -> LimitGroup | None:
        """Create the workload's cgroup(s) with its limits, and its cgroup v2 that holds
        everything it forks (:attr:`track`, also without limits); None when there is no
        cgroup to make (no limits asked or possible, and no writable cgroup v2).

        Args:
            workload_id: names the cgroup (with a random suffix: one per run).
            cpu_milli: the CPU limit in milli-cores (0: none); at least 10 is applied.
            memory_mib: the memory limit in MiB (0: none).

        Raises:
            OSError: a cgroup could not be created or a limit written (the message names the
                file); what was created is removed.
        """
        want_cpu = cpu_milli > 0 and self.support.cpu
        want_memory = memory_mib > 0 and self.support.memory
        if not (want_cpu or want_memory or self.track is not None):
            return None
        name = f"{_SAFE.sub('_', workload_id) or 'workload'}-l{secrets.token_hex(4)}"
        quota = max(MIN_QUOTA_US, cpu_milli * CPU_PERIOD_US // 1000)
        limit = str(memory_mib * MIB)
        created: list[Path] = []
        try:
            if "" in self._dirs:  # v2: one cgroup for both
                group = self._dirs[""] / name
                self._mkdir(group, created)
                if want_cpu:
                    _write(group / "cpu.max", f"{quota} {CPU_PERIOD_US}")
                if want_memory:
                    _write(group / "memory.max", limit)
                    if (group / "memory.swap.max").exists():
                        _write(group / "memory.swap.max", "0")
                    with contextlib.suppress(OSError):  # kernels before 4.19 have none
                        _write(group / "memory.oom.group", "1")
                return LimitGroup(
                    join=(str(group),),
                    home=(str(self._homes[""]),),
                    oom_file=str(group / "memory.events") if want_memory else None,
                    memory_limit=memory_text(memory_mib) if want_memory else None,
                    stat_dirs={"cpu": str(group), "memory": str(group)},
                )
            join: list[str] = []
            home: list[str] = []
            stat: dict[str, str] = {}
            oom = None
            if self.track is not None and self._track_home is not None:
                group = self.track / name
                self._mkdir(group, created)
                join.append(str(group))
                home.append(str(self._track_home))
            if want_cpu:
                group = self._dirs["cpu"] / name
                self._mkdir(group, created)
                _write(group / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(group / "cpu.cfs_quota_us", str(quota))
                join.append(str(group))
                home.append(str(self._homes["cpu"]))
                stat["cpu"] = str(group)
            if want_memory:
                group = self._dirs["memory"] / name
                self._mkdir(group, created)
                _write(group / "memory.limit_in_bytes", limit)
                if (group / "memory.memsw.limit_in_bytes").exists():
                    _write(group / "memory.memsw.limit_in_bytes", limit)
                join.append(str(group))
                home.append(str(self._homes["memory"]))
                stat["memory"] = str(group)
                oom = str(group / "memory.oom_control")
            return LimitGroup(
                join=tuple(join),
                home=tuple(home),
                oom_file=oom,
                memory_limit=memory_text(memory_mib) if want_memory else None,
                stat_dirs=stat,
            )
        except OSError as exc:
            for group in reversed(created):
                with contextlib.suppress(OSError):
                    group.rmdir()
            where = f"{exc.filename}: " if exc.filename else ""
            raise OSError(exc.errno, f"{where}{exc.strerror or exc}") from exc

    @staticmethod
    def discard(group: LimitGroup) -> None:
        """Remove a prepared group that no process joined (its launch failed)."""
        for directory in group.join:
            with contextlib.suppress(OSError):
                Path(directory).rmdir()

    def end_workload(self, workload_id: str) -> list[int]:
        """Kill every process left in the workload's cgroups (those of each of its runs,
        found by name under this service's folders) and remove them; the pids killed.
        What the wrapper does when the command ends, for a wrapper that could not (killed
        from outside, or its launch failed half-way)."""
        pattern = re.compile(
            re.escape(_SAFE.sub("_", workload_id) or "workload") + r"-l[0-9a-f]{8}"
        )
        groups: list[Path] = []
        folders = set(self._dirs.values()) | ({self.track} if self.track is not None else set())
        for folder in folders:
            with contextlib.suppress(OSError):
                groups += [g for g in folder.iterdir() if pattern.fullmatch(g.name)]
        return end_cgroups(groups)

    def _mkdir(self, group: Path, created: list[Path]) -> None:
        try:
            group.mkdir()
        except FileNotFoundError:  # a freezer's start swept the empty subtree: make it again
            group.parent.mkdir(parents=True, exist_ok=True)
            if "" in self._dirs:
                for controller in ("cpu", "memory"):
                    _write(group.parent / "cgroup.subtree_control", f"+{controller}")
            group.mkdir()
        created.append(group)

    def sweep(self) -> list[Path]:
        """Remove the empty per-workload cgroups of ended runs (the wrapper removes its own;
        one killed with its workload leaves it). Returns what was removed."""
        removed: list[Path] = []
        folders = set(self._dirs.values()) | ({self.track} if self.track is not None else set())
        for folder in folders:
            with contextlib.suppress(OSError):
                for group in folder.iterdir():
                    if group.is_dir() and "-l" in group.name:
                        with contextlib.suppress(OSError):
                            group.rmdir()
                            removed.append(group)
        return removed

    def remove_empty_neighbours(self, min_age_s: float = 3600.0) -> list[Path]:
        """Remove the empty folders that other services left beside this one's under
        ``fgpu`` (and their empty per-workload cgroups) when unchanged for ``min_age_s``:
        what a killed service whose state folder is gone leaves behind. A cgroup with
        processes is never removed (the kernel refuses). Returns what was removed."""
        removed: list[Path] = []
        if not self.name:
            return removed
        folders = set(self._dirs.values()) | ({self.track} if self.track is not None else set())
        for folder in folders:
            removed += remove_stale_neighbours(folder, min_age_s)
        return removed

    def close(self) -> None:
        """Remove the empty cgroups of ended runs and this service's folders when empty
        (a cgroup that still holds a running workload stays)."""
        self.sweep()
        folders = set(self._dirs.values()) | ({self.track} if self.track is not None else set())
        for folder in folders:
            with contextlib.suppress(OSError):
                folder.rmdir()
                if self.name and folder.parent.name == "fgpu":
                    folder.parent.rmdir()  # fails while other services have theirs there


__all__ = [
    "CPU_PERIOD_US",
    "OUT_OF_HOST_MEMORY",
    "HostLimiter",
    "LimitGroup",
    "LimitSupport",
    "cpu_stat",
    "memory_text",
    "oom_kills",
    "own_cgroups",
]
