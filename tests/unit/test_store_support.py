"""Helpers shared by the store tests: a ticking clock, counted ids, builders, snapshots.

(A module of helpers, named so it sits with the store tests; it holds no tests itself.)
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event

from fgpu.model.types import Allocation, Request
from fgpu.store import EventRecord, QueueConfig, Store, WorkloadRecord

T0 = 1_700_000_000.0


class Ticker:
    """A clock that advances one second on every read (thread-safe)."""

    def __init__(self, start: float = T0) -> None:
        self._times = itertools.count()
        self._start = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._start + next(self._times)


class Counter:
    """Workload ids ``w0001``, ``w0002``, ... (thread-safe)."""

    def __init__(self, prefix: str = "w") -> None:
        self._numbers = itertools.count(1)
        self._prefix = prefix
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            return f"{self._prefix}{next(self._numbers):04d}"


def open_store(path: Path, *, prefix: str = "w") -> Store:
    """A store on the SQLite file ``path`` with a ticking clock and counted ids."""
    return Store.open(path, clock=Ticker(), new_id=Counter(prefix))


def half_gpu() -> Request:
    return Request(cpu_milli=2000, memory_mib=4096, gpu_count=1, gpu_milli=500)


def submit(
    store: Store,
    *,
    owner: int = 1000,
    queue: str = "default",
    request: Request | None = None,
    priority: int | str = "normal",
) -> WorkloadRecord:
    """Submit ``sleep 60`` as ``owner``."""
    return store.submit(
        owner_uid=owner,
        queue=queue,
        request=request or half_gpu(),
        argv=["sleep", "60"],
        priority=priority,
        cwd="/tmp",
        env={"PATH": "/usr/bin"},
    )


def allocation_for(request: Request, node: str = "local", first_gpu: int = 0) -> Allocation:
    """An allocation matching ``request`` on consecutive GPUs of ``node``."""
    gpus = tuple(range(first_gpu, first_gpu + request.gpu_count))
    milli = request.gpu_milli or 100
    memory = request.gpu_memory_mib or 40960 * milli // 1000
    return Allocation(
        node=0,
        node_name=node,
        gpus=gpus,
        gpu_milli=(milli,) * len(gpus),
        gpu_memory_mib=(memory,) * len(gpus),
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
    )


def with_default_queue(store: Store) -> Store:
    store.create_queue(QueueConfig("default"))
    return store


def snapshot(store: Store, workload_id: str | None = None) -> tuple[object, list[EventRecord]]:
    """Everything a change could touch: the workload(s), their events, holds and queues."""
    if workload_id is None:
        rows: object = (store.list(), store.list_queues(), store.load_holds(), store.list_nodes())
    else:
        rows = (store.get(workload_id), store.load_holds().get(workload_id))
    return rows, store.events(workload_id)


def in_threads(count: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(i)`` for i in 0..count-1 in threads started together; return the errors."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


class InjectedFault(RuntimeError):
    """Stands for a disk error or a killed connection between two statements."""


@contextmanager
def fail_on(store: Store, statement_start: str) -> Iterator[list[str]]:
    """Make the driver fail on the first statement starting with ``statement_start``
    (after the earlier statements of the same transaction have run)."""
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement.split("(")[0].strip())
        if statement.startswith(statement_start):
            raise InjectedFault(statement_start)

    event.listen(store.engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", before)
