"""Suspend to host memory and restore (issue 28; part of :class:`fgpu.server.service.Service`).

The decision core says :class:`~fgpu.sched.workload.Suspend` (a victim's GPU memory goes to
host memory so that a preemptor can run) and :class:`~fgpu.sched.workload.Restore` (it comes
back). The service acts through :class:`fgpu.agent.checkpoint.Suspender`: the CUDA driver's
checkpoint API (lock, checkpoint: device memory to host memory, GPU memory freed) and a
``SIGSTOP`` of the workload's process group; restore is the reverse. What is recorded comes
first, as for every action (DESIGN.md section 8):

- suspend: ``stopping`` (the core sees the victim terminating, its share still held), the
  checkpoint and freeze, then ``suspended`` (pending, suspended on its node, holding host
  memory; the event gives the device-to-host copy time): the share is free from then on. A
  checkpoint that fails (no CUDA process, a driver error) is an event ``suspend-failed`` and
  the victim is evicted as before.
- restore: ``restoring`` (running again on the core's allocation), the thaw and restore,
  then an event ``restored`` with the host-to-device copy time. A driver that restores onto
  other GPUs (CUDA 13, ``CheckpointDriver.can_remap``: the fake driver too) makes the
  machine's nodes say ``restore_other_gpus``: the core may then offer any GPUs of the node's
  model, and the restore passes the GPU pairs (the GPUs its memory was checkpointed from ->
  the ones offered; the events say the move); the interposer's segment is renamed to the
  new GPUs before, and the allocation (hence memory guard and governor) follows with
  ``restoring``. An older driver restores onto the same GPUs only: the core offers only
  those (``Workload.suspended_gpus``). A GPU without room yet (``CUDA_ERROR_OUT_OF_MEMORY``)
  puts it back to suspended for a later round; a process that is gone, or an allocation on
  other GPUs that the driver cannot take, evicts it (pending from scratch).
- a suspended workload cancelled ends at once (the store's ``cancel``); its frozen
  processes are killed. One whose processes end while suspended fails.
- after a restart of the service, a suspended workload whose processes live is watched again
  and stays suspended (the driver holds it checkpointed); one whose processes are gone is
  pending from scratch. Not handled: a restart in the middle of a restore onto other GPUs
  (the GPU pairs are not stored): the restore is finished without pairs, onto the GPUs
  the memory came from, while the record names the new ones.

The capability (:func:`fgpu.agent.checkpoint.probe` on the driver the workloads use) decides
whether workloads are ``suspendable`` for the core. ``fgpu_gpu_seconds_lost_total{queue,
reason}`` counts GPU-seconds lost to evictions (``preempt``, ``reclaim``: the run since its
latest start) and spent copying (``suspend``, ``restore``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from fgpu.agent.checkpoint import (
    CheckpointDriver,
    CheckpointError,
    CheckpointUnsupportedError,
    Suspender,
    probe,
)
from fgpu.agent.governor.freezer import SignalFreezer
from fgpu.agent.interposer.preload import fake_gpus_spec
from fgpu.agent.process import ProcessHandle, group_pids
from fgpu.model.types import InvalidRequestError
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import Restore, Suspend
from fgpu.server.processes import ProcessControl
from fgpu.store.errors import NotFound, StoreConflict
from fgpu.store.records import FAILED, WorkloadRecord

log = logging.getLogger("fgpu.server")

FREEZE_TIMEOUT_S = 30.0
"""How long a suspended workload's processes get to stop after ``SIGSTOP``."""


DEFAULT_SUSPEND_HOST_MEMORY = "25%"
"""``fgpu serve --suspend-host-memory`` by default: a quarter of the machine's RAM."""


def suspend_budget_mib(text: str, ram_mib: int) -> int:
    """``--suspend-host-memory``: ``"25%"`` (of ``ram_mib``), ``"64GiB"``, ``"4096"`` (MiB),
    or ``"0"`` (suspend off), in MiB.

    Raises:
        ValueError: not a percentage in 0..100 or a memory size, or more than the RAM (the
            message names the flag, the value and why).
    """
    flag = "--suspend-host-memory"
    raw = text.strip()
    if raw.endswith("%"):
        try:
            percent = float(raw[:-1])
        except ValueError:
            percent = -1.0
        if not 0 <= percent <= 100:
            raise ValueError(f"{flag}: {text!r} is not a percentage of the RAM in 0..100%")
        return int(ram_mib * percent / 100)
    if raw in ("0", "0MiB", "0GiB"):
        return 0
    from fgpu.model.units import UnitError, parse_memory_mib

    try:
        mib = parse_memory_mib(raw, flag)
    except UnitError as exc:
        raise ValueError(
            f"{flag}: {text!r} is not a size (e.g. 64GiB), a percentage of the RAM (25%) or 0 "
            f"(off): {exc}"
        ) from None
    if mib > ram_mib:
        raise ValueError(f"{flag}: {text!r} is more than this machine's {ram_mib} MiB of RAM")
    return mib


class Suspension(ProcessControl):
    """Part of :class:`fgpu.server.service.Service`: suspend and restore.

    Args (beyond :class:`~fgpu.server.core.ServiceCore`'s):
        checkpoint: the checkpoint API to use; None (default): probed on the workloads'
            driver (:meth:`_workload_driver`); False: suspend off.
    """

    def __init__(
        self, *args: Any, checkpoint: CheckpointDriver | bool | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        driver: CheckpointDriver | None = None
        if checkpoint is False:
            note = "off by configuration"
        elif not any(n.suspend_host_memory_mib for n in self.machine.nodes):
            note = "no host memory for suspended work (--suspend-host-memory 0)"
        elif isinstance(checkpoint, CheckpointDriver):
            driver, note = checkpoint, ""
        else:
            driver, note = self._workload_driver()
        self._suspender = (
            None
            if driver is None
            else Suspender(driver, freeze=self._freeze_suspended, thaw=self._thaw_suspended)
        )
        self.suspend_note = "on" if driver is not None else f"off: {note}"
        self._stopper = SignalFreezer()
        self._busy: set[str] = set()  # suspends and restores under way
        self._workloads_suspendable = driver is not None
        # GPUs each suspended workload's memory was checkpointed from, while this service
        # knows better than its record (a restore onto other GPUs that failed for room)
        self._checkpointed_on: dict[str, tuple[str, ...]] = {}
        if driver is None:
            log.info("suspend to host memory: off (%s)", note)
        elif driver.can_remap:  # CUDA 13: a restore may go onto other GPUs of the model
            self._set_remapping(True)
            self.suspend_note = "on (restores onto any GPU of the same model)"

    def _workload_driver(self) -> tuple[CheckpointDriver | None, str]:
        """The checkpoint API of the driver the workloads use: the fake driver's (its state
        file set in this process's environment first), the real ``libcuda.so.1`` on NVML
        GPUs, none on plain simulated GPUs."""
        fake = self.fake_driver
        if fake is not None:
            os.environ.setdefault("FGPU_FAKE_GPU_STATE", str(fake.state_file))
            os.environ.setdefault("FGPU_FAKE_GPUS", fake_gpus_spec(fake.gpus))
            return probe(str(fake.driver_dir / "libcuda.so.1"))
        if self.backend.kind == "nvml":
            return probe("libcuda.so.1")
        return None, "simulated GPUs have no CUDA driver (try --fake-driver)"

    @property
    def suspendable(self) -> bool:
        """Whether the workloads' driver has the checkpoint API."""
        return self._suspender is not None

    # ----------------------------------------------------------------- freezing
    def _freeze_suspended(self, workload_id: str) -> None:
        handle = self._handles.get(workload_id)
        if handle is not None:
            self._stopper.freeze(handle)
            if not self._stopper.wait_frozen(handle, FREEZE_TIMEOUT_S):
                log.warning("workload %s: not all its processes stopped", workload_id)

    def _thaw_suspended(self, workload_id: str) -> None:
        handle = self._handles.get(workload_id)
        if handle is not None:
            self._stopper.thaw(handle)

    def _pids(self, handle: ProcessHandle) -> Sequence[int]:
        return group_pids(handle)

    def _in_background(self, name: str, target: Callable[..., None], *args: object) -> None:
        def run() -> None:
            try:
                target(*args)
            except Exception:  # keep serving; the error is a bug to fix, not to hide
                log.exception("%s failed", name)

        threading.Thread(target=run, name=name, daemon=True).start()

    def _stop_if_held(self, workload_id: str, reason: str) -> None:
        """Stop (evict) ``workload_id`` if it still holds its allocation."""
        try:
            holds = self.store.get(workload_id).holds_allocation
        except NotFound:
            return
        if holds:
            self._stop(workload_id, reason)

    # ----------------------------------------------------------------- suspend
    def _suspend(self, action: Suspend) -> None:
        """Act on the core's Suspend (in the round, under the service lock)."""
        victim = action.victim
        if victim in self._busy:
            return
        record = self.store.get(victim)
        handle = self._handles.get(victim)
        if self._suspender is None or handle is None or record.cancelled_by is not None:
            why = "no checkpoint API" if self._suspender is None else "no process to suspend"
            self._evict_instead(
                victim, f"{action.reason} (not suspended: {why})", action.kind, action.preemptor
            )
            return
        if record.stop_requested_at is None:
            self._tracked.mark_stopping(victim, f"suspending: {action.reason}")
        self._busy.add(victim)
        self.enforcement.before_signal(victim)  # a governor-frozen process cannot answer
        self._in_background(f"fgpu-suspend-{victim}", self._do_suspend, action, handle)

    def _do_suspend(self, action: Suspend, handle: ProcessHandle) -> None:
        victim = action.victim
        assert self._suspender is not None
        try:
            report = self._suspender.suspend(victim, self._pids(handle))
        except (CheckpointError, ValueError, OSError) as exc:
            with self._lock:
                self._busy.discard(victim)
                self._evict_instead(
                    victim,
                    f"{action.reason} (suspend failed: {exc})",
                    action.kind,
                    action.preemptor,
                )
            self.wake()
            return
        with self._lock:
            self._busy.discard(victim)
            try:
                record = self._tracked.mark_suspended(
                    victim, action.host_memory_mib, action.reason, copy_s=report.copy_s
                )
            except (StoreConflict, NotFound, InvalidRequestError) as exc:
                # cancelled meanwhile: its processes go (a locked process dies on SIGKILL)
                log.info("workload %s: not suspended (%s); stopping it", victim, exc)
                self._stop_if_held(victim, f"stopped: {exc}")
                return
            self.metrics.events.lost(
                record.queue, "suspend", self._copy_cost(record, report.copy_s)
            )
            self.metrics.events.preempted(action.kind)
        self._enforce()  # the governor lets go of it before it is stopped
        self.wake()

    def _copy_cost(self, record: WorkloadRecord, copy_s: float) -> float:
        gpus = sum(record.allocation.gpu_milli) / 1000.0 if record.allocation else 0.0
        return gpus * copy_s

    def _evict_instead(self, victim: str, reason: str, kind: str, preemptor: str) -> None:
        """Suspend is not possible: say so, then stop the victim as an eviction."""
        with contextlib.suppress(StoreConflict, InvalidRequestError):
            self.store.record_event(victim, "suspend-failed", reason, f"evicting: {reason}")
        self._evict_kinds[victim] = kind
        self._evict_by[victim] = preemptor
        self._stop_if_held(victim, reason)
        self.metrics.events.preempted(kind)

    # ----------------------------------------------------------------- restore
    def _restore(self, action: Restore) -> None:
        """Act on the core's Restore (in the round, under the service lock)."""
        workload_id = action.workload
        if workload_id in self._busy:
            return
        record = self.store.get(workload_id)
        if not record.is_suspended:
            return
        handle = self._handles.get(workload_id)
        node = action.allocation.node_name
        uuids = tuple(self.machine.uuids(node, action.allocation.gpus))
        recorded = record.allocation.gpu_uuids if record.allocation is not None else ()
        before = self._checkpointed_on.get(workload_id, tuple(recorded))
        if self._suspender is None or handle is None:
            self._drop(workload_id, handle, "its suspended process is gone")
            return
        pairs: tuple[tuple[str, str], ...] = ()
        if before != uuids:
            remap = self._suspender.driver.can_remap and self._node_remaps(node)
            if not remap or len(before) != len(uuids):
                self._drop(
                    workload_id,
                    handle,
                    f"restore offered GPUs {', '.join(uuids)}, but its memory was checkpointed "
                    f"from {', '.join(before)}; the driver restores onto those",
                )
                return
            pairs = tuple(zip(before, uuids, strict=True))
        self._checkpointed_on[workload_id] = before
        reason = action.reason
        if pairs:
            moves = ", ".join(f"{old} -> {new}" for old, new in pairs if old != new)
            reason = f"{reason}; onto other GPUs than it was suspended from ({moves})"
        self._tracked.mark_restored(workload_id, action.allocation, uuids, reason)
        self._busy.add(workload_id)
        self._in_background(f"fgpu-restore-{workload_id}", self._do_restore, record, handle, pairs)

    def _node_remaps(self, node: str) -> bool:
        return any(n.name == node and n.restore_other_gpus for n in self.machine.nodes)

    def _stop_remapping(self, node: str, why: str) -> None:
        """The driver refused a restore onto other GPUs of ``node``: its suspended workloads
        are restored onto the GPUs they were suspended from from now on (the core is told
        ``restore_other_gpus`` False for it; their checkpointed GPUs stay known)."""
        if not self._node_remaps(node):
            return
        log.warning(
            "restores on %s go back onto their own GPUs: the driver refused a move (%s)", node, why
        )
        self._set_remapping(False, node)

    def _set_remapping(self, on: bool, node: str | None = None) -> None:
        """Tell the core whether restores on ``node`` (None: every node) may go onto other
        GPUs of its model (``Node.restore_other_gpus``)."""
        self.machine = replace(
            self.machine,
            nodes=tuple(
                replace(n, restore_other_gpus=on) if node in (None, n.name) else n
                for n in self.machine.nodes
            ),
        )
        self._empty = ClusterState(self.machine.nodes)

    def checkpointed_gpus(self, workload_id: str, node: str) -> tuple[int, ...] | None:
        """The GPU indices on ``node`` that suspended ``workload_id``'s memory was
        checkpointed from, where this service knows them better than its record (a restore
        onto other GPUs that failed); None otherwise."""
        uuids = self._checkpointed_on.get(workload_id)
        if not uuids:
            return None
        index = {d.uuid: i for i, d in enumerate(self.machine.devices.get(node, ()))}
        if any(u not in index for u in uuids):
            return None
        return tuple(index[u] for u in uuids)

    def _do_restore(
        self,
        record: WorkloadRecord,
        handle: ProcessHandle,
        pairs: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Restore in the background; ``pairs``: (old, new) GPU UUIDs when it goes onto other
        GPUs (the interposer's segment is renamed to the new GPUs first: the processes are
        frozen, and each keeps its device ordinals, now standing for the new GPUs)."""
        workload_id = record.id
        assert self._suspender is not None
        moved = any(old != new for old, new in pairs)
        try:
            if moved:
                self.enforcement.move_gpus(workload_id, [new for _, new in pairs])
            report = self._suspender.restore(
                workload_id, self._pids(handle), list(pairs) if moved else None
            )
        except (CheckpointError, CheckpointUnsupportedError, ValueError) as exc:
            if moved:  # still checkpointed from the old GPUs
                self.enforcement.move_gpus(workload_id, [old for old, _ in pairs])
            with self._lock:
                self._busy.discard(workload_id)
                try:
                    out_of_memory = isinstance(exc, CheckpointError) and exc.out_of_memory
                    remap_refused = moved and isinstance(exc, CheckpointError)
                    if not out_of_memory and not remap_refused:
                        raise StoreConflict(f"restore failed: {exc}")
                    why = f"restore failed, its GPU lacks room ({exc}); trying again later"
                    if not out_of_memory:  # the driver would not move it: back to its GPUs
                        node = record.suspended_on or ""
                        self._stop_remapping(node, str(exc))
                        why = (
                            f"the driver refused to restore it onto other GPUs ({exc}); it "
                            f"waits for the GPUs it was suspended from, and restores on {node} "
                            "go back onto their own GPUs from now on"
                        )
                    self._tracked.mark_suspended(  # suspended again: a later round retries
                        workload_id, record.suspended_host_mib, why, copy_s=0.0
                    )
                except StoreConflict as why:  # another error, or cancelled meanwhile
                    self._stop_if_held(workload_id, str(why))
            self.wake()
            return
        with self._lock:
            self._busy.discard(workload_id)
            self._checkpointed_on.pop(workload_id, None)
            onto = (
                " onto GPUs " + ", ".join(f"{new} (was {old})" for old, new in pairs if old != new)
                if moved
                else ""
            )
            self.store.record_event(
                workload_id,
                "restored",
                "restored",
                f"restored from host memory{onto}: host-to-device copy {report.copy_s:.3f} s "
                f"({len(report.pids)} CUDA process(es), {report.total_s:.3f} s in all)",
            )
            current = self.store.get(workload_id)
            self.metrics.events.lost(
                current.queue, "restore", self._copy_cost(current, report.copy_s)
            )
        self._enforce()
        self.wake()

    def _drop(self, workload_id: str, handle: ProcessHandle | None, reason: str) -> None:
        """A suspended workload that cannot be restored: its processes are killed, it is
        pending from scratch."""
        if handle is not None:
            self._stopper.thaw(handle)
            self.launcher.signal(handle, signal.SIGKILL)
        self._checkpointed_on.pop(workload_id, None)
        self._tracked.drop_suspension(workload_id, reason)

    def _finish_interrupted_restore(self, record: WorkloadRecord, handle: ProcessHandle) -> None:
        """After a restart: a running workload whose processes are still checkpointed or
        locked (the service died during its restore) is restored now."""
        if self._suspender is None or record.id in self._busy:
            return
        try:
            states = {self._suspender.driver.state(pid) for pid in self._pids(handle)}
        except CheckpointError as exc:
            log.warning("workload %s: checkpoint state unreadable: %s", record.id, exc)
            return
        if states & {"checkpointed", "locked"}:
            log.info("workload %s: finishing the restore a restart interrupted", record.id)
            self._busy.add(record.id)
            self._in_background(f"fgpu-restore-{record.id}", self._do_restore, record, handle)

    # ----------------------------------------------------------------- ends
    def _kill_suspended(self, record: WorkloadRecord) -> None:
        """A suspended workload was cancelled: its frozen processes are killed."""
        handle = self._handles.get(record.id)
        if handle is not None:
            self._stopper.thaw(handle)
            self.launcher.signal(handle, signal.SIGKILL)

    def _suspended_exit(self, record: WorkloadRecord, why: str | None) -> None:
        """The processes of a suspended workload ended: it fails."""
        self._tracked.end_suspended(
            record.id, FAILED, f"its processes ended while suspended ({why or 'unknown'})"
        )


__all__ = [
    "DEFAULT_SUSPEND_HOST_MEMORY",
    "FREEZE_TIMEOUT_S",
    "Suspension",
    "suspend_budget_mib",
]
