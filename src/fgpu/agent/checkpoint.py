"""Suspend a workload to host memory and restore it, through the CUDA driver's checkpoint API.

The driver (CUDA 12.8 / driver r570 and later; ``cuda.h`` section "CUDA Checkpointing")
checkpoints a process by pid from another process:

- ``cuCheckpointProcessLock(pid, args)``: RUNNING -> LOCKED; the process's further CUDA
  calls block; ``args.timeoutMs`` bounds the wait for its work in flight
  (``CUDA_ERROR_NOT_READY`` when it passes, the process left RUNNING).
- ``cuCheckpointProcessCheckpoint``: LOCKED -> CHECKPOINTED; device memory contents to host
  memory, the GPU memory released.
- ``cuCheckpointProcessRestore``: CHECKPOINTED -> LOCKED; the memory taken again and filled.
  From CUDA 13 (``cuDriverGetVersion`` >= 13000) ``args.gpuPairs`` (``CUcheckpointGpuPair``:
  old and new GPU UUID, 16 bytes each) restores onto other GPUs: NVIDIA's driver API
  reference says the new GPU must be of the same chip type and have room, and the pairs must
  name every checkpointed GPU. The process keeps its device ordinals, now backed by the new
  GPUs. :attr:`CheckpointDriver.can_remap` says whether the loaded driver takes pairs.
- ``cuCheckpointProcessUnlock``: LOCKED -> RUNNING.
- ``cuCheckpointProcessGetState``: ``CUprocessState`` (0 running, 1 locked, 2 checkpointed,
  3 failed).

:class:`CheckpointDriver` calls them through ctypes on ``libcuda.so.1``: the real driver is
the product path; fgpu's fake driver (``native/fakecuda/checkpoint.c``, a stand-in for tests)
answers the same calls, which is how this module is tested. :func:`probe` says whether the
loaded driver has the API (what makes a workload *suspendable*).

:class:`Suspender` suspends a workload (a set of processes) as one unit: lock every CUDA
process, checkpoint each, then freeze them all (cgroup freezer or ``SIGSTOP``, the governor's
:class:`~fgpu.agent.governor.freezer.Freezer`); restore does the reverse (thaw, restore,
unlock). A process being stopped cannot answer the driver, hence freezing after the
checkpoint and thawing before the restore. Copy times are measured around the checkpoint and
restore calls (wall time, seconds) and returned in :class:`SuspendReport`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_SUPPORTED = 801

STATE_NAMES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
"""``CUprocessState`` values (``cuda.h``)."""

CHECKPOINT_FUNCTIONS = (
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
)

DEFAULT_LOCK_TIMEOUT_MS = 10_000
"""How long a lock waits for the work a process has in flight before giving up."""


class CheckpointError(RuntimeError):
    """A checkpoint call failed.

    Attributes:
        call: the driver function, e.g. ``"cuCheckpointProcessRestore"``.
        pid: the target process.
        code: the ``CUresult``.
    """

    def __init__(self, call: str, pid: int, code: int, name: str) -> None:
        super().__init__(f"{call}(pid {pid}): {name} ({code})")
        self.call = call
        self.pid = pid
        self.code = code

    @property
    def out_of_memory(self) -> bool:
        """Whether the GPU lacked room (restore: try again when memory frees)."""
        return self.code == CUDA_ERROR_OUT_OF_MEMORY


class CheckpointUnsupportedError(RuntimeError):
    """The driver has no checkpoint API (older than CUDA 12.8 / r570), or none loads."""


class _LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class _GpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", _Uuid), ("newUuid", _Uuid)]


class _RestoreArgs(ctypes.Structure):
    """``CUcheckpointRestoreArgs`` of CUDA 13.0's ``cuda.h``: 64 bytes on LP64."""

    _fields_ = [
        ("gpuPairs", ctypes.POINTER(_GpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


REMAP_DRIVER_VERSION = 13000
"""The first ``cuDriverGetVersion`` whose ``cuda.h`` has ``CUcheckpointRestoreArgs.gpuPairs``
(CUDA 13.0; 12.8's restore arguments are all reserved)."""


def uuid_bytes(uuid: str) -> bytes:
    """The 16 bytes of a GPU UUID as NVML and ``nvidia-smi`` print it,
    ``"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"`` (what ``cuDeviceGetUuid`` gives).

    Raises:
        ValueError: ``uuid`` is not of that form (the message echoes it).
    """
    body = uuid[4:] if uuid.startswith("GPU-") else ""
    parts = body.split("-")
    if [len(p) for p in parts] != [8, 4, 4, 4, 12]:
        raise ValueError(f"gpu uuid {uuid!r}: not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    try:
        return bytes.fromhex("".join(parts))
    except ValueError:
        raise ValueError(f"gpu uuid {uuid!r}: not hexadecimal digits") from None


class CheckpointDriver:
    """The checkpoint API of a CUDA driver library, by pid.

    Args:
        library: the driver to load (``libcuda.so.1``: whichever the dynamic loader finds;
            the fake driver when ``LD_LIBRARY_PATH`` names it first).

    Raises:
        CheckpointUnsupportedError: the library does not load, ``cuInit`` fails, or it lacks
            one of :data:`CHECKPOINT_FUNCTIONS`.
    """

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise CheckpointUnsupportedError(f"cannot load {library}: {exc}") from exc
        missing = [name for name in CHECKPOINT_FUNCTIONS if not hasattr(self._lib, name)]
        if missing:
            raise CheckpointUnsupportedError(
                f"{library} has no {', '.join(missing)} (the checkpoint API needs CUDA 12.8, "
                "driver r570 or later)"
            )
        rc = self._lib.cuInit(0)
        if rc != CUDA_SUCCESS:
            raise CheckpointUnsupportedError(f"cuInit on {library}: {self._error_name(rc)}")
        self._mu = threading.Lock()
        version = ctypes.c_int(0)
        rc = self._lib.cuDriverGetVersion(ctypes.byref(version))
        self.driver_version = version.value if rc == CUDA_SUCCESS else 0
        """``cuDriverGetVersion`` (e.g. 13000 for CUDA 13.0); 0 when it failed."""

    @property
    def can_remap(self) -> bool:
        """Whether a restore can go onto other GPUs (``gpuPairs``): driver version >=
        :data:`REMAP_DRIVER_VERSION`."""
        return self.driver_version >= REMAP_DRIVER_VERSION

    def _error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self._lib.cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode()
        return f"CUresult {code}"

    def _call(self, name: str, pid: int, arg: object) -> None:
        rc = getattr(self._lib, name)(ctypes.c_int(pid), arg)
        if rc != CUDA_SUCCESS:
            raise CheckpointError(name, pid, rc, self._error_name(rc))

    def state(self, pid: int) -> str | None:
        """``"running"``, ``"locked"``, ``"checkpointed"`` or ``"failed"``; None when ``pid``
        is not a CUDA process of this driver (the call answers ``CUDA_ERROR_INVALID_VALUE``,
        as the fake driver does, or ``CUDA_ERROR_NOT_FOUND``)."""
        out = ctypes.c_int(-1)
        rc = self._lib.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(out))
        if rc in (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND):
            return None
        if rc != CUDA_SUCCESS:
            raise CheckpointError("cuCheckpointProcessGetState", pid, rc, self._error_name(rc))
        return STATE_NAMES.get(out.value, f"state {out.value}")

    def lock(self, pid: int, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        """RUNNING -> LOCKED (CheckpointError ``CUDA_ERROR_NOT_READY`` after ``timeout_ms``)."""
        self._call("cuCheckpointProcessLock", pid, ctypes.byref(_LockArgs(timeoutMs=timeout_ms)))

    def checkpoint(self, pid: int) -> None:
        """LOCKED -> CHECKPOINTED: device memory to host memory, GPU memory released."""
        self._call("cuCheckpointProcessCheckpoint", pid, None)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] | None = None) -> None:
        """CHECKPOINTED -> LOCKED, on the same GPUs, or with ``gpu_pairs`` (``(old UUID, new
        UUID)`` for every GPU it was checkpointed from) onto the new ones.

        Raises:
            CheckpointError: ``out_of_memory``: no room yet (the process stays checkpointed);
                ``CUDA_ERROR_INVALID_VALUE``: an unknown UUID, a GPU of another model, or a
                checkpointed GPU left out.
            CheckpointUnsupportedError: ``gpu_pairs`` given and the driver cannot remap
                (:attr:`can_remap`).
            ValueError: a UUID not of the ``GPU-xxxxxxxx-...`` form.
        """
        if not gpu_pairs:
            self._call("cuCheckpointProcessRestore", pid, None)
            return
        if not self.can_remap:
            raise CheckpointUnsupportedError(
                f"restore of pid {pid} onto other GPUs: driver version {self.driver_version} "
                f"< {REMAP_DRIVER_VERSION} (CUDA 13) has no gpuPairs"
            )
        pairs = (_GpuPair * len(gpu_pairs))()
        for i, (old, new) in enumerate(gpu_pairs):
            pairs[i].oldUuid.bytes[:] = list(uuid_bytes(old))
            pairs[i].newUuid.bytes[:] = list(uuid_bytes(new))
        args = _RestoreArgs(gpuPairs=pairs, gpuPairsCount=len(gpu_pairs))
        self._call("cuCheckpointProcessRestore", pid, ctypes.byref(args))

    def unlock(self, pid: int) -> None:
        """LOCKED -> RUNNING."""
        self._call("cuCheckpointProcessUnlock", pid, None)


def probe(library: str = "libcuda.so.1") -> tuple[CheckpointDriver | None, str]:
    """``(driver, "")`` when ``library`` has the checkpoint API, else ``(None, reason)``."""
    try:
        return CheckpointDriver(library), ""
    except CheckpointUnsupportedError as exc:
        return None, str(exc)


@dataclass(frozen=True, slots=True)
class SuspendReport:
    """What a suspend or restore did.

    Attributes:
        pids: the CUDA processes checkpointed or restored (others of the workload are only
            frozen / thawed).
        copy_s: wall seconds of the checkpoint (device -> host) or restore (host -> device)
            calls, all processes together.
        total_s: wall seconds of the whole step (lock, copy, freeze / thaw, copy, unlock).
    """

    pids: tuple[int, ...]
    copy_s: float
    total_s: float


class Suspender:
    """Suspends and restores workloads: checkpoint API plus a freeze of their processes.

    Args:
        driver: the checkpoint API.
        freeze: ``freeze(key)`` stops every process of the workload ``key`` and returns once
            they are stopped; ``thaw(key)`` lets them run. The service passes its governor
            freezer's (cgroup freezer or ``SIGSTOP``); None: no freeze (the driver's lock
            alone keeps the processes off the GPU).
        thaw: see ``freeze``.
        lock_timeout_ms: passed to every lock.
        clock: monotonic seconds (tests give a fake one only to read durations).
    """

    def __init__(
        self,
        driver: CheckpointDriver,
        *,
        freeze: Callable[[str], None] | None = None,
        thaw: Callable[[str], None] | None = None,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.driver = driver
        self._freeze = freeze
        self._thaw = thaw
        self._lock_timeout_ms = lock_timeout_ms
        self._clock = clock

    def cuda_pids(self, pids: Sequence[int]) -> list[int]:
        """The members of ``pids`` that are CUDA processes of the driver."""
        return [pid for pid in pids if self.driver.state(pid) is not None]

    def suspend(self, key: str, pids: Sequence[int]) -> SuspendReport:
        """Lock and checkpoint every CUDA process of ``pids``, then freeze workload ``key``.

        All or nothing: on any failure the processes already locked or checkpointed are
        restored and unlocked again (best effort, logged) and the error is raised, so the
        caller can evict instead.

        Raises:
            CheckpointError: a lock or checkpoint failed.
            ValueError: none of ``pids`` is a CUDA process (nothing to checkpoint: the
                memory, if any, would stay on the GPU).
        """
        started = self._clock()
        cuda = self.cuda_pids(pids)
        if not cuda:
            raise ValueError(f"workload {key}: none of pids {list(pids)} is a CUDA process")
        locked: list[int] = []
        checkpointed: list[int] = []
        try:
            for pid in cuda:
                self.driver.lock(pid, self._lock_timeout_ms)
                locked.append(pid)
            copy_start = self._clock()
            for pid in cuda:
                self.driver.checkpoint(pid)
                checkpointed.append(pid)
            copy_s = self._clock() - copy_start
        except CheckpointError:
            self._undo(checkpointed, locked)
            raise
        if self._freeze is not None:
            self._freeze(key)
        return SuspendReport(tuple(cuda), copy_s, self._clock() - started)

    def _undo(self, checkpointed: list[int], locked: list[int]) -> None:
        for pid in checkpointed:
            try:
                self.driver.restore(pid)
            except CheckpointError as exc:
                log.warning("undoing a partial suspend: %s", exc)
        for pid in locked:
            try:
                self.driver.unlock(pid)
            except CheckpointError as exc:
                log.warning("undoing a partial suspend: %s", exc)

    def restore(
        self,
        key: str,
        pids: Sequence[int],
        gpu_pairs: Sequence[tuple[str, str]] | None = None,
    ) -> SuspendReport:
        """Thaw workload ``key``, restore every checkpointed process of ``pids``, unlock them.

        ``gpu_pairs``: ``(old UUID, new UUID)`` of every GPU the workload was checkpointed
        from, to restore onto other GPUs (:meth:`CheckpointDriver.restore`); None: the same
        GPUs.

        Raises:
            CheckpointError: a restore failed; ``out_of_memory`` when its GPU lacks room (the
                processes restored before it are checkpointed again and the workload frozen
                again, so it can be retried later).
        """
        started = self._clock()
        if self._thaw is not None:
            self._thaw(key)
        todo = [pid for pid in pids if self.driver.state(pid) == "checkpointed"]
        done: list[int] = []
        copy_start = self._clock()
        try:
            for pid in todo:
                self.driver.restore(pid, gpu_pairs)
                done.append(pid)
        except (CheckpointError, CheckpointUnsupportedError, ValueError):
            for pid in done:  # back to where it was: all checkpointed, frozen
                try:
                    self.driver.checkpoint(pid)
                except CheckpointError as exc:
                    log.warning("re-checkpointing after a failed restore: %s", exc)
            if self._freeze is not None:
                self._freeze(key)
            raise
        copy_s = self._clock() - copy_start
        for pid in pids:
            if self.driver.state(pid) == "locked":
                self.driver.unlock(pid)
        return SuspendReport(tuple(todo), copy_s, self._clock() - started)
