"""Starting, stopping and watching the workloads' processes, and recording how they ended
(part of :class:`fgpu.server.service.Service`).

A placement is recorded before the launch; a stop is recorded before the signal (SIGTERM to
the process group, SIGKILL after the grace period); each process is watched through a Linux
pidfd, and its exit is recorded as succeeded, failed, cancelled or preempted (back to
pending)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import signal
import time
from pathlib import Path

from fgpu.agent.hostlimits import OUT_OF_HOST_MEMORY
from fgpu.agent.interposer.segment import SegmentError
from fgpu.agent.launcher import LaunchError, LaunchSpec
from fgpu.agent.process import ProcessHandle, ProcessState, ProcessStatus, group_members
from fgpu.model.types import Allocation
from fgpu.rules.slurm import array_task_env
from fgpu.server.core import ServiceCore
from fgpu.server.output_limits import Running
from fgpu.store.errors import NotFound, StoreUnwritable
from fgpu.store.records import CANCELLED, FAILED, SUCCEEDED, StoredMigInstance, WorkloadRecord

log = logging.getLogger("fgpu.server")


class ProcessControl(ServiceCore):
    """Part of :class:`fgpu.server.service.Service`: the workloads' processes."""

    def _start(
        self,
        workload_id: str,
        allocation: Allocation,
        *,
        mig: StoredMigInstance | None = None,
        reason: str = "placed",
    ) -> None:
        """Record the placement, then launch (on a MIG instance: the instance's uuid is what
        the workload sees as its GPU)."""
        record = self.store.get(workload_id)
        if mig is None:
            uuids = self.machine.uuids(allocation.node_name, allocation.gpus)
            visible = uuids
        else:
            uuids, visible = [mig.gpu_uuid], [mig.uuid]
        self._tracked.mark_running(workload_id, allocation, gpu_uuids=uuids, mig=mig, reason=reason)
        env = dict(record.env)
        env.update(array_task_env(record.array))  # FGPU_ARRAY_INDEX and Slurm's names
        run_as = record.owner_uid if os.geteuid() == 0 and record.owner_uid != 0 else None
        if mig is None:
            try:
                env.update(
                    self.enforcement.launch_env(
                        uuids,
                        allocation.gpu_milli,
                        allocation.gpu_memory_mib,
                        record.env,
                        workload_id=workload_id,
                        uid=run_as,
                    )
                )
            except (SegmentError, OSError) as exc:
                self._tracked.mark_finished(
                    workload_id, FAILED, reason=f"could not prepare its GPU limits: {exc}"
                )
                return
        try:
            limits = self.host_limits.prepare(
                workload_id,
                cpu_milli=record.request.cpu_milli,
                memory_mib=record.request.memory_mib,
            )
        except OSError as exc:
            self._tracked.mark_finished(
                workload_id, FAILED, reason=f"could not set its host limits: {exc.strerror}"
            )
            return
        cut = self.output.before_launch(
            Running(workload_id, record.owner_uid, record.queue), self._queue_output_limit(record)
        )
        if cut is not None:
            log.info("output of %s dropped from its start: %s", workload_id, cut)
        spec = LaunchSpec(
            workload_id=workload_id,
            argv=list(record.argv),
            log_dir=self.log_dir,
            shell=record.shell,
            cwd=record.cwd,
            env=env,
            uid=run_as,
            gpu_uuids=visible,
            compute_milli=allocation.gpu_milli[0] if allocation.gpu_milli else 0,
            memory_mib=allocation.gpu_memory_mib[0] if allocation.gpu_memory_mib else 0,
            agent_socket=str(self.enforcement.socket or ""),
            limits=limits,
        )
        try:
            handle = self.launcher.launch(spec)
        except LaunchError as exc:  # the launcher killed what it had started
            if limits is not None:
                self.host_limits.discard(limits)
            self._tracked.mark_finished(workload_id, FAILED, reason=f"could not launch: {exc}")
            return
        except Exception as exc:  # never leave a placement without a process
            self._end_cgroups(workload_id)  # nor a process without a placement
            if limits is not None:
                self.host_limits.discard(limits)
            log.exception("launching %s failed", workload_id)
            self._tracked.mark_finished(
                workload_id, FAILED, reason=f"could not launch: {type(exc).__name__}: {exc}"
            )
            return
        try:
            self._save_handle(handle)
            self._tracked.attach_process(
                workload_id,
                handle.pid,
                handle.create_time,
                stdout_path=str(handle.stdout_path),
                stderr_path=str(handle.stderr_path),
            )
        except Exception as exc:  # an untracked process must not keep the GPU
            log.exception("recording the process of %s failed; stopping it", workload_id)
            with contextlib.suppress(Exception):
                self.launcher.terminate(handle, 0.0)
            self._end_cgroups(workload_id)
            why = f"could not record its process: {type(exc).__name__}: {exc}"
            try:
                self._tracked.mark_finished(workload_id, FAILED, reason=why)
            except Exception as again:  # the store cannot write: kept for later
                self._keep_end(workload_id, None, why, self.clock(), again)
            return
        self._watch(handle)
        self._enforce()

    @property
    def running_processes(self) -> int:
        """How many workload processes the service watches now."""
        return len(self._handles)

    def _stop(self, workload_id: str, reason: str, *, now: bool = False) -> None:
        """Record the stop, then signal the process (grace period, then SIGKILL; with
        ``now``, SIGKILL at once, also to a stop already under way).

        The grace period runs from the recorded stop request, also across a restart of the
        service (a stop resumed by recovery waits only what is left of it).
        """
        record = self.store.get(workload_id)
        if record.stop_requested_at is None and record.holds_allocation:
            record = self._freeing(lambda: self._tracked.mark_stopping(workload_id, reason))
        # else already ended in the store (a damaged row an admin ended): only the process
        # is left to stop, and its end finds the row ended
        handle = self._handles.get(workload_id)
        if now and handle is not None:  # the wrapper then empties the workload's cgroup
            self.enforcement.before_signal(workload_id)  # a frozen group could not die
            self.launcher.signal(handle, signal.SIGKILL)
            return
        if handle is None or self._loop is None or workload_id in self._terminating:
            return  # a stop already under way keeps its own clock (no second SIGTERM)
        self._terminating.add(workload_id)
        self.enforcement.before_signal(workload_id)  # a frozen workload could not exit
        asked = record.stop_requested_at if record.stop_requested_at is not None else self.clock()
        grace = max(0.0, record.grace_s - max(0.0, self.clock() - asked))
        future = asyncio.run_coroutine_threadsafe(
            self.launcher.terminate_async(handle, grace), self._loop
        )

        def done(f: concurrent.futures.Future[ProcessState]) -> None:
            self._terminating.discard(workload_id)
            f.exception()

        future.add_done_callback(done)

    # ------------------------------------------------------------ process watching
    def _watch(self, handle: ProcessHandle) -> None:
        """Call :meth:`_exited` when the workload's wrapper process ends (pidfd)."""
        self._handles[handle.workload_id] = handle
        loop = self._loop
        if loop is None:
            return
        try:
            fd = os.pidfd_open(handle.pid)
        except ProcessLookupError:
            loop.call_soon_threadsafe(self._exited_soon, handle.workload_id)
            return

        def add() -> None:
            self._pidfds[handle.workload_id] = fd
            loop.add_reader(fd, self._exited_soon, handle.workload_id)

        loop.call_soon_threadsafe(add)

    def _exited_soon(self, workload_id: str) -> None:
        fd = self._pidfds.pop(workload_id, None)
        if fd is not None and self._loop is not None:
            self._loop.remove_reader(fd)
            os.close(fd)
        if self.stopping:  # the next start reads its exit record (recovery)
            return
        task = asyncio.ensure_future(asyncio.to_thread(self._exited, workload_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _exited(self, workload_id: str) -> None:
        """Record how a workload's process ended and wake the loop."""
        handle = self._handles.get(workload_id)
        if handle is None:
            return
        state = self.launcher.poll(handle)
        deadline = time.monotonic() + 5.0
        while state.status is ProcessStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)  # the wrapper is gone; its group's last members are exiting
            state = self.launcher.poll(handle)
        reason = state.reason
        group: set[int] = set()
        if state.status is ProcessStatus.LOST and self.launcher.signal(handle, signal.SIGKILL):
            # the wrapper died (killed from outside); what it ran must not keep the GPU
            reason = f"{reason}; its remaining processes were killed"
            # killed, maybe not yet out of the cgroup (zombies included)
            group = {member.pid for member in group_members(handle.pgid)}
        # The wrapper empties and removes the workload's cgroups before it records the exit;
        # one killed from outside could not: nothing it started may outlive the share
        # (also what left its process group, setsid), so that is done here.
        escaped = [pid for pid in self._end_cgroups(workload_id) if pid not in group]
        if escaped and state.status is ProcessStatus.LOST:
            reason = f"{reason}; {len(escaped)} process(es) outside its process group were killed"
        with self._lock:
            self._handles.pop(workload_id, None)
            try:
                self._freeing(lambda: self._record_end(workload_id, state.exit_code, reason))
            except Exception as exc:  # kept, with its time, and written once the store can
                self._keep_end(workload_id, state.exit_code, reason, self.clock(), exc)
                return
        self._enforce()
        self.wake()

    def _end_cgroups(self, workload_id: str) -> list[int]:
        """Kill what is left in the workload's cgroups and remove them
        (:meth:`fgpu.agent.hostlimits.HostLimiter.end_workload`); the pids killed, logged."""
        try:
            killed = self.host_limits.end_workload(workload_id)
        except OSError as exc:
            log.error("could not empty the cgroups of workload %s: %s", workload_id, exc)
            return []
        if killed:
            log.warning(
                "workload %s left %d process(es) in its cgroup after its end (pids %s); killed",
                workload_id,
                len(killed),
                " ".join(map(str, killed[:20])),
            )
        return killed

    def _keep_end(
        self, workload_id: str, code: int | None, why: str | None, at: float, exc: Exception
    ) -> None:
        """Keep an end the store could not take (:meth:`_flush_exits` writes it later): the
        workload keeps its share meanwhile, as the store still has it running."""
        if workload_id not in self._unrecorded:
            cause = (
                exc.cause if isinstance(exc, StoreUnwritable) else f"{type(exc).__name__}: {exc}"
            )
            log.error(
                "the end of workload %s (exit code %s) could not be recorded: %s; kept, and "
                "recorded once the store can write",
                workload_id,
                code,
                cause,
            )
        self._unrecorded[workload_id] = (code, why, at)

    def _flush_exits(self) -> int:
        """Record the ends kept while the store could not write, oldest first; stops at the
        first that still fails. Returns how many were recorded."""
        done = 0
        with self._lock:
            for workload_id, (code, why, at) in sorted(
                self._unrecorded.items(), key=lambda item: item[1][2]
            ):
                try:
                    self._freeing(functools.partial(self._record_end, workload_id, code, why, at))
                except Exception as exc:
                    self._keep_end(workload_id, code, why, at, exc)
                    break
                del self._unrecorded[workload_id]
                log.info("recorded the kept end of workload %s", workload_id)
                done += 1
        if done:
            self._enforce()
            self.wake()
        return done

    def _record_end(
        self, workload_id: str, code: int | None, why: str | None, at: float | None = None
    ) -> None:
        """Record how a running workload's process ended (``at``: when, if known; else
        now)."""
        try:
            record = self.store.get(workload_id)
        except NotFound:
            return
        if record.is_suspended:
            self._tracked.end_suspended(
                workload_id,
                FAILED,
                f"its processes ended while suspended ({why or f'exit code {code}'})",
            )
            return
        if record.phase not in ("running", "paused"):
            return
        code = shell_exit_code(code)
        # read, and forgotten only once written: a write that fails is tried again
        over_quota = self._fail_reasons.get(workload_id)
        if over_quota is not None:
            self._tracked.mark_finished(
                workload_id, FAILED, exit_code=code, reason=over_quota, finished_at=at
            )
            self._fail_reasons.pop(workload_id, None)
        elif record.cancelled_by is not None:
            self._tracked.mark_finished(
                workload_id, CANCELLED, exit_code=code, reason=record.reason, finished_at=at
            )
        elif record.stop_requested_at is not None:
            kind = self._evict_kinds.get(workload_id, "preemption")
            by = self._evict_by.get(workload_id)
            self._tracked.mark_preempted(
                workload_id, record.reason or "preempted", None if by is None else (by, kind)
            )
            self._evict_kinds.pop(workload_id, None)
            self._evict_by.pop(workload_id, None)
            ended = at if at is not None else self.clock()
            self.metrics.events.lost(record.queue, kind, gpu_seconds(record, ended))
        elif code == 0:
            self._tracked.mark_finished(
                workload_id, SUCCEEDED, exit_code=0, reason="exit code 0", finished_at=at
            )
        elif code is None:
            self._tracked.mark_finished(
                workload_id, FAILED, reason=why or "ended without an exit code", finished_at=at
            )
        elif why is not None and why.startswith(OUT_OF_HOST_MEMORY):
            self._tracked.mark_finished(
                workload_id,
                FAILED,
                exit_code=code,
                reason=f"{why}; exit code {code}",
                finished_at=at,
            )
        else:
            detail = f"exit code {code}" + (f" ({why})" if why else "")
            self._tracked.mark_finished(
                workload_id, FAILED, exit_code=code, reason=detail, finished_at=at
            )

    def _queue_output_limit(self, record: WorkloadRecord) -> int | None:
        """The per-user output limit of ``record``'s queue (None: none, or no such queue)."""
        queue = self._queue_records().get(record.queue)  # read once per queue change
        return None if queue is None else queue.config.max_output_bytes

    def _handle_path(self, workload_id: str) -> Path:
        return self.log_dir / workload_id / "handle.json"

    def _exit_path(self, workload_id: str) -> Path:
        """Where the launcher's wrapper records the workload's exit (see
        :class:`fgpu.agent.launcher.Launcher`)."""
        return self.log_dir / workload_id / "exit.json"

    def _save_handle(self, handle: ProcessHandle) -> None:
        path = self._handle_path(handle.workload_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(handle.to_dict()))
        os.replace(tmp, path)


def gpu_seconds(record: WorkloadRecord, until: float) -> float:
    """GPU-seconds of the record's run from its latest start to ``until`` (GPUs as the sum
    of its compute shares; 0 without an allocation or start)."""
    if record.allocation is None or record.started_at is None:
        return 0.0
    gpus = sum(record.allocation.gpu_milli) / 1000.0
    return gpus * max(0.0, until - record.started_at)


def shell_exit_code(code: int | None) -> int | None:
    """An exit status as shells report it: a process ended by signal N (``-N`` from
    :mod:`subprocess`) is ``128 + N`` (143 for SIGTERM, 137 for SIGKILL)."""
    if code is not None and code < 0:
        return 128 - code
    return code


__all__ = ["ProcessControl", "gpu_seconds", "shell_exit_code"]
