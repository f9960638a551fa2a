"""Restart safety (part of :class:`fgpu.server.service.Service`): each workload the store
has as running is re-adopted when its process still lives (pid and start time match, see
:meth:`fgpu.agent.launcher.Launcher.is_same_process`); when its process ended while the
service was down and left its exit record, the recorded outcome is kept; otherwise it is
marked failed, "lost while the service was down". Live workloads of this state folder that
the store does not have as running (a store emptied or replaced while they ran) are stopped
before the scheduling loop starts, so no GPU is handed out twice."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path

from fgpu.agent.governor.freezer import CgroupFreezer
from fgpu.agent.launcher import RECORD_WAIT_S
from fgpu.agent.process import ProcessHandle, group_alive
from fgpu.agent.runner import ExitRecord
from fgpu.model.types import InvalidRequestError
from fgpu.sched.state import ClusterState
from fgpu.server.suspending import Suspension
from fgpu.store.errors import NotFound, RowDamaged
from fgpu.store.records import LOST_REASON, WorkloadRecord

log = logging.getLogger("fgpu.server")

UNKNOWN_GRACE_S = 5.0
"""At start, how long a workload the store does not know gets between SIGTERM and SIGKILL."""


class Recovery(Suspension):
    """Part of :class:`fgpu.server.service.Service`: settling what ran before a restart."""

    def _recover(self) -> None:
        """Re-adopt live processes of running workloads; settle the others.

        A running workload whose placement no longer exists on this machine (the service
        came back with other GPUs) is stopped and returns to pending.
        """
        with self._lock:
            check = ClusterState(self.machine.nodes)
            index = self._node_index()
            for record in self.store.running_records():
                fits = True
                gone = "its GPUs are not on this machine any more; restarting it"
                if record.allocation is not None and record.allocation.mig is not None:
                    mig = record.allocation.mig
                    if self.mig.find(mig) is None:
                        fits = False
                        gone = (
                            f"its MIG instance {mig.profile}@{mig.start} ({mig.uuid}) of GPU "
                            f"{mig.gpu_index} is not on this machine any more; restarting it"
                        )
                        log.warning("workload %s: %s", record.id, gone)
                elif record.allocation is not None:
                    try:
                        a = record.allocation
                        if a.node_name not in index:
                            raise InvalidRequestError("node", f"no node {a.node_name}")
                        here = self.machine.uuids(a.node_name, a.gpus)
                        if a.gpu_uuids and list(a.gpu_uuids) != here:
                            raise InvalidRequestError(
                                "gpus", f"GPUs {', '.join(a.gpu_uuids)} are not at those places"
                            )
                        check.allocate(record.request, index[a.node_name], a.gpus)
                    except (InvalidRequestError, IndexError) as exc:
                        fits = False
                        log.warning("workload %s no longer fits this machine: %s", record.id, exc)
                handle = self._find_process(record)
                if handle is not None and self.launcher.is_same_process(handle):
                    if not fits and record.stop_requested_at is None:
                        record = self._tracked.mark_stopping(record.id, gone)
                    log.info("re-adopted workload %s (pid %d)", record.id, handle.pid)
                    self.store.record_event(
                        record.id,
                        "readopted",
                        "service restart",
                        f"process {handle.pid} still runs; watched again after the restart",
                    )
                    self._watch(handle)
                    if record.stop_requested_at is not None:  # finish what was started
                        self._handles[record.id] = handle
                        self._stop(record.id, record.reason)
                    else:  # died during a restore: finish it
                        self._finish_interrupted_restore(record, handle)
                    continue
                # the wrapper is gone: what it ran must not keep running untracked
                killed = handle is not None and self.launcher.signal(handle, signal.SIGKILL)
                ended = self._recorded_exit(record, handle)
                if ended is not None:  # it ended while the service was down
                    exit_record, at = ended
                    self._record_end(record.id, exit_record.code, exit_record.reason, at)
                elif not fits or (
                    record.stop_requested_at is not None and record.cancelled_by is None
                ):
                    self._tracked.mark_preempted(record.id, record.reason or gone)
                elif killed:
                    self._tracked.mark_lost(
                        record.id, f"{LOST_REASON}; its remaining processes were killed"
                    )
                else:
                    self._tracked.mark_lost(record.id)
            for record in self.store.list_workloads(["pending"]):
                if record.is_suspended:
                    self._recover_suspended(record)
            self._stop_unknown()

    def _stop_unknown(self) -> None:
        """Stop the live workloads the store does not have as running: wrappers started
        from this state folder (their ``handle.json``, or found by their command line) that
        were not re-adopted above, as after a store emptied or replaced while they ran.
        Without their placement they cannot be adopted, and left alone they would share a
        GPU handed to new work; so they get SIGTERM, SIGKILL after :data:`UNKNOWN_GRACE_S`,
        and this returns only once they are gone (or :data:`RECORD_WAIT_S` after the
        SIGKILL), before the scheduling loop starts; so are the processes in this service's
        workload cgroups that no watched workload owns (:meth:`_unknown_cgroups`). Each
        wrapper gets an event (on its workload when the store knows its id) and a warning
        in the log."""
        found: dict[str, ProcessHandle] = {}
        for path in sorted(self.log_dir.glob("*/handle.json")):
            with contextlib.suppress(ValueError, KeyError, OSError):
                handle = ProcessHandle.from_dict(json.loads(path.read_text()))
                if self.launcher.is_same_process(handle):
                    found[handle.workload_id] = handle
        if self.log_dir.is_dir():
            for handle in self.launcher.find_all(self.log_dir):
                found.setdefault(handle.workload_id, handle)
        unknown: list[tuple[ProcessHandle, WorkloadRecord | None]] = []
        for workload_id, handle in found.items():
            if workload_id in self._handles:
                continue  # re-adopted
            try:
                record: WorkloadRecord | None = self.store.get(workload_id)
            except NotFound:
                record = None
            except RowDamaged:  # its row cannot be read: as unknown, so it is stopped
                record = None
            unknown.append((handle, record))
        groups = self._unknown_cgroups()
        if not unknown and not groups:
            return
        for handle, record in unknown:
            known = f"as {record.phase}" if record is not None else "not at all"
            log.warning(
                "workload %s (pid %d) still runs but the store knows it %s; stopping it "
                "before any GPU is handed out",
                handle.workload_id,
                handle.pid,
                known,
            )
            self.launcher.signal(handle, signal.SIGTERM)
            self.launcher.signal(handle, signal.SIGCONT)  # a stopped group must run to end
        for group in groups:
            log.warning(
                "cgroup %s holds processes of a workload this service does not run; "
                "stopping them before any GPU is handed out",
                group,
            )
            _signal_all(group, signal.SIGTERM)
            _signal_all(group, signal.SIGCONT)

        def left() -> bool:
            return any(group_alive(h) for h, _ in unknown) or any(
                CgroupFreezer.pids_in(g) for g in groups
            )

        deadline = time.monotonic() + UNKNOWN_GRACE_S
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        for handle, _ in unknown:
            self.launcher.signal(handle, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(handle.pid, signal.SIGKILL)  # the wrapper too: nothing to record
        for group in groups:
            _signal_all(group, signal.SIGKILL)
        deadline = time.monotonic() + RECORD_WAIT_S
        while (
            left() or any(self.launcher.is_same_process(h) for h, _ in unknown)
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        for handle, record in unknown:
            message = (
                f"process {handle.pid} of workload {handle.workload_id} was running, but the "
                f"store had it {'as ' + record.phase if record is not None else 'not at all'} "
                "(emptied or replaced store?); stopped before any GPU was handed out"
            )
            with contextlib.suppress(Exception):
                self.store.record_event(
                    record.id if record is not None else None,
                    "stopped-unknown",
                    "unknown to the store",
                    message,
                )

    def _unknown_cgroups(self) -> list[Path]:
        """The workload cgroups of this service's freezer (cgroup v2) that hold processes
        but belong to no workload it watches: what is left of workloads it does not know,
        also processes that left their process group (``setsid``)."""
        freezer = getattr(self.enforcement.governor, "freezer", None)
        inner = getattr(freezer, "inner", freezer)
        if not isinstance(inner, CgroupFreezer):
            return []
        watched = {inner.path(h).name for h in self._handles.values()}
        # the cgroup each watched workload started in (the wrapper joined it before the
        # command), also before the governor has adopted it again after a restart
        watched |= {name for h in self._handles.values() if (name := _cgroup_name(h.pgid))}
        try:
            children = sorted(p for p in inner.root.iterdir() if p.is_dir())
        except OSError:
            return []
        return [g for g in children if g.name not in watched and CgroupFreezer.pids_in(g)]

    def _recover_suspended(self, record: WorkloadRecord) -> None:
        """A workload suspended before the restart: watched again while its processes live
        (the driver holds them checkpointed), else pending from scratch."""
        handle = self._find_process(record)
        if handle is not None and self.launcher.is_same_process(handle):
            self.store.record_event(
                record.id,
                "readopted",
                "service restart",
                f"suspended process {handle.pid} still there; watched again after the restart",
            )
            self._watch(handle)
            return
        if handle is not None:
            self.launcher.signal(handle, signal.SIGKILL)
        self._tracked.drop_suspension(record.id, "its suspended process did not survive")

    def _recorded_exit(
        self, record: WorkloadRecord, handle: ProcessHandle | None
    ) -> tuple[ExitRecord, float] | None:
        """How the workload's last run ended, from the wrapper's exit record, and when (the
        record's modification time), whatever the service had saved: also when the service
        died before it saved the process handle. A record older than the run's start
        (``started_at``) is an earlier run's (the launcher removes it at each launch, so one
        is left only when the service died between recording the start and launching) and
        does not count. None when nothing says how it ended."""
        path = handle.exit_path if handle is not None else self._exit_path(record.id)
        exit_record = self.launcher.exit_record_at(path)
        if exit_record is None:
            return None
        try:
            written = path.stat().st_mtime
        except OSError:
            return None
        if record.started_at is not None and written < record.started_at:
            log.warning("workload %s: the exit record %s is an earlier run's", record.id, path)
            return None
        return exit_record, written

    def _find_process(self, record: WorkloadRecord) -> ProcessHandle | None:
        """The workload's process handle: the saved one, or, when that one is missing or
        dead, a live wrapper found by its command line (an agent killed between starting it
        and saving its handle); the latter is saved and attached to the record."""
        path = self._handle_path(record.id)
        handle = None
        if path.is_file():
            with contextlib.suppress(ValueError, KeyError, OSError):
                handle = ProcessHandle.from_dict(json.loads(path.read_text()))
        if handle is not None and self.launcher.is_same_process(handle):
            return handle
        found = self.launcher.find(record.id, self.log_dir)
        if found is None:
            return handle
        log.info("found the unrecorded process of workload %s", record.id)
        self._save_handle(found)
        if record.pid is None:
            self._tracked.attach_process(
                record.id,
                found.pid,
                found.create_time,
                stdout_path=str(found.stdout_path),
                stderr_path=str(found.stderr_path),
            )
        return found


def _cgroup_name(pid: int) -> str | None:
    """The last part of ``pid``'s cgroup v2 path (``0::/fgpu/.../NAME``), or None."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::") and line[3:].strip("/"):
            return line[3:].rstrip("/").rsplit("/", 1)[-1]
    return None


def _signal_all(group: Path, sig: int) -> None:
    """Send ``sig`` to every process in cgroup ``group``."""
    for pid in CgroupFreezer.pids_in(group):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


__all__ = ["Recovery"]
