"""The scheduling loop (part of :class:`fgpu.server.service.Service`): each round reads the
active workloads from the mirror, asks the decision core
(:class:`fgpu.sched.decide.Scheduler`) and acts on its decision; then the MIG pass places
the pending MIG workloads on their instances (:class:`fgpu.server.mig_pool.MigPool`). The
loop wakes on submissions, cancellations, queue changes and process exits, and on a slow
tick for the time-based rules (``min_runtime``, aging, reservation)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from fgpu.sched.budget import QueueBudget
from fgpu.sched.decide import Decision, OutsideUse, allocation_resources
from fgpu.sched.rounds import state_with, target_for, target_key
from fgpu.sched.workload import (
    NON_PREEMPTIBLE_FROM,
    Place,
    Preempt,
    Resources,
    Restore,
    Squeeze,
    Suspend,
    Unsqueeze,
    Wait,
    Workload,
)
from fgpu.server.fdbudget import launch_shortfall
from fgpu.server.jobrules import JobRules
from fgpu.server.mig_pool import MigCandidate
from fgpu.server.output_limits import CHECK_EVERY_S, Running
from fgpu.server.retention import Pruner, RetentionPolicy
from fgpu.server.squeezing import record_squeeze
from fgpu.store.errors import StoreUnwritable
from fgpu.store.records import WorkloadRecord
from fgpu.store.usage import Pruned

log = logging.getLogger("fgpu.server")


TICK_S = 5.0
"""Slow tick for the time-based rules; everything else wakes the loop directly."""
RETRY_S = 1.0
"""While the store cannot write, how often the service tries again (the workloads' ends kept
meanwhile, else a probe write)."""
DEBOUNCE_S = 0.05
"""After a wake-up the loop waits this long so that a burst of submissions or exits is
decided in one round instead of one round each."""


STOP_WAIT_S = 30.0
"""How long stopping waits for a scheduling round in progress to end (it starts nothing more
once the service is stopping)."""


class SchedulingLoop(JobRules):
    """Part of :class:`fgpu.server.service.Service`: the loop and its rounds, and (beside
    them) retention's pruning (:mod:`fgpu.server.retention`, set by :attr:`retention`)."""

    retention: RetentionPolicy = RetentionPolicy()
    pruner: Pruner | None = None

    # ------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Recover what ran before, then start the scheduling loop (in the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopping = False
        self.enforcement.start()
        await asyncio.to_thread(self._recover)
        await asyncio.to_thread(self._enforce)
        self._task = asyncio.create_task(self._run_loop(), name="fgpu-scheduling-loop")
        for work, name in (
            (self._retry_writes(), "fgpu-retry-writes"),
            (self._watch_output(), "fgpu-output-limits"),
        ):
            task = asyncio.create_task(work, name=name)
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        self.store.event_coalesce_s = self.retention.event_interval_s
        ledger, output = self.usage, self.output

        def pruned(deleted: Pruned) -> None:
            ledger.pruned(deleted.freed)
            output.pruned(deleted.workload_ids)

        self.pruner = Pruner(
            self.store.prune, self.log_dir, self.clock, self.retention.retention_s, pruned
        )
        pruning = asyncio.create_task(self.pruner.run(), name="fgpu-retention")
        self._background.add(pruning)
        pruning.add_done_callback(self._background.discard)
        self.wake()

    async def stop(self) -> None:
        """Stop the loop; running workloads keep running and are re-adopted next start."""
        self._stopping = True
        self.wake()
        if self._task is not None:
            # a round in progress runs in a worker thread that cancelling would not stop: it
            # sees _stopping, starts nothing more, and is waited for before the store closes
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout=STOP_WAIT_S)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._background):
            task.cancel()
        loop = self._loop
        if loop is not None:
            for handle in self._handles.values():
                with contextlib.suppress(Exception):
                    loop.remove_reader(self._pidfds.pop(handle.workload_id, -1))
        self.enforcement.close()  # nothing stays frozen; events are written first
        self.host_limits.close()
        self.store.close()
        if self._db_claim is not None:
            self._db_claim.release()
            self._db_claim = None
        if self._state_lock is not None:
            self._state_lock.close()
            self._state_lock = None

    async def _run_loop(self) -> None:
        assert self._wake is not None
        unwritable: str | None = None  # the cause last logged, to log each cause once
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=TICK_S)
            # coalesce a burst; after a long round wait as long again, so that rounds never
            # take more than about half of the service's time while submissions pour in
            await asyncio.sleep(max(DEBOUNCE_S, self._round_s))
            self._wake.clear()
            if self.stopping:
                break
            try:
                started = time.perf_counter()
                await asyncio.to_thread(self.schedule_once)
                self._round_s = time.perf_counter() - started
                self.metrics.events.round_seconds.observe(self._round_s)
            except StoreUnwritable as exc:  # nothing placed; the next round tries again
                if exc.cause != unwritable:
                    log.error("scheduling round not recorded: %s", exc.cause)
                unwritable = exc.cause
                continue
            except Exception:  # keep serving; the error is a bug to fix, not to hide
                log.exception("scheduling round failed")
            unwritable = None

    async def _retry_writes(self) -> None:
        """While the store cannot write: every :data:`RETRY_S`, write the workloads' ends
        kept meanwhile (:meth:`_flush_exits`), or try a write, so that the service notices
        at once when it can write again (and wakes the loop)."""
        while not self._stopping:
            await asyncio.sleep(RETRY_S)
            if not self._unrecorded and self.store.write_fault is None:
                continue
            try:
                if self._unrecorded:
                    await asyncio.to_thread(self._flush_exits)
                elif await asyncio.to_thread(self.store.probe_write) is None:
                    log.info("the store writes again")
                    self.wake()
            except Exception:  # keep retrying; the cause is logged where it is known
                log.exception("retrying the store's writes failed")

    async def _watch_output(self) -> None:
        """Every :data:`fgpu.server.output_limits.CHECK_EVERY_S`: the per-user output limit
        (:meth:`check_output`, in a worker thread)."""
        while not self._stopping:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                await asyncio.to_thread(self.check_output)
            except Exception:  # keep checking; the cause is logged
                log.exception("checking the output limits failed")

    def check_output(self) -> list[tuple[str, str]]:
        """Measure the running workloads' logs and cut the output of those whose user is at
        an output limit (:mod:`fgpu.server.output_limits`), with an event each; returns
        ``(workload id, reason)`` of those cut now."""
        running = [
            Running(r.id, r.owner_uid, r.queue)
            for r in self._active_records()
            if r.phase in ("running", "paused")
        ]
        if not running:
            return []
        stopped = self.output.check(running, self._output_limits())
        for workload_id, reason in stopped:
            log.info("output of %s dropped from now: %s", workload_id, reason)
            with contextlib.suppress(Exception):  # the cut is said in its logs regardless
                self.store.record_event(
                    workload_id, "output-cut", "output limit", f"output dropped: {reason}"
                )
        return stopped

    def _output_limits(self) -> dict[str, int | None]:
        """Each queue's per-user output limit (None: the machine's only), from the queues
        kept per queue change (a store read each second cost more than the check)."""
        return {name: q.config.max_output_bytes for name, q in self._queue_records().items()}

    # --------------------------------------------------------------- scheduling
    def schedule_once(self) -> Decision:
        """One scheduling round: decide, record, act. Returns the decision."""
        with self._lock:
            self._apply_job_rules()  # time limits, dependencies that can never hold
            decision = self.plan()
            if self._last is None or decision.warnings != self._last.warnings:
                for warning in decision.warnings:
                    log.warning("queues: %s", warning)
            if decision.holds != self._saved_holds:  # most rounds keep the holds they found
                self.store.save_holds(decision.holds)
                self._saved_holds = dict(decision.holds)
            self._last = decision
            # what users read, in the words of fgpu ls (GPUs, workloads, priorities by name)
            listed = self._lister()
            reasons = {
                a.workload: listed(a.reason) for a in decision.actions if isinstance(a, Wait)
            }
            squeezes = False
            for action in decision.actions:
                if self._stopping:  # stopping: start nothing more (the next start decides)
                    break
                if isinstance(action, Place):
                    short = launch_shortfall()
                    if short is not None:  # pending, with why, rather than half-launched
                        reasons[action.workload] = short
                        continue
                    self._start(action.workload, action.allocation)
                elif isinstance(action, Preempt):
                    self._evict_kinds[action.victim] = action.kind
                    self._evict_by[action.victim] = action.preemptor
                    self._stop(action.victim, listed(action.reason))
                    self.metrics.events.preempted(action.kind)
                elif isinstance(action, Suspend):
                    self._suspend(replace(action, reason=listed(action.reason)))
                elif isinstance(action, Restore):
                    self._restore(action)
                elif isinstance(action, Squeeze | Unsqueeze):
                    record_squeeze(self._tracked, replace(action, reason=listed(action.reason)))
                    squeezes = True
            if squeezes:  # the governor pauses squeezed work, and lets released work run
                self._enforce()
            try:
                reasons.update(self._schedule_mig())
            except Exception:  # a device error; the core's round stands, the next one retries
                log.exception("MIG pass failed")
            reasons.update(self._gate_reasons)  # dependencies, array throttles
            self._reasons = reasons
            self._arm_time_limits()
            return decision

    def _schedule_mig(self) -> dict[str, str]:
        """The MIG pass after the core's round (:meth:`MigPool.schedule`): start what it
        places, record the changes it made; returns why the others wait."""
        with self._mirror_lock:
            records = list(self._mig_active.values())
        gated = self._gate_reasons  # waiting for a dependency or its array's throttle
        pending = [
            r
            for r in records
            if r.phase == "pending" and r.mig_request is not None and r.id not in gated
        ]
        if not pending:
            return {}
        held: dict[str, int] = {}
        nonpreemptible: dict[str, int] = {}

        def count(queue: str, milli: int, preemptible: bool) -> None:
            held[queue] = held.get(queue, 0) + milli
            if not preemptible:
                nonpreemptible[queue] = nonpreemptible.get(queue, 0) + milli

        # the core's placements of this round are started already, so the mirror has them
        for w in self._workloads():
            if w.allocation is not None:
                count(w.queue, allocation_resources(w.allocation)[0], w.is_preemptible)
        instances: dict[str, str] = {}
        for r in records:
            if r.holds_allocation and r.allocation is not None and r.allocation.mig is not None:
                instances[r.allocation.mig.uuid] = r.id
                count(r.queue, sum(r.allocation.gpu_milli), _preemptible(r))
        budget = QueueBudget(self._queue_tree(), held, nonpreemptible)
        candidates = [
            MigCandidate(r.id, r.queue, r.priority, r.submitted_at, _preemptible(r), r.mig_request)
            for r in pending
            if r.mig_request is not None
        ]
        result = self.mig.schedule(candidates, instances, budget, self.store.record_event)
        for line in result.changes:
            log.info("MIG: %s", line)
        waits = dict(result.waits)
        for place in result.places:
            short = launch_shortfall()
            if short is not None:
                waits[place.workload] = short
                continue
            self._start(place.workload, place.allocation, mig=place.instance, reason=place.reason)
        return waits

    def plan(self) -> Decision:
        """Read the store and ask the decision core, without acting (what a round decides)."""
        now = self.clock()
        workloads = self._gated(self._workloads())
        state = state_with(  # a misfit is settled by _recover; never stop deciding
            self.machine.nodes,
            workloads,
            lambda w, _: log.error("workload %s holds GPUs this machine lacks; skipped", w.id),
        )
        self._refresh_target(workloads)
        tree = self._queue_tree()
        if self._saved_holds is None:  # read once: this service is the store's only writer
            self._saved_holds = self.store.load_holds()
        holds = self._saved_holds
        return self._scheduler.decide(now, state, tree, workloads, holds, self._mig_use())

    def _mig_use(self) -> OutsideUse | None:
        """What the MIG workloads hold, for the core's round (None without a MIG pool)."""
        if not self.mig.gpus:
            return None
        allocated: dict[str, Resources] = {}
        nonpreemptible: dict[str, int] = {}
        with self._mirror_lock:
            records = list(self._mig_active.values())
        for r in records:
            if r.holds_allocation and r.allocation is not None:
                milli = sum(r.allocation.gpu_milli)
                before = allocated.get(r.queue, Resources())
                allocated[r.queue] = Resources(gpu_milli=before.gpu_milli + milli)
                if not _preemptible(r):
                    nonpreemptible[r.queue] = nonpreemptible.get(r.queue, 0) + milli
        return OutsideUse(Resources(gpu_milli=self.mig.capacity_milli()), allocated, nonpreemptible)

    def _refresh_target(self, workloads: Sequence[Workload]) -> None:
        """FGD's target workload from the most recent active submissions with explicit
        shares (the round has them in hand already)."""
        if not self.policy_name.startswith("fgd"):
            return
        requests = target_key(workloads)
        if requests == self._target_key:
            return
        self._target_key = requests
        self._scheduler = self._make_scheduler(target_for(requests))


def _preemptible(record: WorkloadRecord) -> bool:
    """The workload's preemptible flag, or the default for its priority."""
    if record.preemptible is not None:
        return record.preemptible
    return record.priority < NON_PREEMPTIBLE_FROM


__all__ = ["DEBOUNCE_S", "RETRY_S", "TICK_S", "SchedulingLoop"]
