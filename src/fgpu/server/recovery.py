"""Restart safety (part of :class:`fgpu.server.service.Service`): each workload the store
has as running is re-adopted when its process still lives (pid and start time match, see
:meth:`fgpu.agent.launcher.Launcher.is_same_process`); when its process ended while the
service was down and left its exit record, the recorded outcome is kept; otherwise it is
marked failed, "lost while the service was down"."""

from __future__ import annotations

import contextlib
import json
import logging
import signal

from fgpu.agent.process import ProcessHandle
from fgpu.agent.runner import ExitRecord
from fgpu.model.types import InvalidRequestError
from fgpu.sched.state import ClusterState
from fgpu.server.suspending import Suspension
from fgpu.store.records import LOST_REASON, WorkloadRecord

log = logging.getLogger("fgpu.server")


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


__all__ = ["Recovery"]
