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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from fgpu.agent.backend import GpuBackend, SimulatedBackend, detect_backend, mig_devices_of
from fgpu.agent.events import AgentEvent
from fgpu.agent.interposer.segment import SegmentError
from fgpu.agent.launcher import Launcher, LaunchError, LaunchSpec
from fgpu.agent.process import ProcessHandle, ProcessState, ProcessStatus
from fgpu.agent.runner import ExitRecord
from fgpu.metrics import fleet_fragmentation
from fgpu.mig.device import MigDevice
from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.plugins import DEFAULT_POLICY, create_policy
from fgpu.sched.budget import QueueBudget
from fgpu.sched.decide import Decision, OutsideUse, Scheduler, SchedulerConfig, allocation_resources
from fgpu.sched.fairshare import config_warnings
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.rounds import FALLBACK_TARGET, state_with, target_for, target_key
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import (
    NON_PREEMPTIBLE_FROM,
    Place,
    Preempt,
    QueueTree,
    Resources,
    Wait,
    Workload,
)
from fgpu.server import views
from fgpu.server.access import check_submission, unknown_members
from fgpu.server.enforcement import Enforcement, EnforcementConfig, Running
from fgpu.server.errors import BadRequest, Conflict, Forbidden, NotFoundError
from fgpu.server.interposing import FakeDriver, fake_driver_for, interposer_segments
from fgpu.server.machine import Machine, discover
from fgpu.server.metrics import ServiceMetrics
from fgpu.server.mig_pool import MigCandidate, MigPool
from fgpu.server.requests import parse_submission, queue_config
from fgpu.store import Store
from fgpu.store.claim import DatabaseClaim, LockHeld, claim_database, hold_lock_file
from fgpu.store.errors import NotFound, PermissionDenied, StoreConflict
from fgpu.store.records import (
    ACTIVE_PHASES,
    CANCELLED,
    EVERYONE,
    FAILED,
    LOST_REASON,
    SUCCEEDED,
    QueueConfig,
    StoredMigInstance,
    WorkloadRecord,
    to_core,
)
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

DEFAULT_QUEUE = "default"
TICK_S = 5.0
"""Slow tick for the time-based rules; everything else wakes the loop directly."""
DEBOUNCE_S = 0.05
"""After a wake-up the loop waits this long so that a burst of submissions or exits is
decided in one round instead of one round each."""


class _Tracked:
    """The store's workload writes, each followed by an update of the service's mirror."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Callable[..., WorkloadRecord]:
        method = getattr(self._service.store, name)

        def write(*args: Any, **kwargs: Any) -> WorkloadRecord:
            record: WorkloadRecord = method(*args, **kwargs)
            self._service._sync(record)
            self._service.metrics.wrote(name, record)
            return record

        return write


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls: the uid from the socket's peer credentials (or the token's owner)."""

    uid: int
    admin: bool


def claim_state_dir(folder: Path) -> IO[str]:
    """Hold an exclusive lock on ``folder/fgpu.lock`` for the life of this process.

    Two services on one state folder would both recover and launch the same work.

    Raises:
        ValueError: another process holds it (names its pid).
    """
    try:
        return hold_lock_file(folder / "fgpu.lock")
    except LockHeld as held:
        raise ValueError(
            f"--state-dir: another fgpu serve (pid {held.holder}) uses {folder}"
        ) from None


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/fgpu`` or ``~/.local/state/fgpu`` (``/var/lib/fgpu`` as root)."""
    if os.geteuid() == 0 and "XDG_STATE_HOME" not in os.environ:
        return Path("/var/lib/fgpu")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fgpu"


class Service:
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
    """

    def __init__(
        self,
        store: Store,
        backend: GpuBackend,
        launcher: Launcher,
        state_dir: Path,
        *,
        policy: str = DEFAULT_POLICY,
        admins: frozenset[int] = frozenset(),
        config: SchedulerConfig | None = None,
        agent_socket: str = "",
        clock: Callable[[], float] = time.time,
        mig_devices: Sequence[MigDevice] = (),
        enforcement: EnforcementConfig | None = None,
        fake_driver: FakeDriver | None = None,
    ) -> None:
        create_policy(policy, target=FALLBACK_TARGET)  # fail early on a bad name
        self.store = store
        self.backend = backend
        self.launcher = launcher
        self.state_dir = state_dir
        self.log_dir = state_dir / "logs"
        self.policy_name = policy
        self.admins = admins
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.machine: Machine = discover(backend)
        self.mig = MigPool(self.machine.mig_gpus, mig_devices, self.machine.mig_node)
        self._lock = threading.RLock()
        self._handles: dict[str, ProcessHandle] = {}
        self._terminating: set[str] = set()  # ids with a stop sequence under way
        self._pidfds: dict[str, int] = {}
        self._reasons: dict[str, str] = {}
        self._last: Decision | None = None
        self._target_key: tuple[Request, ...] | None = None
        self._scheduler = self._make_scheduler(FALLBACK_TARGET)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._round_s = 0.0
        self._active: dict[str, Workload] | None = None
        self._mig_active: dict[str, WorkloadRecord] = {}  # MIG workloads (in the same mirror)
        self._mirror_lock = threading.Lock()
        self._tracked = _Tracked(self)
        self._state_lock: IO[str] | None = None
        self._db_claim: DatabaseClaim | None = None
        self._tree: QueueTree | None = None
        self._empty = ClusterState(self.machine.nodes)
        self._background: set[asyncio.Task[object]] = set()
        self._fail_reasons: dict[str, str] = {}  # stopped by the memory guard: why
        self.metrics = ServiceMetrics(self)
        self._register_inventory()
        shared = {
            d.uuid: d.memory_mib for devices in self.machine.devices.values() for d in devices
        }
        settings = enforcement or EnforcementConfig()
        segments, interposer_note = interposer_segments(settings, backend, state_dir, fake_driver)
        self.enforcement = Enforcement(
            backend,
            shared,
            agent_socket=Path(agent_socket) if agent_socket else None,
            config=settings,
            record=self._store_agent_event,
            kill=self._kill_over_quota,
            # one cgroup subtree per state folder: two services never thaw each other's work
            cgroup_name=hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12],
            segments=segments,
            fake_driver=fake_driver,
            interposer_off_reason=interposer_note,
        )
        self.enforcement.events.subscribe(self.metrics.agent_event)

    # ----------------------------------------------------------------- composition
    @classmethod
    def create(
        cls,
        *,
        db: str | None = None,
        simulate_gpus: str | None = None,
        policy: str = DEFAULT_POLICY,
        state_dir: Path | None = None,
        admins: frozenset[int] = frozenset(),
        agent_socket: str | None = None,
        config: SchedulerConfig | None = None,
        enforcement: EnforcementConfig | None = None,
        fake_driver: bool = False,
        launcher: Launcher | None = None,
    ) -> Service:
        """The composition root: store, GPU backend, launcher (default: a new
        :class:`Launcher`), service.

        ``agent_socket`` defaults to ``agent.sock`` in the state folder (reachable by
        workloads of the server's own user only; ``fgpu serve`` puts it beside the API
        socket instead). ``fake_driver``: workloads on the simulated GPUs run against the
        fake CUDA driver and NVML (``native/fakecuda``), with the interposer, and the memory
        guard reads the fake NVML.

        Raises:
            ValueError: a bad ``simulate_gpus`` spec or policy name, or ``fake_driver``
                without simulated GPUs.
        """
        create_policy(policy, target=FALLBACK_TARGET)  # bad input first: nothing created
        backend = detect_backend(simulate_gpus, log)
        folder = state_dir or default_state_dir()
        fake = fake_driver_for(backend, folder) if fake_driver else None
        if fake is not None:
            from fgpu.agent.fakegpu import FakeDriverBackend

            assert isinstance(backend, SimulatedBackend)
            backend = FakeDriverBackend.wrap(backend, fake.driver_dir, fake.state_file)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # logs, environments and the database are the users' business
        lock = claim_state_dir(folder)
        try:
            store = Store.open(db if db else folder / "fgpu.db")
        except BaseException:
            lock.close()
            raise
        try:
            claim = claim_database(store.engine)
        except StoreConflict as exc:
            store.close()
            lock.close()
            raise ValueError(f"--db: {exc}") from None
        if isinstance(backend, SimulatedBackend) and backend.mig_devices():
            # simulated MIG instances outlive a restart of the service, as real ones do
            for note in backend.keep_mig_state(folder / "simulated-mig.json"):
                log.warning("simulated MIG GPUs: %s", note)
        service = cls(
            store,
            backend,
            launcher or Launcher(),
            folder,
            policy=policy,
            admins=admins,
            config=config,
            agent_socket=str(folder / "agent.sock") if agent_socket is None else agent_socket,
            mig_devices=mig_devices_of(backend),
            enforcement=enforcement,
            fake_driver=fake,
        )
        service._state_lock = lock
        service._db_claim = claim
        return service

    def _register_inventory(self) -> None:
        from fgpu.store.records import GpuRecord, NodeRecord

        mig = [
            NodeRecord(
                self.mig.node_name,
                0,
                0,
                tuple(
                    GpuRecord(
                        g.device.index, g.device.uuid, g.device.model, g.device.memory_mib, True
                    )
                    for g in self.mig.gpus
                ),
            )
        ]
        self.store.sync_nodes(
            [
                NodeRecord(
                    node.name,
                    node.cpu_milli,
                    node.memory_mib,
                    tuple(
                        GpuRecord(i, d.uuid, d.model, d.memory_mib, d.mig_enabled)
                        for i, d in enumerate(self.machine.devices[node.name])
                    ),
                )
                for node in self.machine.nodes
            ]
            + (mig if self.mig.gpus else [])
        )
        capacity = self._capacity_milli()
        self.store.ensure_queue(
            QueueConfig(DEFAULT_QUEUE, quota=Resources(gpu_milli=capacity), members=(EVERYONE,))
        )

    def _capacity_milli(self) -> int:
        """Milli-GPU of the machine: shared GPUs and the MIG pool."""
        return sum(n.gpu_count for n in self.machine.nodes) * 1000 + self.mig.capacity_milli()

    def _make_scheduler(self, target: TargetWorkload) -> Scheduler:
        policy = create_policy(self.policy_name, target=target, rng=np.random.default_rng(0))
        return Scheduler(policy, self.config)

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
        self.wake()

    async def stop(self) -> None:
        """Stop the loop; running workloads keep running and are re-adopted next start."""
        self._stopping = True
        self.wake()
        if self._task is not None:
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
        self.store.close()
        if self._db_claim is not None:
            self._db_claim.release()
            self._db_claim = None
        if self._state_lock is not None:
            self._state_lock.close()
            self._state_lock = None

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopping

    def wake(self) -> None:
        """Ask for a scheduling round soon (thread-safe).

        A wake-up already pending is enough: the loop clears it before the round reads the
        mirror, and the caller's write reached the mirror before this check.
        """
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not wake.is_set() and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def _run_loop(self) -> None:
        assert self._wake is not None
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
            except Exception:  # keep serving; the error is a bug to fix, not to hide
                log.exception("scheduling round failed")

    # --------------------------------------------------------------- scheduling
    def schedule_once(self) -> Decision:
        """One scheduling round: decide, record, act. Returns the decision."""
        with self._lock:
            decision = self.plan()
            if self._last is None or decision.warnings != self._last.warnings:
                for warning in decision.warnings:
                    log.warning("queues: %s", warning)
            self.store.save_holds(decision.holds)
            self._last = decision
            reasons = {a.workload: a.reason for a in decision.actions if isinstance(a, Wait)}
            for action in decision.actions:
                if isinstance(action, Place):
                    self._start(action.workload, action.allocation)
                elif isinstance(action, Preempt):
                    self._stop(action.victim, action.reason)
                    self.metrics.events.preempted(action.kind)
            try:
                reasons.update(self._schedule_mig())
            except Exception:  # a device error; the core's round stands, the next one retries
                log.exception("MIG pass failed")
            self._reasons = reasons
            return decision

    def _schedule_mig(self) -> dict[str, str]:
        """The MIG pass after the core's round (:meth:`MigPool.schedule`): start what it
        places, record the changes it made; returns why the others wait."""
        with self._mirror_lock:
            records = list(self._mig_active.values())
        pending = [r for r in records if r.phase == "pending" and r.mig_request is not None]
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
        for place in result.places:
            self._start(place.workload, place.allocation, mig=place.instance, reason=place.reason)
        return result.waits

    def plan(self) -> Decision:
        """Read the store and ask the decision core, without acting (what a round decides)."""
        now = self.clock()
        workloads = self._workloads()
        state = state_with(  # a misfit is settled by _recover; never stop deciding
            self.machine.nodes,
            workloads,
            lambda w, _: log.error("workload %s holds GPUs this machine lacks; skipped", w.id),
        )
        self._refresh_target(workloads)
        tree = self._queue_tree()
        holds = self.store.load_holds()
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

    def _workloads(self) -> list[Workload]:
        """Active workloads as the decision core sees them, from the service's mirror.

        The service is the only writer of its store (its state folder is locked), and every
        write goes through :class:`_Tracked`, so the mirror is read from the store once and
        then kept current: a round does not re-read every active workload.
        """
        with self._mirror_lock:
            if self._active is None:
                index = self._node_index()
                self._active = {}
                for record in self.store.list_workloads(ACTIVE_PHASES):
                    self._mirror(record, index)
            return list(self._active.values())

    def _mirror(self, record: WorkloadRecord, index: dict[str, int]) -> None:
        assert self._active is not None
        if record.mig_request is not None:  # the MIG pass's, never the core's
            if record.is_active:
                self._mig_active[record.id] = record
            else:
                self._mig_active.pop(record.id, None)
            return
        if not record.is_active:
            self._active.pop(record.id, None)
            return
        try:
            self._active[record.id] = to_core(record, index)
        except KeyError:  # placed on a node this machine no longer has: being stopped
            self._active.pop(record.id, None)
            log.warning("workload %s is placed on a node that is gone", record.id)

    def _sync(self, record: WorkloadRecord) -> None:
        """Bring the mirror up to date with one written record."""
        with self._mirror_lock:
            if self._active is not None:
                self._mirror(record, self._node_index())

    def _queue_tree(self) -> QueueTree:
        """The queue tree, read again only after a queue change through this service."""
        tree = self._tree
        if tree is None:
            tree = self._tree = self.store.queue_tree()
        return tree

    def _node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.machine.nodes)}

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
        )
        try:
            handle = self.launcher.launch(spec)
        except LaunchError as exc:
            self._tracked.mark_finished(workload_id, FAILED, reason=f"could not launch: {exc}")
            return
        except Exception as exc:  # never leave a placement without a process
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
            self._tracked.mark_finished(
                workload_id,
                FAILED,
                reason=f"could not record its process: {type(exc).__name__}: {exc}",
            )
            return
        self._watch(handle)
        self._enforce()

    def _stop(self, workload_id: str, reason: str) -> None:
        """Record the stop, then signal the process (grace period, then SIGKILL).

        The grace period runs from the recorded stop request, also across a restart of the
        service (a stop resumed by recovery waits only what is left of it).
        """
        record = self.store.get(workload_id)
        if record.stop_requested_at is None:
            record = self._tracked.mark_stopping(workload_id, reason)
        handle = self._handles.get(workload_id)
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
        if state.status is ProcessStatus.LOST and self.launcher.signal(handle, signal.SIGKILL):
            # the wrapper died (killed from outside); what it ran must not keep the GPU
            reason = f"{reason}; its remaining processes were killed"
        with self._lock:
            self._handles.pop(workload_id, None)
            self._record_end(workload_id, state.exit_code, reason)
        self._enforce()
        self.wake()

    def _record_end(
        self, workload_id: str, code: int | None, why: str | None, at: float | None = None
    ) -> None:
        """Record how a running workload's process ended (``at``: when, if known; else
        now)."""
        try:
            record = self.store.get(workload_id)
        except NotFound:
            return
        if record.phase not in ("running", "paused"):
            return
        over_quota = self._fail_reasons.pop(workload_id, None)
        if over_quota is not None:
            self._tracked.mark_finished(
                workload_id, FAILED, exit_code=code, reason=over_quota, finished_at=at
            )
        elif record.cancelled_by is not None:
            self._tracked.mark_finished(
                workload_id, CANCELLED, exit_code=code, reason=record.reason, finished_at=at
            )
        elif record.stop_requested_at is not None:
            self._tracked.mark_preempted(workload_id, record.reason or "preempted")
        elif code == 0:
            self._tracked.mark_finished(
                workload_id, SUCCEEDED, exit_code=0, reason="exit code 0", finished_at=at
            )
        elif code is None:
            self._tracked.mark_finished(
                workload_id, FAILED, reason=why or "ended without an exit code", finished_at=at
            )
        else:
            detail = f"exit code {code}" + (f" ({why})" if why else "")
            self._tracked.mark_finished(
                workload_id, FAILED, exit_code=code, reason=detail, finished_at=at
            )

    # ------------------------------------------------------------ on the GPU
    def _enforce(self) -> None:
        """Hand the governor and the memory guard the running shared-GPU workloads."""
        running = []
        for record in self.store.list_workloads(("running", "paused")):
            handle = self._handles.get(record.id)
            a = record.allocation
            if handle is None or a is None or a.mig is not None or not a.gpu_uuids:
                continue
            if record.id in self._terminating:
                continue
            running.append(
                Running(
                    workload_id=record.id,
                    handle=handle,
                    gpu_uuids=tuple(a.gpu_uuids),
                    compute_milli=tuple(a.gpu_milli),
                    memory_mib=tuple(a.gpu_memory_mib),
                    priority=record.priority,
                )
            )
        self.enforcement.sync(running)

    def _kill_over_quota(self, workload_id: str, message: str) -> None:
        """The memory guard's ``kill``: remember why, thaw, SIGKILL (the exit is recorded as
        failed with ``message``)."""
        handle = self._handles.get(workload_id)
        if handle is None:
            return
        self._fail_reasons[workload_id] = f"stopped: {message}"
        self.enforcement.before_signal(workload_id)
        self.launcher.signal(handle, signal.SIGKILL)

    def _store_agent_event(self, event: AgentEvent) -> None:
        self.store.record_event(event.workload_id, event.kind, event.reason, event.message)

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

    # ------------------------------------------------------------------ use-cases
    def _is_admin(self, caller: Caller) -> bool:
        return caller.admin or caller.uid == 0 or caller.uid in self.admins

    def submit(self, caller: Caller, body: SubmitRequest) -> WorkloadView:
        """Validate and store a submission, then wake the loop.

        Raises:
            BadRequest: invalid input, an unknown or non-leaf queue, or a request that can
                never fit this machine (with the per-node reason).
            Forbidden: the caller is not a member of the queue, or asks for a priority or
                non-preemptible work the queue does not grant its members
                (:func:`fgpu.server.access.check_submission`).
        """
        sub = parse_submission(body)
        request = sub.request
        if sub.mig_request is not None:
            request = self.mig.request_for(sub.mig_request)
        assert request is not None
        tree = self._queue_tree()
        if body.queue not in tree:
            known = ", ".join(sorted(tree.specs))
            raise BadRequest("queue", f"unknown queue {body.queue!r}; queues: {known}")
        if body.queue not in tree.leaves:
            raise BadRequest("queue", f"queue {body.queue!r} has child queues; submit to a leaf")
        try:
            queue = self.store.get_queue(body.queue).config
        except NotFound:  # removed since the tree was read
            raise BadRequest("queue", f"unknown queue {body.queue!r}") from None
        check_submission(
            queue,
            caller.uid,
            admin=self._is_admin(caller),
            priority=sub.priority,
            preemptible=body.preemptible,
        )
        if sub.mig_request is None:
            self._check_could_fit(request)
        try:
            record = self._tracked.submit(
                owner_uid=caller.uid,
                queue=body.queue,
                request=request,
                argv=sub.argv,
                name=sub.name,
                priority=sub.priority,
                preemptible=body.preemptible,
                shell=body.shell,
                cwd=body.cwd,
                env=body.env,
                grace_s=body.grace_s,
                mig_request=sub.mig_request,
            )
        except InvalidRequestError as exc:
            raise BadRequest(exc.field, exc.reason) from None
        self.wake()
        return views.workload(record, self._reasons.get(record.id))

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
        phases = None if include_done else ACTIVE_PHASES
        return [
            views.workload(r, self._reasons.get(r.id)) for r in self.store.list_workloads(phases)
        ]

    def get_workload(self, workload_id: str) -> WorkloadDetail:
        """One workload with its events and, while pending, why it waits.

        Raises:
            NotFoundError: unknown id.
        """
        record = self._get(workload_id)
        events = self.store.events(workload_id)
        detail = views.detail(record, self._reasons.get(workload_id), events)
        if record.phase in ("running", "paused"):
            detail.enforcement = self.enforcement.describe(workload_id)
        return detail

    def cancel(self, caller: Caller, workload_id: str) -> WorkloadView:
        """Cancel: pending ones at once, running ones are stopped (grace, then SIGKILL).

        Raises:
            NotFoundError, Forbidden, Conflict: unknown, another user's, already finished.
        """
        with self._lock:
            try:
                record = self._tracked.cancel(workload_id, caller.uid, admin=self._is_admin(caller))
            except NotFound:
                raise NotFoundError("id", f"no workload {workload_id!r}") from None
            except PermissionDenied as exc:
                raise Forbidden("id", str(exc)) from None
            except StoreConflict as exc:
                raise Conflict("id", str(exc)) from None
            if record.phase in ("running", "paused"):
                self._stop(workload_id, record.reason)
        self.wake()
        return views.workload(record, None)

    def log_path(self, caller: Caller, workload_id: str, stream: str) -> Path:
        """The workload's stdout or stderr log file (its owner's and admins' to read).

        Raises:
            NotFoundError: unknown id; BadRequest: stream not stdout/stderr; Forbidden:
                another user's workload.
        """
        if stream not in ("stdout", "stderr"):
            raise BadRequest("stream", "must be stdout or stderr")
        record = self._get(workload_id)
        if record.owner_uid != caller.uid and not self._is_admin(caller):
            raise Forbidden(
                "id",
                f"workload {workload_id} belongs to uid {record.owner_uid}; its logs are "
                "its owner's",
            )
        return self.log_dir / workload_id / f"{stream}.log"

    def _get(self, workload_id: str) -> WorkloadRecord:
        try:
            return self.store.get(workload_id)
        except NotFound:
            raise NotFoundError("id", f"no workload {workload_id!r}") from None

    # -------------------------------------------------------------------- queues
    def _queue_change(
        self, caller: Caller, change: Callable[[], object], config: QueueConfig | None = None
    ) -> None:
        if not self._is_admin(caller):
            raise Forbidden("queue", f"uid {caller.uid} may not manage queues (root or --admin)")
        unknown = unknown_members(config.members) if config is not None else []
        if unknown:
            raise BadRequest(
                "members",
                f"no user or group {', '.join(unknown)} on this machine (a group is written "
                "@name; numeric uids and gids are taken as they are)",
            )
        try:
            with self._lock:
                self._tree = None
                change()
                self._tree = None
        except InvalidRequestError as exc:
            raise BadRequest(exc.field, exc.reason) from None
        except NotFound as exc:
            raise NotFoundError("name", str(exc)) from None
        except StoreConflict as exc:
            raise Conflict("name", str(exc)) from None
        self.wake()

    def create_queue(self, caller: Caller, body: QueueBody) -> QueueView:
        """Create a queue (admins). Raises BadRequest, Conflict, Forbidden."""
        config = queue_config(body)
        self._queue_change(caller, lambda: self.store.create_queue(config), config)
        return self._queue_view(config.name).model_copy(update={"warnings": self._warnings()})

    def update_queue(self, caller: Caller, name: str, body: QueueBody) -> QueueView:
        """Change a queue (admins). Raises BadRequest, NotFoundError, Forbidden."""
        config = queue_config(body, name)
        self._queue_change(caller, lambda: self.store.update_queue(config), config)
        return self._queue_view(name).model_copy(update={"warnings": self._warnings()})

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
        return [self._queue_view(q.name) for q in self.store.list_queues()]

    def _queue_view(self, name: str) -> QueueView:
        try:
            record = self.store.get_queue(name)
        except NotFound:
            raise NotFoundError("name", f"no queue {name!r}") from None
        records = self.store.list_workloads(ACTIVE_PHASES, queue=name)
        last = self._last
        fair = last.fair_share.get(name) if last else None
        return views.queue(record, records, fair.gpu_milli if fair else 0)

    # ---------------------------------------------------------------- nodes, events
    def nodes(self) -> list[NodeView]:
        """Nodes and GPUs with the shares they hold and, where known, live use."""
        running = self.store.list_workloads(("running", "paused"))
        usage: dict[str, int] = {}
        if isinstance(self.backend, SimulatedBackend):  # nothing reported: nothing used
            usage = {d.uuid: 0 for d in self.backend.gpus() if not d.mig_enabled}
        with contextlib.suppress(Exception):
            for proc in self.backend.process_memory():
                usage[proc.gpu_uuid] = usage.get(proc.gpu_uuid, 0) + proc.used_mib
        util: dict[str, int] = {}
        with contextlib.suppress(Exception):
            util = self.backend.utilization()
        governed = self.enforcement.views()
        layers = self.enforcement.layers()
        used = self.enforcement.used_memory(dict(self._handles))
        shared = [
            views.with_enforcement(
                views.with_used_memory(
                    views.with_governor(
                        views.node(
                            node,
                            self.machine.devices[node.name],
                            running,
                            usage,
                            util,
                            self.backend.kind,
                        ),
                        governed,
                    ),
                    used,
                ),
                {d.uuid: layers for d in self.machine.devices[node.name]},
            )
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
            pool = views.mig_node(self.mig, running, usage, util, self.backend.kind)
            pool = views.with_enforcement(pool, {g.uuid: mig_layer for g in pool.gpus})
            return [*shared, pool]
        except Exception:  # a device error must not take the whole listing down
            log.exception("reading the MIG instances failed")
            return shared

    def fragmentation(self) -> float:
        """FGD fragmentation of the machine's GPUs now against the recent submissions, as a
        share of GPU capacity (:func:`fgpu.metrics.fleet_fragmentation`)."""
        workloads = self._workloads()
        state = state_with(self.machine.nodes, workloads, lambda w, _: None)
        return fleet_fragmentation(state, target_for(target_key(workloads)))

    def events(self, after_id: int | None = None, limit: int = 1000) -> list[EventView]:
        """Events after ``after_id`` (all when None), oldest first."""
        if limit < 1 or limit > 10_000:
            raise BadRequest("limit", "must be between 1 and 10000")
        return [views.event(e) for e in self.store.events(after_id=after_id, limit=limit)]


def _preemptible(record: WorkloadRecord) -> bool:
    """The workload's preemptible flag, or the default for its priority."""
    if record.preemptible is not None:
        return record.preemptible
    return record.priority < NON_PREEMPTIBLE_FROM


__all__ = ["Caller", "Service"]
