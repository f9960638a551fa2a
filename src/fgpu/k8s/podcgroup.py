"""Find a pod's cgroup (v2) by its uid, and freeze it as one unit.

The kubelet puts every pod in a cgroup of its own, named after the pod's uid, below a
``kubepods`` cgroup; its containers are child cgroups of that one. Two layouts, chosen by
the kubelet's cgroup driver (``root`` is the cgroup v2 mount, or the ``--cgroup-root`` the
kubelet was given):

- ``cgroupfs``: ``kubepods/pod<uid>`` (Guaranteed), ``kubepods/burstable/pod<uid>`` and
  ``kubepods/besteffort/pod<uid>``;
- ``systemd``: ``kubepods.slice/kubepods-pod<u>.slice`` (Guaranteed) and
  ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<u>.slice``, where ``<u>`` is the
  uid with ``-`` replaced by ``_`` (systemd reserves ``-`` in unit names for nesting). The
  same naming below ``kubelet.slice/kubelet-kubepods.slice`` (kind, rootless) is found too.

:class:`PodCgroupFreezer` implements :class:`~fgpu.agent.governor.freezer.Freezer` on those
cgroups: it writes the pod cgroup's ``cgroup.freeze`` (which freezes every container below
it) and confirms through ``frozen 1`` in ``cgroup.events``. It never moves a process, never
signals one and never creates or removes a cgroup: the kubelet owns them.

The governor speaks in :class:`~fgpu.agent.process.ProcessHandle`\\ s; a pod has no launcher
handle, so the enforcer passes a synthetic one (:func:`pod_handle`: pid and pgid 0, no
paths) and the freezer keys everything on ``handle.workload_id`` (``namespace/name``),
bound to the pod's cgroup directory with :meth:`PodCgroupFreezer.bind` beforehand.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from fgpu.agent.governor.freezer import Hastener
from fgpu.agent.process import ProcessHandle

log = logging.getLogger("fgpu.k8s.podcgroup")

QOS_CLASSES = ("burstable", "besteffort")
"""Kubelet QoS cgroups; Guaranteed pods sit directly under ``kubepods``."""

_KUBEPODS = ("kubepods", "kubepods.slice", "kubelet.slice/kubelet-kubepods.slice")
_POLL_S = 0.0005
_NOWHERE = Path("/dev/null")


def pod_handle(workload_id: str) -> ProcessHandle:
    """The synthetic handle the governor gets for a pod (pid and pgid 0, no paths).

    :class:`PodCgroupFreezer` looks only at ``workload_id``; nothing signals pid 0 because
    the node agent never sends signals to pods (see :mod:`fgpu.k8s.enforce`)."""
    return ProcessHandle(
        workload_id=workload_id,
        pid=0,
        create_time=0.0,
        pgid=0,
        stdout_path=_NOWHERE,
        stderr_path=_NOWHERE,
        exit_path=_NOWHERE,
    )


def kubepods_dirs(root: Path) -> list[Path]:
    """The ``kubepods`` cgroups present under ``root`` (one per layout found)."""
    return [root / name for name in _KUBEPODS if (root / name).is_dir()]


def pod_cgroup_candidates(kubepods: Path, uid: str) -> list[Path]:
    """Where the kubelet would put pod ``uid`` below ``kubepods`` (existing or not).

    A ``.slice`` directory means the systemd driver; anything else cgroupfs."""
    if kubepods.name.endswith(".slice"):
        prefix = kubepods.name.removesuffix(".slice")
        u = uid.replace("-", "_")
        out = [kubepods / f"{prefix}-pod{u}.slice"]
        for qos in QOS_CLASSES:
            out.append(kubepods / f"{prefix}-{qos}.slice" / f"{prefix}-{qos}-pod{u}.slice")
        return out
    return [kubepods / f"pod{uid}"] + [kubepods / qos / f"pod{uid}" for qos in QOS_CLASSES]


def find_pod_cgroup(root: Path, uid: str) -> Path | None:
    """The cgroup directory of pod ``uid`` under ``root``, or None (not started yet, gone,
    or another layout). ``uid`` is the pod's ``metadata.uid``."""
    if not uid:
        return None
    for kubepods in kubepods_dirs(root):
        for path in pod_cgroup_candidates(kubepods, uid):
            if path.is_dir():
                return path
    return None


def pod_cgroups(root: Path) -> Iterator[Path]:
    """Every pod cgroup directory under ``root``'s ``kubepods`` (both layouts)."""
    for kubepods in kubepods_dirs(root):
        slice_ = kubepods.name.endswith(".slice")
        parents = [kubepods]
        for qos in QOS_CLASSES:
            name = f"{kubepods.name.removesuffix('.slice')}-{qos}.slice" if slice_ else qos
            if (kubepods / name).is_dir():
                parents.append(kubepods / name)
        for parent in parents:
            for child in sorted(parent.iterdir()):
                is_pod = (
                    ("-pod" in child.name and child.name.endswith(".slice"))
                    if slice_
                    else (child.name.startswith("pod"))
                )
                if is_pod and child.is_dir():
                    yield child


def cgroup_pids(group: Path) -> list[int]:
    """The processes in cgroup ``group`` and every cgroup below it, ascending (empty when it
    is gone). Pids are as seen in this process's pid namespace (host pids with
    ``hostPID: true``)."""
    found: set[int] = set()
    for directory, _, _ in os.walk(group):
        with contextlib.suppress(OSError):
            text = (Path(directory) / "cgroup.procs").read_text(encoding="ascii")
            found.update(int(line) for line in text.split())
    return sorted(found)


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def _frozen(group: Path) -> bool:
    """``frozen 1`` in ``cgroup.events``; a cgroup that is gone counts as frozen (nothing
    runs there)."""
    try:
        text = (group / "cgroup.events").read_text(encoding="ascii")
    except FileNotFoundError:
        return True
    return "frozen 1" in text.split("\n")


class PodCgroupFreezer:
    """Freezes pods through their own cgroup v2 (see the module docstring).

    Args:
        root: the cgroup v2 directory that holds ``kubepods`` (the cgroup v2 mount, e.g.
            ``/sys/fs/cgroup``, or the kubelet's ``--cgroup-root``; tests pass a directory
            they made under the mount).
        hasten: boost still-runnable tasks while waiting for a freeze (needs CAP_SYS_NICE;
            see :class:`~fgpu.agent.governor.freezer.Hastener`).

    Raises:
        OSError: ``root`` is not a cgroup v2 directory, holds no ``kubepods`` cgroup (and is
            the mount's root), or the kernel has no ``cgroup.freeze`` (before 5.2).
    """

    def __init__(self, root: Path, *, hasten: bool = False) -> None:
        if not (root / "cgroup.procs").exists():
            raise OSError(errno.ENOTSUP, f"{root} is not a cgroup v2 directory")
        kubepods = kubepods_dirs(root)
        if not (root / "cgroup.freeze").exists():  # the mount's root cgroup has none
            if not kubepods:
                raise OSError(
                    errno.ENOENT,
                    f"no kubepods cgroup under {root} (not a kubelet's cgroup root; see "
                    "--cgroup-root)",
                )
            if not (kubepods[0] / "cgroup.freeze").exists():
                raise OSError(errno.ENOTSUP, f"no cgroup.freeze in {kubepods[0]} (kernel < 5.2)")
        self.root = root
        self._hasten = hasten
        self._paths: dict[str, Path] = {}

    @property
    def kind(self) -> str:
        return "cgroup-v2"

    # -- binding pods -------------------------------------------------------------------------

    def bind(self, workload_id: str, uid: str) -> Path | None:
        """Find pod ``uid``'s cgroup and key it as ``workload_id``; returns it, or None (and
        forgets ``workload_id``) when the pod has no cgroup here yet."""
        path = find_pod_cgroup(self.root, uid)
        if path is None:
            self._paths.pop(workload_id, None)
        else:
            self._paths[workload_id] = path
        return path

    def path(self, handle: ProcessHandle) -> Path | None:
        """The cgroup bound to the handle's workload, or None."""
        return self._paths.get(handle.workload_id)

    def recover(self) -> list[Path]:
        """Thaw every pod cgroup found frozen under ``root`` (an agent that died while it
        held a pod frozen); returns those thawed. Nothing else is touched."""
        thawed: list[Path] = []
        for group in pod_cgroups(self.root):
            try:
                if (group / "cgroup.freeze").read_text(encoding="ascii").strip() != "1":
                    continue
                _write(group / "cgroup.freeze", "0")
            except OSError as exc:
                log.warning("cannot thaw %s: %s", group, exc)
                continue
            thawed.append(group)
        return thawed

    # -- Freezer ------------------------------------------------------------------------------

    def adopt(self, handle: ProcessHandle) -> None:
        """Thaw the pod (a previous agent may have left it frozen)."""
        self.thaw(handle)

    def freeze(self, handle: ProcessHandle) -> None:
        group = self.path(handle)
        if group is not None:
            with contextlib.suppress(FileNotFoundError):
                _write(group / "cgroup.freeze", "1")

    def wait_frozen(self, handle: ProcessHandle, timeout_s: float) -> bool:
        group = self.path(handle)
        if group is None:
            return True
        deadline = time.monotonic() + timeout_s
        hastener = Hastener() if self._hasten else None
        try:
            while not _frozen(group):
                if time.monotonic() >= deadline:
                    return False
                if hastener is not None:
                    hastener.boost(cgroup_pids(group))
                time.sleep(_POLL_S)
            return True
        finally:
            if hastener is not None:
                hastener.restore()

    def thaw(self, handle: ProcessHandle) -> None:
        group = self.path(handle)
        if group is not None:
            with contextlib.suppress(FileNotFoundError):
                _write(group / "cgroup.freeze", "0")

    def is_frozen(self, handle: ProcessHandle) -> bool:
        group = self.path(handle)
        return group is not None and bool(cgroup_pids(group)) and _frozen(group)

    def pids(self, handle: ProcessHandle) -> list[int]:
        group = self.path(handle)
        return cgroup_pids(group) if group is not None else []

    def owns(self, handle: ProcessHandle, pid: int) -> bool:
        return pid in self.pids(handle)

    def release(self, handle: ProcessHandle) -> None:
        """Thaw the pod and forget its cgroup (the cgroup itself is the kubelet's)."""
        self.thaw(handle)
        self._paths.pop(handle.workload_id, None)

    def close(self) -> None:
        self._paths.clear()


__all__ = [
    "PodCgroupFreezer",
    "cgroup_pids",
    "find_pod_cgroup",
    "pod_cgroup_candidates",
    "pod_cgroups",
    "pod_handle",
]
