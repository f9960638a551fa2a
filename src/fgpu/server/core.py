"""The single-machine service's state and composition (:class:`ServiceCore`), the base of
:class:`fgpu.server.service.Service`; see :mod:`fgpu.server.service` for the whole."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self, TypeVar

import numpy as np

from fgpu.agent.backend import GpuBackend, SimulatedBackend, detect_backend, mig_devices_of
from fgpu.agent.hostlimits import HostLimiter
from fgpu.agent.launcher import Launcher
from fgpu.agent.process import ProcessHandle
from fgpu.disk_room import DiskReserve
from fgpu.log_files import DEFAULT_MAX_LOG_BYTES
from fgpu.mig.device import MigDevice
from fgpu.model.types import Request
from fgpu.plugins import DEFAULT_POLICY, create_policy
from fgpu.rules.errors import NotFoundError
from fgpu.sched.decide import Decision, Scheduler, SchedulerConfig
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.rounds import FALLBACK_TARGET
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import Hold, QueueTree, Resources, Workload
from fgpu.server.enforcement import Enforcement, EnforcementConfig
from fgpu.server.enforcing import EnforcementHooks
from fgpu.server.eventwords import as_listed
from fgpu.server.interposing import FakeDriver, fake_driver_for, interposer_segments
from fgpu.server.machine import Machine, discover
from fgpu.server.metrics import ServiceMetrics
from fgpu.server.mig_pool import MigPool
from fgpu.server.naming import resolve
from fgpu.server.output_limits import OutputLedger
from fgpu.server.storage import DEFAULT_BALLAST_BYTES, Ballast, StorageCheck
from fgpu.server.usage import UsageLedger
from fgpu.store import Store
from fgpu.store.claim import DatabaseClaim, LockHeld, claim_database, hold_lock_file
from fgpu.store.errors import NotFound, StoreConflict, StoreUnwritable
from fgpu.store.records import (
    ACTIVE_PHASES,
    EVERYONE,
    QueueConfig,
    QueueRecord,
    WorkloadRecord,
    to_core,
)

T = TypeVar("T")

log = logging.getLogger("fgpu.server")


DEFAULT_QUEUE = "default"


class _Tracked:
    """The store's workload writes, each followed by an update of the service's mirror."""

    def __init__(self, service: ServiceCore) -> None:
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


class ServiceCore(EnforcementHooks):
    """The state and composition of the single-machine service: the store and the mirror of
    its active workloads (every write goes through ``_tracked``), the machine's inventory,
    the loop's wake-up, and who is an admin. The parts of
    :class:`fgpu.server.service.Service` build on it, each in its own module:
    :class:`~fgpu.server.processes.ProcessControl` (start, stop, exits),
    :class:`~fgpu.server.recovery.Recovery` (after a restart),
    :class:`~fgpu.server.loop.SchedulingLoop` (rounds) and the use-cases.

    Args:
        store: the store (state of record).
        backend: GPU backend.
        launcher: process launcher.
        state_dir: folder for logs and process handles.
        policy: placement policy name (``fgd`` learns its target from recent submissions).
        admins: uids allowed to manage queues and other users' work (root always is).
        config: decision-core knobs (default :class:`SchedulerConfig`'s, which preempts at
            once; ``fgpu serve`` passes ``--preempt-delay``, 5 minutes by default, as
            ``preempt_delay_s``).
        agent_socket: where workloads send activity hints (``FGPU_AGENT_SOCKET``); empty:
            none.
        clock: time source (seconds).
        mig_devices: the MIG devices of the backend's GPUs in MIG mode (the MIG pool).
        enforcement: governor and memory guard settings (default: fair, pause, kill).
        fake_driver: the fake CUDA driver the workloads use, if any.
        suspend_host_memory_mib: host memory for suspended work, MiB, shared among the
            machine's nodes like its memory (0: suspend off; :mod:`fgpu.server.suspending`).
        disk_ballast: bytes of the state folder's ballast, released to record cancels and
            ends on a full disk (:class:`fgpu.server.storage.Ballast`; 0: none). Allocated
            by :meth:`create`.
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
        suspend_host_memory_mib: int = 0,
        disk_ballast: int = 0,
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
        self.fake_driver = fake_driver
        self.machine: Machine = discover(backend, suspend_host_memory_mib=suspend_host_memory_mib)
        self._workloads_suspendable = False  # the workloads' driver can checkpoint them
        self._evict_kinds: dict[str, str] = {}  # victims being evicted: preemption or reclaim
        self._evict_by: dict[str, str] = {}  # victims being evicted: their preemptor's id
        self.mig = MigPool(self.machine.mig_gpus, mig_devices, self.machine.mig_node)
        self._lock = threading.RLock()
        self._handles: dict[str, ProcessHandle] = {}
        self._terminating: set[str] = set()  # ids with a stop sequence under way
        self._pidfds: dict[str, int] = {}
        self._reasons: dict[str, str] = {}
        self._last: Decision | None = None
        self._saved_holds: dict[str, Hold] | None = None  # the holds as stored (loop.py)
        self._target_key: tuple[Request, ...] | None = None
        self._scheduler = self._make_scheduler(FALLBACK_TARGET)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._round_s = 0.0
        self._active: dict[str, Workload] | None = None
        self._records: dict[str, WorkloadRecord] = {}  # the mirror's records, as stored
        self._mig_active: dict[str, WorkloadRecord] = {}  # MIG workloads (in the same mirror)
        # the mirror's names: (owner uid, name) -> ids of the owner's active workloads of
        # that name, and (owner uid, array name) -> array id -> its active tasks
        self._named: dict[tuple[int, str], set[str]] = {}
        self._arrays: dict[tuple[int, str], dict[str, int]] = {}
        self._mirror_lock = threading.Lock()
        self._names_lock = threading.Lock()  # a name's check and its submission, together
        self._tracked = _Tracked(self)
        self.usage = UsageLedger(store.usage_totals)
        """What each user holds (active workloads, stored bytes), kept with the mirror."""
        self._state_lock: IO[str] | None = None
        self._db_claim: DatabaseClaim | None = None
        self._tree: QueueTree | None = None
        self._queues: dict[str, QueueRecord] | None = None
        self._empty = ClusterState(self.machine.nodes)
        self._background: set[asyncio.Task[object]] = set()
        self._fail_reasons: dict[str, str] = {}  # stopped by the memory guard: why
        # ends seen while the store could not write: id -> (exit code, why, when); written
        # by the retry task (ProcessControl._flush_exits) once the store can write
        self._unrecorded: dict[str, tuple[int | None, str | None, float]] = {}
        self.storage = StorageCheck(
            store,
            [state_dir],
            ballast=Ballast(state_dir, disk_ballast),
            reserve=getattr(launcher, "disk_reserve", None),
        )
        self.output = OutputLedger(self.log_dir, store.owner_workloads)
        """Output stored per user; its ``max_bytes`` is ``fgpu serve --max-output-bytes``."""
        self.metrics = ServiceMetrics(self)
        self._register_inventory()
        shared = {
            d.uuid: d.memory_mib for devices in self.machine.devices.values() for d in devices
        }
        settings = enforcement or EnforcementConfig()
        segments, interposer_note = interposer_segments(settings, backend, state_dir, fake_driver)
        # one cgroup subtree per state folder: two services never thaw each other's work
        cgroup_name = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
        self.enforcement = Enforcement(
            backend,
            shared,
            agent_socket=Path(agent_socket) if agent_socket else None,
            config=settings,
            record=self._store_agent_event,
            kill=self._kill_over_quota,
            cgroup_name=cgroup_name,
            segments=segments,
            fake_driver=fake_driver,
            interposer_off_reason=interposer_note,
        )
        self.enforcement.events.subscribe(self.metrics.agent_event)
        # --cpu and --memory as limits where the cgroups allow (fgpu nodes says when not)
        self.host_limits = HostLimiter(cgroup_name)
        self.host_limits.sweep()
        self.host_limits.remove_empty_neighbours()

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
        suspend_host_memory_mib: int = 0,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        disk_reserve: DiskReserve | None = None,
        disk_ballast: int = DEFAULT_BALLAST_BYTES,
    ) -> Self:
        """The composition root: store, GPU backend, launcher (default: a new
        :class:`Launcher`), service.

        ``agent_socket`` defaults to ``agent.sock`` in the state folder (reachable by
        workloads of the server's own user only; ``fgpu serve`` puts it beside the API
        socket instead). ``max_log_bytes``: each log of a workload keeps about that many
        bytes (:mod:`fgpu.log_files`; a given ``launcher`` keeps its own).
        ``disk_reserve``: free space of the state disk that workloads' output never takes
        (default :class:`fgpu.disk_room.DiskReserve`'s; a given ``launcher`` keeps its own).
        ``disk_ballast``: see the class; allocated here (a disk without room for it starts
        without, and says so).
        ``fake_driver``: workloads on the simulated GPUs run against the fake CUDA driver
        and NVML (``native/fakecuda``), with the interposer, and the memory guard reads the
        fake NVML.

        Raises:
            ValueError: a bad ``simulate_gpus`` spec or policy name, or ``fake_driver``
                without simulated GPUs.
            StoreDamaged: the database failed its check at start
                (:func:`fgpu.store.engine.check_integrity`); nothing was written to it.
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
            store = Store.open(db if db else folder / "fgpu.db", verify=True)
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
            launcher
            or Launcher(max_log_bytes=max_log_bytes, disk_reserve=disk_reserve or DiskReserve()),
            folder,
            policy=policy,
            admins=admins,
            config=config,
            agent_socket=str(folder / "agent.sock") if agent_socket is None else agent_socket,
            mig_devices=mig_devices_of(backend),
            enforcement=enforcement,
            fake_driver=fake,
            suspend_host_memory_mib=suspend_host_memory_mib,
            disk_ballast=disk_ballast,
        )
        ballast = service.storage.ballast
        if ballast is not None and not ballast.allocate():
            ballast.released_because = "no room for it when the service started"
            log.error(
                "no room for the disk ballast %s (%d bytes): submissions are refused until "
                "the state disk has room for it (fgpu serve --disk-ballast sets its size)",
                ballast.path,
                ballast.size,
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

    def _workloads(self) -> list[Workload]:
        """Active workloads as the decision core sees them, from the service's mirror.

        The service is the only writer of its store (its state folder is locked), and every
        write goes through :class:`_Tracked`, so the mirror is read from the store once and
        then kept current: a round does not re-read every active workload.
        """
        with self._mirror_lock:
            self._load_mirror()
            assert self._active is not None
            return list(self._active.values())

    def _load_mirror(self) -> None:
        """Read the active workloads into the mirror, the first time (under the mirror's
        lock)."""
        if self._active is None:
            index = self._node_index()
            self._active = {}
            for record in self.store.list_workloads(ACTIVE_PHASES):
                self._mirror(record, index)

    def _active_records(self) -> list[WorkloadRecord]:
        """Active workloads (core and MIG) as stored, in submission order, from the mirror
        (no store read once it is loaded): what listings, ``/metrics`` and the dashboard
        show."""
        with self._mirror_lock:
            self._load_mirror()
            records = list(self._records.values())
        records.sort(key=lambda r: (r.submitted_at, r.id))
        return records

    def _listed(self, text: str) -> str:
        """``text`` in the words of ``fgpu ls``: GPUs as ``node/index``, active workloads as
        ``NAME (ID)``, priorities by class name (:func:`fgpu.server.eventwords.as_listed`)."""
        return self._lister()(text)

    def _lister(self) -> Callable[[str], str]:
        """:meth:`_listed` with the names of GPUs and workloads read once (for a round's
        many texts)."""
        gpus = {
            device.uuid: f"{node}/{index}"
            for node, devices in self.machine.devices.items()
            for index, device in enumerate(devices)
        }
        with self._mirror_lock:
            self._load_mirror()
            names = {r.id: r.name for r in self._records.values()}
        done: dict[str, str] = {}  # many waiting workloads share a reason's text

        def listed(text: str) -> str:
            found = done.get(text)
            if found is None:
                found = done[text] = as_listed(text, gpus, names)
            return found

        return listed

    def _mirror(self, record: WorkloadRecord, index: dict[str, int]) -> None:
        assert self._active is not None
        if record.is_active:
            if record.id not in self._records:
                self._name_taken(record, True)
            self._records[record.id] = record
        elif (earlier := self._records.pop(record.id, None)) is not None:
            self._name_taken(earlier, False)
            self.usage.ended(record.owner_uid, record.queue)
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
            workload = to_core(record, index)
            if self._workloads_suspendable:
                workload = dataclasses.replace(workload, suspendable=True)
            if workload.suspended_on is not None:  # where its memory really came from
                own = self.checkpointed_gpus(record.id, workload.suspended_on)
                if own is not None:
                    workload = dataclasses.replace(workload, suspended_gpus=own)
            self._active[record.id] = workload
        except KeyError:  # placed on a node this machine no longer has: being stopped
            self._active.pop(record.id, None)
            log.warning("workload %s is placed on a node that is gone", record.id)

    def _name_taken(self, record: WorkloadRecord, active: bool) -> None:
        """Keep the mirror's name index: ``record`` became active (True) or ended."""
        key = (record.owner_uid, record.name)
        if active:
            self._named.setdefault(key, set()).add(record.id)
        elif (ids := self._named.get(key)) is not None:
            ids.discard(record.id)
            if not ids:
                del self._named[key]
        array = record.array
        if array is None:
            return
        tasks = self._arrays.setdefault((record.owner_uid, array.name), {})
        left = tasks.get(array.id, 0) + (1 if active else -1)
        if left > 0:
            tasks[array.id] = left
        else:
            tasks.pop(array.id, None)
            if not tasks:
                del self._arrays[(record.owner_uid, array.name)]

    def _active_holders(self, owner_uid: int, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        """Which of ``names`` the owner's active workloads or arrays have: name -> (id,
        phase) (the earliest submitted where several have it; ``(array id, "an array")``
        for an array's name), from the mirror's name index (dictionary lookups, no store
        read; the mirror is loaded first)."""
        found: dict[str, tuple[str, str]] = {}
        with self._mirror_lock:
            self._load_mirror()
            for name in names:
                ids = self._named.get((owner_uid, name))
                if ids:
                    first = min(
                        (self._records[i] for i in ids), key=lambda r: (r.submitted_at, r.id)
                    )
                    found[name] = (first.id, first.phase)
                elif arrays := self._arrays.get((owner_uid, name)):
                    found[name] = (next(iter(arrays)), "an array")
        return found

    def checkpointed_gpus(self, workload_id: str, node: str) -> tuple[int, ...] | None:
        """Overridden where workloads are suspended (:mod:`fgpu.server.suspending`): None."""
        return None

    def _sync(self, record: WorkloadRecord) -> None:
        """Bring the mirror up to date with one written record."""
        with self._mirror_lock:
            if self._active is not None:
                self._mirror(record, self._node_index())

    def _queue_tree(self) -> QueueTree:
        """The queue tree, read again only after a queue change through this service."""
        tree = self._tree
        if tree is None:
            tree = self._tree = QueueTree(q.to_spec() for q in self._queue_records().values())
        return tree

    def _queue_records(self) -> dict[str, QueueRecord]:
        """Every queue as stored, by name: read again only after a queue change through
        this service (:meth:`_queues_changed`)."""
        queues = self._queues
        if queues is None:
            queues = self._queues = {q.name: q for q in self.store.list_queues()}
        return queues

    def _queues_changed(self) -> None:
        """Forget the queues read (a queue change through this service)."""
        self._tree = None
        self._queues = None

    def _node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.machine.nodes)}

    def _freeing(self, write: Callable[[], T]) -> T:
        """Run ``write``, a store write that frees resources (a cancel, a stop, a
        workload's end); when the store cannot take it for want of space, release the
        ballast (:class:`fgpu.server.storage.Ballast`) and run it once more.

        Raises:
            StoreUnwritable: it failed again, or there was no ballast to release.
        """
        try:
            return write()
        except StoreUnwritable as exc:
            ballast = self.storage.ballast
            if ballast is None or not ballast.release(exc.cause):
                raise
        return write()

    def _is_admin(self, caller: Caller) -> bool:
        return caller.admin or caller.uid == 0 or caller.uid in self.admins

    def _get(self, workload_id: str, caller_uid: int | None = None) -> WorkloadRecord:
        """The workload an id, a unique id prefix or a name means
        (:func:`fgpu.server.naming.resolve`; the caller's own names first).

        Raises:
            NotFoundError: nothing fits; BadRequest: several fit (listed).
            RowDamaged: only a damaged row fits (by id, id prefix or name; the caller's
                own first): the error names its id.
        """
        try:
            return self.store.get(workload_id)
        except NotFound:
            pass
        uid = os.geteuid() if caller_uid is None else caller_uid
        records = self.store.list_workloads()
        try:
            return resolve(workload_id, records, uid)
        except NotFoundError:
            fits = [
                d
                for d in self.store.damaged()
                if d.name == workload_id or d.id.startswith(workload_id)
            ]
            if fits:
                fits.sort(key=lambda d: d.owner_uid != uid)
                raise fits[0].error() from None
            raise


__all__ = ["DEFAULT_QUEUE", "Caller", "ServiceCore", "claim_state_dir", "default_state_dir"]
