"""The single-machine service: use-cases and the scheduling loop (issue "Single-machine GPU
sharing service"; DESIGN.md sections 1, 2, 5, 8).

:class:`Service` is what the API routes call. It validates submissions, keeps every state
change in the store (with an event) *before* acting on it, and runs the scheduling loop:
each round rebuilds the cluster state from the store, asks the decision core
(:class:`fgpu.sched.decide.Scheduler`), and executes the actions through the node agent
(:class:`fgpu.agent.launcher.Launcher`). The loop wakes on submissions, cancellations,
queue changes and process exits (each process is watched through a Linux pidfd, so nothing
polls), and on a slow tick for the time-based rules (``min_runtime``, aging, reservation).

Stopping a workload (preemption or cancel): the store records the stop first, then the
agent sends SIGTERM to the workload's process group, waits the grace period and sends
SIGKILL; the exit watcher then records the outcome: back to ``pending`` for a preempted
workload (it restarts later from the same command), ``cancelled`` for a cancelled one.

Restart safety: on start, each workload the store has as running is re-adopted when its
process still lives (pid and start time match, see :meth:`Launcher.is_same_process`);
when its process ended while the service was down and left its exit record, the recorded
outcome is kept; otherwise it is marked failed, "lost while the service was down".

MIG: GPUs in MIG mode are the MIG pool (:mod:`fgpu.server.mig_pool`); after the core's
round, a pass places the pending MIG workloads on their instances, and their use counts
against their queues in the core's round (:class:`fgpu.sched.decide.OutsideUse`).

The parts, each in its own module and each a base of :class:`Service`:
:mod:`fgpu.server.core` (state, composition, the mirror of the active workloads),
:mod:`fgpu.server.enforcing` (hand-over to the governor and the memory guard),
:mod:`fgpu.server.processes` (start, stop, exits), :mod:`fgpu.server.recovery` (after a
restart), :mod:`fgpu.server.loop` (the scheduling loop); this module holds the use-cases
the API routes call.
"""

from __future__ import annotations

import contextlib
import logging
import pwd
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pydantic_core

from fgpu.model.types import InvalidRequestError, Request
from fgpu.rules.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientStorage,
    NotFoundError,
    ServiceError,
)
from fgpu.rules.requests import Submission, parse_submission, queue_config
from fgpu.rules.slurm import task_name
from fgpu.sched.decide import request_resources
from fgpu.sched.fairshare import config_warnings
from fgpu.sched.reasons import gpus
from fgpu.sched.workload import Resources
from fgpu.server import views
from fgpu.server.access import (
    check_submission,
    check_within_quota,
    default_queue_of,
    identity_of,
    is_member,
    unknown_members,
)
from fgpu.server.core import DEFAULT_QUEUE, Caller, claim_state_dir, default_state_dir
from fgpu.server.idempotent import check_key, replay
from fgpu.server.jobrules import JobPlan
from fgpu.server.listing import (
    DEFAULT_MAX_BYTES,
    MAX_PAGE,
    ListingAnswer,
    ListingGate,
    PageEncoder,
    brief_command,
    format_cursor,
    parse_cursor,
)
from fgpu.server.live import read_live
from fgpu.server.loop import SchedulingLoop
from fgpu.server.naming import NamePicker, base_name, check_name_free
from fgpu.server.quotas import SubmissionLimits
from fgpu.states import governor_word
from fgpu.store.errors import NotFound, PermissionDenied, RowDamaged, StoreConflict
from fgpu.store.idempotency import fingerprint
from fgpu.store.records import EVERYONE, ArrayPlan, QueueConfig, QueueRecord, WorkloadRecord
from fgpu.store.schema import NAME_LENGTH
from fgpu.users import user_text
from fgpu.wire import (
    EnforcementLayer,
    EventView,
    NodeView,
    QueueBody,
    QueueView,
    SubmitRequest,
    WorkloadDetail,
    WorkloadView,
)

log = logging.getLogger("fgpu.server")


class Service(SchedulingLoop):
    """Use-cases of the single-machine service and its scheduling loop.

    Args:
        store: the store (state of record).
        backend: GPU backend.
        launcher: process launcher.
        state_dir: folder for logs and process handles.
        policy: placement policy name (``fgd`` learns its target from recent submissions).
        admins: uids allowed to manage queues and other users' work (root always is).
        config: decision-core knobs.
        agent_socket: where workloads send activity hints (``FGPU_AGENT_SOCKET``); empty:
            none.
        clock: time source (seconds).
        mig_devices: the MIG devices of the backend's GPUs in MIG mode (the MIG pool).
        enforcement: governor and memory guard settings (default: fair, pause, kill).

    :attr:`submission_limits` are the per-user limits (``fgpu serve`` sets them).
    """

    submission_limits: SubmissionLimits = SubmissionLimits()
    _name_picker: NamePicker | None = None
    listing_max_bytes: int = DEFAULT_MAX_BYTES
    """Most bytes of JSON one listing answer holds (``fgpu serve --listing-max-bytes``)."""
    _listing_gate: ListingGate | None = None

    @property
    def listing_gate(self) -> ListingGate:
        """Listings made at once and waiting (``fgpu serve --listings-at-once``)."""
        if self._listing_gate is None:
            self._listing_gate = ListingGate()
        return self._listing_gate

    @listing_gate.setter
    def listing_gate(self, gate: ListingGate) -> None:
        self._listing_gate = gate

    def submit(
        self, caller: Caller, body: SubmitRequest, idempotency_key: str | None = None
    ) -> WorkloadView:
        """Validate and store a submission, then wake the loop.

        With ``idempotency_key`` (the ``Idempotency-Key`` header) a submission the caller
        already made with that key and the same body is answered with the workload it
        created, as it now stands, and nothing new is stored (:mod:`fgpu.store.idempotency`).

        Raises:
            BadRequest: invalid input, an unknown or non-leaf queue, a request that can
                never fit this machine (with the per-node reason), or a command and env over
                ``--max-submission-bytes``.
            BadRequest: ``preemptible``: non-preemptible work above its queue's GPU quota,
                which could never start (:func:`fgpu.server.access.check_within_quota`).
            LimitReached: the caller is at a per-user limit of the queue or the machine
                (active workloads, stored bytes; :mod:`fgpu.server.quotas`).
            Conflict: the caller has an active workload of the name asked for.
            Forbidden: the caller is not a member of the queue, or asks for a priority or
                non-preemptible work the queue does not grant its members
                (:func:`fgpu.server.access.check_submission`).
            BadRequest: ``Idempotency-Key``: a malformed key, or one the caller used for
                another body.
            InsufficientStorage: ``store``: the database cannot write or the state disk is
                (nearly) full (:class:`fgpu.server.storage.StorageCheck`), with the cause; or
                storing this submission would take the state disk's free space below the
                reserve kept for cancels, ends and logs (``--log-disk-reserve``), echoing
                the sizes.
        """
        keyed: tuple[str, str] | None = None
        if idempotency_key is not None:
            keyed = (check_key(idempotency_key), fingerprint(body.model_dump(mode="json")))
        try:
            return self._submit_new(caller, body, keyed)
        except (ServiceError, StoreConflict):
            # A retry is found only when it is refused: its name taken by the workload its
            # first attempt made, a limit that workload reached, or (passing every check)
            # the store refusing to claim its key again, nothing written. Looking the key up
            # first would cost every submission a read transaction for the rare retry.
            earlier = self._replay(caller, keyed) if keyed is not None else None
            if earlier is None:
                raise
            return earlier

    def _submit_new(
        self, caller: Caller, body: SubmitRequest, keyed: tuple[str, str] | None
    ) -> WorkloadView:
        """:meth:`submit` but the answer to a retry: stores the submission, claiming the
        key of ``keyed`` (key, fingerprint) in the same transaction."""
        problem = self.storage.problem()
        if problem is not None:
            raise InsufficientStorage("store", problem)
        sub = parse_submission(body)
        request = sub.request
        if sub.mig_request is not None:
            request = self.mig.request_for(sub.mig_request)
        assert request is not None
        queues = self._queue_records()
        tree = self._queue_tree()
        queue_name = body.queue
        if queue_name is None:  # the caller's default queue
            queue_name = default_queue_of(
                list(queues.values()), identity_of(caller.uid), DEFAULT_QUEUE
            )
        if queue_name not in tree:
            known = ", ".join(sorted(tree.specs))
            raise BadRequest("queue", f"unknown queue {queue_name!r}; queues: {known}")
        if queue_name not in tree.leaves:
            raise BadRequest("queue", f"queue {queue_name!r} has child queues; submit to a leaf")
        if queue_name not in queues:  # changed since the tree was read
            raise BadRequest("queue", f"unknown queue {queue_name!r}")
        queue = queues[queue_name].config
        # a memory-only share counts as its share of the largest GPU it may run on
        eligible = [
            n
            for n in self.machine.nodes
            if not request.gpu_models or n.gpu_model in request.gpu_models
        ]
        largest = max((n.gpu_memory_mib for n in eligible), default=0)
        counted = request_resources(request, largest)[0]
        try:
            check_submission(
                queue,
                caller.uid,
                admin=self._is_admin(caller),
                priority=sub.priority,
                preemptible=body.preemptible,
                gpu_milli=counted,
            )
        except Forbidden as exc:
            if body.queue is not None or queue_name == DEFAULT_QUEUE:
                raise
            raise Forbidden(  # not asked for by name: say where it came from
                exc.field, f"{exc.reason} (queue {queue_name} is your default queue; -q chooses)"
            ) from None
        plan = self._job_plan(caller, body, queue)  # --time, --dependency, --array
        if sub.mig_request is None:
            self._check_could_fit(request)
        check_within_quota(
            queue, gpu_milli=counted, priority=sub.priority, preemptible=body.preemptible
        )
        limits = self.submission_limits
        size = limits.check_size(sub.argv, body.env, body.cwd)
        problem = self.storage.room_problem(size)
        if problem is not None:
            raise InsufficientStorage("store", problem)
        store = self.store
        with self._mirror_lock:  # the mirror, which keeps the usage ledger current, is loaded
            self._load_mirror()
        checked = False

        adding = len(plan.array.indices) if plan.array is not None else 1

        def holders(names: list[str]) -> dict[str, tuple[str, str]]:
            """The caller's active workloads (and arrays) of ``names``; the first time,
            refuses ``adding`` more (each task of an array counts) over the caller's limits
            (the queue's and the machine's, from the usage ledger)."""
            nonlocal checked
            if not checked:
                limits.check_usage(self.usage.usage(caller.uid, queue_name), queue, size, adding)
                checked = True
            return self._active_holders(caller.uid, names)

        with self._names_lock:  # names are unique among the owner's active workloads
            if body.name:
                name = sub.name
                check_name_free(name, holders([name]).get(name))
            else:
                if self._name_picker is None:
                    self._name_picker = NamePicker(NAME_LENGTH)
                name = self._name_picker.pick(
                    caller.uid,
                    base_name(sub.argv, body.shell),
                    holders,
                    lambda prefix: store.active_names(caller.uid, prefix),
                )
            if plan.array is not None:
                return self._submit_array(
                    caller,
                    body,
                    sub,
                    request,
                    name,
                    plan,
                    holders,
                    queue_name=queue_name,
                    keyed=keyed,
                    stored=size,
                )
            (record,) = self._store_tasks(
                caller,
                body,
                sub,
                request,
                plan,
                [(name, body.env, None)],
                queue_name,
                keyed,
                size,
            )
        self.wake()
        return views.workload(record, self._reasons.get(record.id))

    def health_problem(self) -> str | None:
        """Why the service cannot do its work now (the store cannot write, the state disk is
        full), or None: what ``/v1/healthz`` and ``/v1/readyz`` answer."""
        return self.storage.problem()

    def _replay(self, caller: Caller, keyed: tuple[str, str]) -> WorkloadView | None:
        """The answer to an earlier submission of the caller with this (key, fingerprint),
        or None (:func:`fgpu.server.idempotent.replay`)."""
        return replay(self.store, caller.uid, keyed, self._reasons)

    def _submit_array(
        self,
        caller: Caller,
        body: SubmitRequest,
        sub: Submission,
        request: Request,
        name: str,
        plan: JobPlan,
        holders: Callable[[list[str]], dict[str, tuple[str, str]]],
        *,
        queue_name: str,
        keyed: tuple[str, str] | None = None,
        stored: int,
    ) -> WorkloadView:
        """Store every task of an array in one transaction (under the names lock), named
        ``NAME_INDEX``; the view of its first task. ``stored``: the bytes each task stores
        (the submission's size, as :meth:`SubmissionLimits.check_size` gave it).

        Raises:
            Conflict: a task's name is taken by an active workload of the caller.
            BadRequest: a task name over the longest name.
        """
        assert plan.array is not None
        spec = plan.array
        names = [task_name(name, i) for i in spec.indices]
        if max(len(n) for n in names) > NAME_LENGTH:
            raise BadRequest("name", f"the task names {names[-1]!r} are too long")
        taken = holders(names)
        for task in names:
            check_name_free(task, taken.get(task))
        size = len(spec.indices)
        tasks = [
            (task, body.env, ArrayPlan(name, index, size, spec.throttle))
            for task, index in zip(names, spec.indices, strict=True)
        ]
        records = self._store_tasks(
            caller, body, sub, request, plan, tasks, queue_name, keyed, stored
        )
        self.wake()
        return views.workload(records[0], None)

    def _store_tasks(
        self,
        caller: Caller,
        body: SubmitRequest,
        sub: Submission,
        request: Request,
        plan: JobPlan,
        tasks: Sequence[tuple[str, Mapping[str, str], ArrayPlan | None]],
        queue_name: str,
        keyed: tuple[str, str] | None,
        stored: int,
    ) -> list[WorkloadRecord]:
        """Store a submission's tasks (one for a plain workload, one per index for an
        array) in one transaction, then bring the mirror, the metrics and the usage ledger
        up to date (``stored``: the bytes each task stores).

        Raises:
            BadRequest: a field the store refuses.
            StoreConflict: the idempotency key is stored already (nothing written).
        """
        try:
            records = self.store.submit_tasks(
                owner_uid=caller.uid,
                queue=queue_name,
                request=request,
                argv=sub.argv,
                tasks=tasks,
                priority=sub.priority,
                preemptible=body.preemptible,
                shell=body.shell,
                cwd=body.cwd,
                grace_s=body.grace_s,
                mig_request=sub.mig_request,
                time_limit_s=plan.time_limit_s,
                dependency=plan.dependency,
                idempotency=keyed,
            )
        except InvalidRequestError as exc:
            raise BadRequest(exc.field, exc.reason) from None
        for record in records:
            self._sync(record)
            self.metrics.wrote("submit", record)
            self.usage.submitted(caller.uid, queue_name, stored)
        return records

    def _check_could_fit(self, request: Request) -> None:
        """Refuse a request that no GPU of this machine could ever hold, naming the field
        that cannot be met where one alone is the cause.

        Raises:
            BadRequest: ``gpu_model`` (no GPU of that model here), ``gpu`` (more GPUs than
                any node has), ``gpu_memory`` (more memory than any GPU has), else
                ``request`` with the per-node reasons.
        """
        empty = self._empty  # capacities only; never allocated on
        ok, _ = empty.feasible(request)
        if ok.any():
            return
        nodes = [n for n in self.machine.nodes if n.gpu_count > 0]
        if not nodes and self.mig.gpus:
            raise BadRequest(
                "gpu",
                "every GPU of this machine is in MIG mode: ask for a MIG instance with "
                "--mig-profile or --isolation mig --gpu-memory",
            )
        if request.gpu_models:
            here = sorted({str(n.gpu_model) for n in nodes})
            nodes = [n for n in nodes if n.gpu_model in request.gpu_models]
            if not nodes:
                wanted = ", ".join(sorted(request.gpu_models))
                raise BadRequest(
                    "gpu_model", f"no {wanted} GPU on this machine; it has {', '.join(here)}"
                )
        if nodes and request.gpu_count > max(n.gpu_count for n in nodes):
            most = max(n.gpu_count for n in nodes)
            raise BadRequest(
                "gpu", f"asks for {request.gpu_count} GPUs; a node here has at most {most}"
            )
        memory = request.gpu_memory_mib
        if nodes and memory is not None and memory > max(n.gpu_memory_mib for n in nodes):
            largest = max(n.gpu_memory_mib for n in nodes)
            raise BadRequest(
                "gpu_memory",
                f"{memory} MiB is more than any GPU here has (the largest has {largest} MiB)",
            )
        raise BadRequest("request", f"can never fit this machine: {empty.explain(request)}")

    def list_workloads(self, include_done: bool = False) -> list[WorkloadView]:
        """Active workloads (all with ``include_done``), oldest first."""
        reasons = self._reasons
        states = self._gpu_states()
        records = self.store.list_workloads() if include_done else self._active_records()
        names = {r.id: r.name for r in records}
        return [views.workload(r, reasons.get(r.id), states.get(r.id), names) for r in records]

    def workload_page(
        self,
        caller: Caller,
        *,
        include_done: bool = False,
        mine: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
        brief: bool = False,
    ) -> ListingAnswer:
        """A page of workloads, oldest first, as the JSON array the API answers, with the
        cursor of the next page (None: last) and the ids of damaged rows skipped.

        The page holds at most ``limit`` workloads and at most :attr:`listing_max_bytes`
        of JSON (it stops before the workload that would cross it; the cursor goes on from
        there), and is made in a turn of :attr:`listing_gate` as the caller's uid (at most so
        many at once, and at most one per user: one user's flood leaves turns to others).

        Args:
            caller: who asks.
            include_done: finished ones too (read from the store, a page at a time).
            mine: only the caller's work and others' running or paused work (others'
                pending work is theirs to watch: one user's backlog costs others nothing).
            limit: most workloads (1..:data:`MAX_PAGE`; None: all that fit the bytes).
            cursor: where the previous page ended (its ``next`` cursor).
            brief: each ``command`` cut to :data:`BRIEF_COMMAND_CHARS` characters (what
                ``fgpu ls``'s table needs).

        Raises:
            BadRequest: ``limit`` out of range, or a malformed ``cursor`` (echoed).
            Unavailable: too many listings at once, or of this user at once (503).
        """
        if limit is not None and not 1 <= limit <= MAX_PAGE:
            raise BadRequest("limit", f"{limit} must be between 1 and {MAX_PAGE}")
        after = parse_cursor(cursor)
        owner = caller.uid if mine else None
        budget = self.listing_max_bytes
        with self.listing_gate.turn(caller.uid):
            reasons = self._reasons
            states = self._gpu_states()
            names = {r.id: r.name for r in self._active_records()}
            unnamed: set[str] = set()  # preemptors the store does not have (shown by id)

            def encoded(record: WorkloadRecord) -> bytes:
                wanted = record.preempted_by
                if wanted is not None and wanted not in names and wanted not in unnamed:
                    try:
                        names[wanted] = self.store.get(wanted).name
                    except (NotFound, RowDamaged):
                        unnamed.add(wanted)
                view = views.workload(record, reasons.get(record.id), states.get(record.id), names)
                if brief:
                    view.command = brief_command(record.argv)
                return pydantic_core.to_json(view)  # bytes, no str copy between

            page = PageEncoder(encoded, budget)
            if include_done:  # each record encoded as it is read, then let go
                read = self.store.workload_page(
                    after=after,
                    limit=limit if limit is not None else MAX_PAGE,
                    owner_uid=owner,
                    with_others_running=mine,
                    max_bytes=budget,
                    each=page.add,
                )
                return page.answer(format_cursor(read.cursor), [d.id for d in read.damaged])
            records = [
                r
                for r in self._active_records()
                if (owner is None or r.owner_uid == owner or r.holds_allocation)
                and (after is None or (r.submitted_at, r.id) > after)
            ]
            skipped: list[str] = []
            if after is None:  # damaged active rows, named on the first page
                skipped = [
                    d.id
                    for d in self.store.damaged()
                    if d.phase is None or d.phase in ("pending", "running", "paused")
                    if owner is None or d.owner_uid in (None, owner) or d.phase != "pending"
                ]
            for record in records[:limit]:
                if not page.add(record):
                    break
            last = page.last
            more = page.count < len(records)
            following = (last.submitted_at, last.id) if more and last is not None else None
            return page.answer(format_cursor(following), skipped)

    def _end_damaged(self, caller: Caller, damage: RowDamaged) -> WorkloadView:
        """An admin's cancel of a workload whose row is damaged: the row is ended as
        cancelled (:meth:`fgpu.store.Store.end_damaged`), and its process, if the service
        knows one, stopped. Anyone else gets the damage named (409).

        Raises:
            RowDamaged: the caller is not an admin.
        """
        if not self._is_admin(caller):
            raise damage
        with self._lock:
            try:
                found, record = self.store.end_damaged(damage.workload_id, caller.uid)
            except NotFound:
                raise NotFoundError("id", f"no workload {damage.workload_id!r}") from None
            except StoreConflict as exc:
                raise Conflict("id", str(exc)) from None
            self._sync(record)
            if found.phase in ("pending", "running", "paused"):  # the ledger counted it
                self.usage.ended(record.owner_uid, record.queue)
            if damage.workload_id in self._handles:
                self._stop(damage.workload_id, record.reason)
        self.wake()
        return views.workload(record, None)

    def _gpu_states(self) -> dict[str, str]:
        """The governor's state of each governed workload in the words of
        :mod:`fgpu.states` (running, paused-by-priority, waiting-for-share), by id."""
        return {
            wid: governor_word(str(v.state)) or "running"
            for wid, v in self.enforcement.views().items()
        }

    def get_workload(self, workload_id: str, caller: Caller | None = None) -> WorkloadDetail:
        """One workload with its events and, while pending, why it waits. ``workload_id``
        may be a unique id prefix or a name (the caller's own first; see
        :func:`fgpu.server.naming.resolve`).

        Raises:
            NotFoundError: unknown id; BadRequest: a prefix or name of several (listed).
        """
        record = self._get(workload_id, caller.uid if caller else None)
        events = self.store.events(record.id)
        names: dict[str, str] = {}
        if record.preempted_by is not None:
            with contextlib.suppress(NotFound, RowDamaged):
                names[record.preempted_by] = self.store.get(record.preempted_by).name
        detail = views.detail(
            record,
            self._reasons.get(record.id),
            events,
            self._gpu_states().get(record.id),
            names,
        )
        if record.phase in ("running", "paused"):
            detail.enforcement = self.enforcement.describe(record.id)
        return detail

    def cancel(self, caller: Caller, workload_id: str, *, now: bool = False) -> WorkloadView:
        """Cancel: pending ones at once, running ones are stopped (grace, then SIGKILL; with
        ``now``, SIGKILL at once, also for one already stopping: work that ignores SIGTERM
        under a long ``--grace``). An array's id, or the name of the caller's own array,
        cancels every active task of it (the answer is its first task's view, with
        ``cancelled_tasks``).

        Raises:
            NotFoundError, Forbidden, Conflict: unknown, another user's, already finished.
        """
        try:
            workload_id = self.store.get(workload_id).id
        except RowDamaged as exc:
            return self._end_damaged(caller, exc)
        except NotFound:  # not a workload's id: an array's id or name, else a name or prefix
            tasks = self._array_refs(caller, workload_id)
            if tasks is not None:
                done = self._cancel_tasks(caller, tasks, now=now)
                first = self.store.get(done[0])
                return views.workload(first, None).model_copy(update={"cancelled_tasks": done})
            try:
                workload_id = self._get(workload_id, caller.uid).id
            except RowDamaged as exc:
                return self._end_damaged(caller, exc)
        with self._lock:
            try:
                admin = self._is_admin(caller)
                record = self._freeing(
                    lambda: self._tracked.cancel(workload_id, caller.uid, admin=admin)
                )
            except NotFound:
                raise NotFoundError("id", f"no workload {workload_id!r}") from None
            except PermissionDenied as exc:
                raise Forbidden("id", str(exc)) from None
            except StoreConflict as exc:
                raise Conflict("id", str(exc)) from None
            if record.phase in ("running", "paused"):
                self._stop(workload_id, record.reason, now=now)
            elif record.suspended_on is not None:  # suspended: its frozen processes go
                self._kill_suspended(record)
        self.wake()
        return views.workload(record, None)

    def log_path(self, caller: Caller, workload_id: str, stream: str) -> Path:
        """The workload's stdout or stderr log (a file only for workloads of an fgpu before
        issue 27; else a name that :func:`fgpu.server.app.read_from` reads from the framed
        log), or (``all``) both streams in order as records of :mod:`fgpu.wire_logs` (its
        owner's and admins' to read).

        Raises:
            NotFoundError: unknown id; BadRequest: stream not stdout/stderr/all, or ``all``
                for a workload started before fgpu kept that log; Forbidden: another user's
                workload.
        """
        if stream not in ("stdout", "stderr", "all"):
            raise BadRequest("stream", "must be stdout, stderr or all")
        record = self._get(workload_id, caller.uid)
        if record.owner_uid != caller.uid and not self._is_admin(caller):
            raise Forbidden(
                "id",
                f"workload {record.id} belongs to {user_text(record.owner_uid)}; its logs are "
                "its owner's",
            )
        folder = self.log_dir / record.id
        if stream == "all":
            merged = folder / "output.log"
            if not merged.exists() and (folder / "stdout.log").exists():
                raise BadRequest(
                    "stream",
                    f"workload {record.id} was started by an fgpu that kept no ordered log of "
                    "both streams; ask for stdout or stderr",
                )
            return merged
        return folder / f"{stream}.log"

    # -------------------------------------------------------------------- queues
    def _queue_change(
        self, caller: Caller, change: Callable[[], object], config: QueueConfig | None = None
    ) -> None:
        if not self._is_admin(caller):
            raise Forbidden(
                "queue", f"{user_text(caller.uid)} may not manage queues (root or --admin)"
            )
        for field_name, entries in (
            ("members", config.members if config is not None else ()),
            ("default_for", config.default_for if config is not None else ()),
        ):
            self._check_known(field_name, entries)
        if config is not None:
            self._check_defaults_are_members(config)
        try:
            with self._lock:
                self._queues_changed()
                change()
                self._queues_changed()
        except InvalidRequestError as exc:
            raise BadRequest(exc.field, exc.reason) from None
        except NotFound as exc:
            raise NotFoundError("name", str(exc)) from None
        except StoreConflict as exc:
            raise Conflict("name", str(exc)) from None
        self.wake()

    @staticmethod
    def _check_defaults_are_members(config: QueueConfig) -> None:
        """Refuse a default queue for someone the queue does not take (their submissions
        without ``-q`` would all be refused): each ``default_for`` entry must be a member by
        name or uid, a group listed as such, or covered by ``*``."""
        members = set(config.members)
        if EVERYONE in members:
            return
        outside = []
        for entry in config.default_for:
            if entry in members:
                continue
            if not entry.startswith("@"):
                try:
                    uid = int(entry) if entry.isdigit() else pwd.getpwnam(entry).pw_uid
                except KeyError:
                    uid = None
                if uid is not None and is_member(config, identity_of(uid)):
                    continue
            outside.append(entry)
        if outside:
            listed = ", ".join(config.members) or "none (admins only)"
            raise BadRequest(
                "default_for",
                f"{', '.join(outside)} may not submit to queue {config.name} (members: "
                f"{listed}), so it cannot be their default queue; add them as members too",
            )

    @staticmethod
    def _check_known(field_name: str, entries: tuple[str, ...]) -> None:
        """Refuse names of no user or group here (``field_name``: members, default_for)."""
        unknown = unknown_members(entries)
        if unknown:
            raise BadRequest(
                field_name,
                f"no user or group {', '.join(unknown)} on this machine (a group is written "
                "@name; numeric uids and gids are taken as they are)",
            )

    def create_queue(self, caller: Caller, body: QueueBody) -> QueueView:
        """Create a queue (admins). Raises BadRequest, Conflict, Forbidden."""
        config = queue_config(body)
        self._queue_change(caller, lambda: self.store.create_queue(config), config)
        return self._queue_named(config.name).model_copy(
            update={"warnings": self._warnings(), "hints": self._default_hints(config.name)}
        )

    def _default_hints(self, created: str) -> list[str]:
        """After creating ``created``: how to narrow ``default`` while it still guarantees
        every GPU of the machine (its quota at creation) to everyone, which leaves the new
        queue's quota scaled down whenever both want GPUs."""
        tree = self._queue_tree()
        capacity = self._capacity_milli()
        if created == DEFAULT_QUEUE or DEFAULT_QUEUE not in tree.specs or capacity <= 0:
            return []
        try:
            default = self.store.get_queue(DEFAULT_QUEUE).config
        except NotFound:
            return []
        if default.quota.gpu_milli < capacity:
            return []
        others = sum(
            tree.specs[q].quota.gpu_milli
            for q in tree.children.get(default.parent, [])
            if q != DEFAULT_QUEUE
        )
        rest = max(0, capacity - others)
        who = "everyone (member *)" if EVERYONE in default.members else "its members"
        head = (
            f"queue {DEFAULT_QUEUE} still has every GPU of this machine as its quota "
            f"({gpus(default.quota.gpu_milli)} of {gpus(capacity)}) for {who}; "
        )
        members = f"'fgpu queue set {DEFAULT_QUEUE} --member NAME' (repeat)"
        if rest >= default.quota.gpu_milli:  # no other queue has a quota yet: nothing to leave
            return [
                head + f"give the team queues quotas ('fgpu queue set {created} --quota N'), "
                f"then narrow {DEFAULT_QUEUE} to what they leave ('fgpu queue set "
                f"{DEFAULT_QUEUE} --quota REST'), and/or to fewer users with {members}"
            ]
        return [
            head + f"narrow it to what the other queues leave, e.g. 'fgpu queue set "
            f"{DEFAULT_QUEUE} --quota {gpus(rest)}', and/or to fewer users with {members}"
        ]

    def update_queue(self, caller: Caller, name: str, body: QueueBody) -> QueueView:
        """Change a queue (admins). Raises BadRequest, NotFoundError, Forbidden."""
        config = queue_config(body, name)
        self._queue_change(caller, lambda: self.store.update_queue(config), config)
        self._enforce()  # a new quota may move running work in or out of it (issue 25)
        return self._queue_named(name).model_copy(update={"warnings": self._warnings()})

    def _warnings(self) -> list[str]:
        """Warnings about the queue configuration as it now stands (GPUs only: queues are
        configured in GPUs here)."""
        capacity = Resources(gpu_milli=self._capacity_milli())
        return [w for w in config_warnings(self._queue_tree(), capacity) if " GPU" in w]

    def delete_queue(self, caller: Caller, name: str) -> None:
        """Remove an empty queue (admins). Raises NotFoundError, Conflict, Forbidden."""
        if name == DEFAULT_QUEUE and self._is_admin(caller):  # others: 403 from the change
            raise Conflict("name", f"the {DEFAULT_QUEUE!r} queue is where plain submissions go")
        self._queue_change(caller, lambda: self.store.delete_queue(name))

    def list_queues(self) -> list[QueueView]:
        """Every queue with its quota, fair share and use."""
        active: dict[str, list[WorkloadRecord]] = {}
        for r in self._active_records():
            active.setdefault(r.queue, []).append(r)
        return [self._queue_view(q, active.get(q.name, [])) for q in self.store.list_queues()]

    def _queue_view(self, record: QueueRecord, active: list[WorkloadRecord]) -> QueueView:
        last = self._last
        fair = last.fair_share.get(record.name) if last else None
        return views.queue(
            record, active, fair.gpu_milli if fair else 0, self.config.preempt_delay_s
        )

    def _queue_named(self, name: str) -> QueueView:
        try:
            record = self.store.get_queue(name)
        except NotFound:
            raise NotFoundError("name", f"no queue {name!r}") from None
        return self._queue_view(record, [r for r in self._active_records() if r.queue == name])

    # ---------------------------------------------------------------- nodes, events
    def nodes(self) -> list[NodeView]:
        """Nodes and GPUs with the shares they hold and, where known, live use."""
        running = [r for r in self._active_records() if r.holds_allocation]
        live = read_live(self.backend, self.enforcement, dict(self._handles))
        layers = self.enforcement.layers()
        kind = self.backend.kind
        host = views.host_limit_layers(self.host_limits.support)
        shared = [
            views.node(
                node, self.machine.devices[node.name], running, live, kind, layers
            ).model_copy(update={"host_limits": host})
            for node in self.machine.nodes
        ]
        if not self.mig.gpus:
            return shared
        mig_layer = [
            EnforcementLayer(
                name="mig",
                active=True,
                why="MIG instances: memory and compute isolated by the hardware",
            )
        ]
        try:
            pool = views.mig_node(
                self.mig, running, live.gpu_used_mib, live.utilization, self.backend.kind
            )
            pool = views.with_enforcement(pool, {g.uuid: mig_layer for g in pool.gpus})
            pool = pool.model_copy(update={"host_limits": host})
            return [*shared, pool]
        except Exception:  # a device error must not take the whole listing down
            log.exception("reading the MIG instances failed")
            return shared

    def change_token(self) -> tuple[object, ...]:
        """A value that changes whenever a listing may show something new, live figures
        apart: a workload written, the queues changed, a round's wait reasons or fair
        shares. No store read (the dashboard asks several times a second)."""
        last = self._last
        fair = sorted((q, r.gpu_milli) for q, r in last.fair_share.items()) if last else []
        reasons = sorted(self._reasons.items())
        return (self.metrics.writes, self._queue_tree(), tuple(reasons), tuple(fair))

    def events(
        self,
        after_id: int | None = None,
        limit: int = 1000,
        caller: Caller | None = None,
        all_users: bool = False,
    ) -> list[EventView]:
        """Events after ``after_id`` (all when None), oldest first, at most ``limit``.

        A caller who is not an admin gets the events of their own workloads and those of no
        workload (queue and node changes) unless ``all_users``: users see all work
        (DESIGN.md section 5), but one user's event flood is not pushed to every other
        user. Admins (and ``caller`` None: the dashboard) get everyone's. Like events of
        one workload close together come as one with a count (``fgpu serve
        --event-interval``).

        Raises:
            BadRequest: ``limit`` outside 1..10000.
        """
        if limit < 1 or limit > 10_000:
            raise BadRequest("limit", "must be between 1 and 10000")
        scoped = caller is not None and not all_users and not self._is_admin(caller)
        visible = caller.uid if scoped and caller is not None else None
        return [
            views.event(e)
            for e in self.store.events(after_id=after_id, limit=limit, visible_to=visible)
        ]


__all__ = [
    "DEFAULT_QUEUE",
    "Caller",
    "Service",
    "claim_state_dir",
    "default_state_dir",
]
