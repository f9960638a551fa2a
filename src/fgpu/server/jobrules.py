"""Slurm's habits in the service (issue 25, point 4; part of
:class:`fgpu.server.service.Service`): time limits, dependencies and arrays.

- **Time limit** (``--time``; a queue's ``--default-time`` when not given, refused above its
  ``--max-time``): counts the time of the current run, from its latest start; pending time
  does not count, and a run after a preemption starts its count afresh (its process starts
  afresh too). At the limit the workload is cancelled with reason ``time limit``: SIGTERM,
  then SIGKILL after its grace period, as any cancel. The loop wakes at the earliest limit of
  the running workloads (a timer on the event loop), not only on its slow tick.
- **Dependencies** (``--dependency afterok:ID``): a pending workload whose conditions do not
  hold yet is kept out of the decision core's round (a filter before it, so the core never
  sees it: it neither waits for capacity nor counts as demand), with the reason ``waits for
  afterok:ID (NAME, running)``. A condition that can never hold (``afterok`` on work that
  failed or was cancelled, ``afternotok`` on work that succeeded) ends the workload:
  cancelled, reason ``dependency never satisfied: ...``. Conditions are checked until the
  workload first starts; once met they stay met.
- **Arrays** (``--array 0-99%N``): the throttle is the same kind of filter: of an array's
  pending tasks, only as many as ``N`` minus its running ones (lowest index first) go to the
  round.
- **Running limits per user** (``fgpu serve --max-running-per-user``, a queue's
  ``--max-running-per-user``): the last filter, :func:`fgpu.server.quotas.running_gate`.

The submission side (parsing, the queue's times, resolving dependency references, naming
the tasks) is :meth:`JobRules._job_plan`; the store writes all tasks of an array in one
transaction (:meth:`fgpu.store.store.Store.submit_tasks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fgpu.rules.errors import BadRequest, Conflict, NotFoundError
from fgpu.rules.names import shorten
from fgpu.rules.slurm import (
    MAX_DEPENDENCIES,
    ArraySpec,
    format_time,
    parse_array,
    parse_dependency,
    parse_time,
)
from fgpu.sched.workload import Workload
from fgpu.server.core import Caller
from fgpu.server.naming import resolve
from fgpu.server.quotas import SubmissionLimits, running_gate
from fgpu.server.recovery import Recovery
from fgpu.store.errors import NotFound, PermissionDenied, RowDamaged, StoreConflict
from fgpu.store.records import (
    CANCELLED,
    FAILED,
    FINAL_PHASES,
    SUCCEEDED,
    QueueConfig,
    WorkloadRecord,
)
from fgpu.wire import SubmitRequest

log = logging.getLogger("fgpu.server")

TIME_LIMIT_REASON = "time limit"
"""The reason of a workload cancelled at its time limit."""

NEVER_MET = "dependency never satisfied"
"""How the reason of a workload ended for a dependency that can never hold begins."""

GONE = "gone"
"""The phase :meth:`JobRules._phase_of` gives a workload the store no longer has."""

_WAITS_SHOWN = 3
"""Conditions a pending reason names before it says how many more there are."""

_TIMER_SLACK_S = 0.02
"""The time-limit timer fires this much after the earliest limit, so that it is passed."""


@dataclass(frozen=True, slots=True)
class JobPlan:
    """A submission's Slurm habits, checked.

    Attributes:
        time_limit_s: the time limit of a run, seconds; None: none.
        dependency: ``(type, workload id)`` conditions.
        array: the array's tasks; None for a plain workload.
    """

    time_limit_s: float | None = None
    dependency: tuple[tuple[str, str], ...] = ()
    array: ArraySpec | None = None


def time_limit(text: str | None, queue: QueueConfig) -> float | None:
    """The time limit of a submission to ``queue``: ``text`` (Slurm forms) or the queue's
    default; when the queue has a maximum, a submission without a limit gets the maximum.

    Raises:
        BadRequest: ``time``: empty, not a Slurm time; above the queue's maximum; no limit asked for
            (``0``, ``UNLIMITED``) in a queue with a maximum.
    """
    if text is not None and not text.strip():
        raise BadRequest(
            "time", f"{text!r} is empty; give a time limit (90, 1:30:00, 2-00:00:00) or 0 for none"
        )
    if text is None:
        limit = queue.default_time_s
        return limit if limit is not None else queue.max_time_s
    limit = parse_time(text, "time")
    maximum = queue.max_time_s
    if maximum is None:
        return limit
    if limit is None:
        raise BadRequest(
            "time",
            f"{text!r} asks for no limit; queue {queue.name} allows at most {format_time(maximum)}",
        )
    if limit > maximum:
        raise BadRequest(
            "time",
            f"{text!r} ({format_time(limit)}) is above queue {queue.name}'s maximum "
            f"{format_time(maximum)}",
        )
    return limit


def _condition_state(kind: str, phase: str) -> bool | None:
    """Whether a condition of ``kind`` on a workload in ``phase`` holds (True), can never
    hold (False), or may still (None: the workload is not finished)."""
    if phase not in FINAL_PHASES:
        return None
    if kind == "afterany":
        return True
    if kind == "afterok":
        return phase == SUCCEEDED
    return phase in (FAILED, CANCELLED)  # afternotok


def _too_many(text: str, count: int) -> BadRequest:
    return BadRequest(
        "dependency",
        f"{shorten(text)} names {count} workloads or more (an array counts each of its "
        f"tasks, a repeated one counts once); at most {MAX_DEPENDENCIES}",
    )


def _check_count(text: str, count: int) -> None:
    """Refuse a dependency naming more than :data:`MAX_DEPENDENCIES` workloads."""
    if count > MAX_DEPENDENCIES:
        raise _too_many(text, count)


class JobRules(Recovery):
    """Part of :class:`fgpu.server.service.Service`: time limits, dependencies, arrays,
    and the per-user running limits."""

    submission_limits: SubmissionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate_reasons: dict[str, str] = {}
        self._outcomes: dict[str, tuple[str, str]] = {}  # finished workloads: (phase, name)
        self._limit_timer: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None  # the earliest time limit the timer is set for
        self._dependency_memo: dict[str, tuple[str, str]] = {}

    # ------------------------------------------------------------- at submission
    def _job_plan(self, caller: Caller, body: SubmitRequest, queue: QueueConfig) -> JobPlan:
        """Check a submission's ``time``, ``dependency`` and ``array``.

        Raises:
            BadRequest: field ``time``, ``dependency`` or ``array``, echoing the value: a
                malformed value, a time above the queue's maximum, a dependency on nothing
                or on work whose end already rules it out.
        """
        limit = time_limit(body.time, queue)
        array = parse_array(body.array, "array") if body.array is not None else None
        conditions: dict[tuple[str, str], None] = {}
        if body.dependency is not None:
            parsed = parse_dependency(body.dependency, "dependency")
            targets = self._dependency_targets([c.ref for c in parsed], caller, body.dependency)
            for condition in parsed:
                for target in targets[condition.ref]:
                    state = _condition_state(condition.kind, target.phase)
                    if state is False:
                        raise BadRequest(
                            "dependency",
                            f"{condition.kind}:{condition.ref}: {target.id} ({target.name}) "
                            f"already ended {target.phase}; the condition can never hold",
                        )
                    conditions[(condition.kind, target.id)] = None
                    if len(conditions) > MAX_DEPENDENCIES:
                        raise _too_many(body.dependency, len(conditions))
        return JobPlan(limit, tuple(conditions), array)

    def _dependency_targets(
        self, refs: Sequence[str], caller: Caller, text: str
    ) -> dict[str, list[WorkloadRecord]]:
        """The workloads each dependency reference means, first fit: every task of an array
        by the array's id or by the name of the caller's active array; the one workload of
        an id, id prefix or name (:func:`fgpu.server.naming.resolve`); every task of the
        caller's latest array of that name. Users see all work (DESIGN.md section 5), so
        another user's workload may be waited for.

        Cost: one indexed query for the ids (arrays' and workloads'), one for the caller's
        active array names, one for those arrays' tasks; prefixes and names left over are
        resolved against one listing of the active work, and only a name of a finished
        array reads the store per reference. Distinct references are resolved once each,
        and the expanded count (an array counts each task) is checked as it grows.

        Raises:
            BadRequest: field ``dependency``: nothing or several fit; more than
                :data:`MAX_DEPENDENCIES` workloads in all.
        """
        wanted = list(dict.fromkeys(refs))
        arrays, workloads = self.store.dependency_targets(wanted)
        found: dict[str, list[WorkloadRecord]] = {}
        for ref in wanted:
            if ref in arrays:
                found[ref] = arrays[ref]
        rest = [r for r in wanted if r not in found]
        named = self.store.active_array_names(caller.uid, rest) if rest else {}
        if named:
            tasks_of, _ = self.store.dependency_targets(set(named.values()))
            for ref, array_id in named.items():
                found[ref] = tasks_of.get(array_id, [])
        for ref in wanted:
            if ref not in found and ref in workloads:
                found[ref] = [workloads[ref]]
        rest = [r for r in wanted if r not in found]
        _check_count(text, sum(len(t) for t in found.values()) + len(rest))
        if rest:
            listing = self.store.list_workloads()  # once, for every prefix or name left
            for ref in rest:
                try:
                    found[ref] = [resolve(ref, listing, caller.uid)]
                except (NotFoundError, BadRequest) as exc:
                    latest = self.store.array_named(caller.uid, ref)
                    if latest is None:
                        raise BadRequest("dependency", exc.reason) from None
                    found[ref] = self.store.array_tasks(latest)
                    _check_count(text, sum(len(t) for t in found.values()))
        return found

    def _array_refs(self, caller: Caller, ref: str) -> list[WorkloadRecord] | None:
        """The tasks of the array ``ref`` means, by its id (anyone's) or as the name of the
        caller's own active array (for an admin, also the one active array of that name
        among all users' when the caller has none); None when it means no array."""
        tasks = self.store.array_tasks(ref)
        if not tasks:
            array_id = self.store.active_array_names(caller.uid, [ref]).get(ref)
            if array_id is None and self._is_admin(caller):
                with self._mirror_lock:
                    self._load_mirror()
                    found = {
                        array
                        for (_, name), arrays in self._arrays.items()
                        if name == ref
                        for array in arrays
                    }
                array_id = found.pop() if len(found) == 1 else None
            if array_id is None:
                return None
            tasks = self.store.array_tasks(array_id)
        return tasks or None

    def _cancel_tasks(
        self, caller: Caller, tasks: Sequence[WorkloadRecord], *, now: bool = False
    ) -> list[str]:
        """Cancel every active task of an array for ``caller`` (``now``: running ones get
        SIGKILL at once); their ids.

        Raises:
            Forbidden: another user's array (and the caller is no admin).
            Conflict: no task of it is active any more.
        """
        from fgpu.rules.errors import Forbidden

        done: list[str] = []
        admin = self._is_admin(caller)
        with self._lock:
            for task in tasks:
                try:
                    record = self._tracked.cancel(task.id, caller.uid, admin=admin)
                except PermissionDenied as exc:
                    raise Forbidden("id", str(exc)) from None
                except (StoreConflict, NotFound):
                    continue  # finished already
                done.append(record.id)
                if record.phase in ("running", "paused"):
                    self._stop(record.id, record.reason, now=now)
                elif record.suspended_on is not None:
                    self._kill_suspended(record)
        if not done:
            name = tasks[0].array.name if tasks[0].array else tasks[0].name
            raise Conflict("id", f"array {name}: no task of it is active any more")
        self.wake()
        return done

    # ------------------------------------------------------------ in each round
    def _apply_job_rules(self) -> None:
        """Before a round (under the service's lock): cancel the running workloads past
        their time limit and the pending ones whose dependency can never hold."""
        now = self.clock()
        me = os.geteuid()
        # this round's dependency answers, for _gated to reuse (a cancelled one is not
        # pending any more when it looks)
        memo: dict[str, tuple[str, str]] = {}
        self._dependency_memo = memo
        for record in self._active_records():
            if record.holds_allocation:
                limit, started = record.time_limit_s, record.started_at
                if (
                    limit is not None
                    and started is not None
                    and record.cancelled_by is None
                    and now - started >= limit
                ):
                    self._cancel_by_rule(record, me, TIME_LIMIT_REASON)
            elif record.phase == "pending" and record.dependency and self._unstarted(record):
                memo[record.id] = found = self._dependency_wait(record)
                _, never = found
                if never:
                    self._cancel_by_rule(record, me, f"{NEVER_MET}: {never}")

    def _cancel_by_rule(self, record: WorkloadRecord, by_uid: int, reason: str) -> None:
        """Cancel ``record`` with ``reason`` (the service acts, as ``by_uid``)."""
        try:
            ended = self._tracked.cancel(record.id, by_uid, admin=True, reason=reason)
        except (StoreConflict, NotFound):
            return  # ended meanwhile
        log.info("workload %s cancelled: %s", record.id, reason)
        if ended.phase in ("running", "paused"):
            self._stop(ended.id, ended.reason)

    @staticmethod
    def _unstarted(record: WorkloadRecord) -> bool:
        """Pending and never started (dependencies are checked until the first start)."""
        return record.restarts == 0 and record.suspended_on is None and record.started_at is None

    def _dependency_wait(self, record: WorkloadRecord) -> tuple[str, str]:
        """Why ``record`` waits for its dependencies (empty: they all hold), and the first
        condition that can never hold (empty: none)."""
        self._learn_outcomes([target for _, target in record.dependency])
        waits: list[str] = []
        more = 0  # waited for beyond those named (an array's tasks): only counted
        for kind, target in record.dependency:
            phase, name = self._phase_of(target)
            if phase == GONE:
                return "", f"{kind}:{target} is no longer known (its record was pruned)"
            state = _condition_state(kind, phase)
            if state is False:
                how = f"ended {phase}" if phase in FINAL_PHASES else phase
                return "", f"{kind}:{target} ({name}) {how}"
            if state is None:
                if len(waits) < _WAITS_SHOWN:
                    waits.append(f"{kind}:{target} ({name}, {phase})")
                else:
                    more += 1
        if more:
            waits.append(f"{more} more")
        return ("waits for " + ", ".join(waits) if waits else ""), ""

    def _learn_outcomes(self, targets: Sequence[str]) -> None:
        """Read, in one indexed query, the targets that are neither active (the mirror) nor
        known finished (:attr:`_outcomes`), so that :meth:`_phase_of` reads none one by
        one; a target the store no longer has is left for it to say so."""
        with self._mirror_lock:
            active = self._records
            unknown = [t for t in targets if t not in active and t not in self._outcomes]
        if len(unknown) < 2:
            return
        _, found = self.store.dependency_targets(unknown, arrays=False)
        if len(self._outcomes) + len(found) > 100_000:
            self._outcomes.clear()
        for workload_id, record in found.items():
            if record.phase in FINAL_PHASES:
                self._outcomes[workload_id] = (record.phase, record.name)

    def _phase_of(self, workload_id: str) -> tuple[str, str]:
        """``(phase, name)`` of a workload: from the mirror while active, else from the
        store once (a finished workload's phase never changes); ``(GONE, id)`` for one the
        store no longer has (pruned)."""
        with self._mirror_lock:
            active = self._records.get(workload_id)
        if active is not None:
            return active.phase, active.name
        known = self._outcomes.get(workload_id)
        if known is not None:
            return known
        try:
            record = self.store.get(workload_id)
        except NotFound:
            return GONE, workload_id
        except RowDamaged:  # unreadable until an admin ends it: wait, do not guess
            return "damaged", workload_id
        outcome = (record.phase, record.name)
        if record.phase in FINAL_PHASES:
            if len(self._outcomes) > 100_000:
                self._outcomes.clear()
            self._outcomes[workload_id] = outcome
        return outcome

    def _gated(self, workloads: list[Workload]) -> list[Workload]:
        """The workloads the decision core may consider this round: all but the pending
        ones that wait for a dependency, for their array's throttle or for their owner's
        running limits (:func:`fgpu.server.quotas.running_gate`; their reasons go to
        :attr:`_gate_reasons`)."""
        reasons: dict[str, str] = {}
        running: dict[str, int] = {}
        pending: dict[str, list[WorkloadRecord]] = {}
        runs: list[WorkloadRecord] = []  # for the owners' running limits
        candidates: list[WorkloadRecord] = []
        memo, self._dependency_memo = self._dependency_memo, {}
        for record in self._active_records():
            array = record.array
            if record.holds_allocation or record.is_suspended:
                runs.append(record)
                if array is not None:
                    running[array.id] = running.get(array.id, 0) + 1
            if record.phase != "pending" or record.is_suspended:
                continue  # a suspended task is restored where it was: it counts as running
            if record.dependency and self._unstarted(record):
                found = memo.get(record.id)
                wait, never = found if found is not None else self._dependency_wait(record)
                if wait or never:
                    reasons[record.id] = wait or f"{NEVER_MET}: {never}"
                    continue
            if array is not None and array.throttle is not None:
                pending.setdefault(array.id, []).append(record)  # preempted ones too
            else:
                candidates.append(record)
        for array_id, tasks in pending.items():
            first = tasks[0].array
            assert first is not None
            assert first.throttle is not None
            room = max(0, first.throttle - running.get(array_id, 0))
            turns = sorted(tasks, key=lambda t: t.array.index if t.array else 0)
            candidates.extend(turns[:room])
            for task in turns[room:]:
                reasons[task.id] = (
                    f"array {first.name}: waits for its turn, at most {first.throttle} at once "
                    f"(%{first.throttle})"
                )
        queues = {name: q.config for name, q in self._queue_records().items()}
        reasons.update(running_gate(runs, candidates, queues, self.submission_limits.max_running))
        self._gate_reasons = reasons
        return [w for w in workloads if w.id not in reasons]

    def _arm_time_limits(self) -> None:
        """Wake the loop at the earliest time limit of the running workloads (thread-safe;
        replaces the previous timer)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        deadlines = [
            r.started_at + r.time_limit_s
            for r in self._active_records()
            if r.holds_allocation
            and r.time_limit_s is not None
            and r.started_at is not None
            and r.cancelled_by is None
        ]
        earliest = min(deadlines) if deadlines else None
        timer = self._limit_timer
        pending = timer is not None and timer.when() > loop.time()
        if earliest == self._armed_for and (earliest is None or pending):
            return  # the timer already wakes the loop for it (most rounds change nothing)
        self._armed_for = earliest
        delay = None if earliest is None else max(0.0, earliest - self.clock()) + _TIMER_SLACK_S

        def arm() -> None:
            if self._limit_timer is not None:
                self._limit_timer.cancel()
                self._limit_timer = None
            if delay is not None and not self.stopping:
                self._limit_timer = loop.call_later(delay, self.wake)

        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(arm)


__all__ = [
    "NEVER_MET",
    "TIME_LIMIT_REASON",
    "JobPlan",
    "JobRules",
    "time_limit",
]
