"""Cluster state: free CPU, host memory, GPU compute and GPU memory in numpy arrays.

The state is the library the online service, the Kubernetes adapter and the simulators
call. It holds capacities and free amounts; it never decides where work goes (that is the
job of :mod:`fgpu.sched.placer` and the policies in :mod:`fgpu.plugins`).

Array shapes, with N nodes and G the largest GPU count on any node (at least 1):

- ``cpu_free``, ``memory_free``: int64[N] (milli-cores, MiB)
- ``gpu_free_milli``, ``gpu_free_memory``: int64[N, G] (milli-GPU, MiB); GPUs a node does not
  have are padding with capacity 0 and free 0, so they never fit anything.
- ``gpu_free_total``: int64[N] free milli-GPU summed over each node's GPUs (kept up to date).
- ``suspend_capacity``, ``suspend_free``: int64[N] host memory for suspended work (MiB), the
  node's ``suspend_host_memory_mib`` and what of it suspended workloads do not hold
  (:meth:`ClusterState.hold_suspended`, :meth:`ClusterState.free_suspended`).
- ``version``: int64[N], set to a fresh number whenever a node's free amounts change.
  Policies key their per-node caches on it.

G is padded up to a multiple of 8 so that a row of per-GPU booleans is whole 64-bit words;
:func:`count_per_node` then counts eligible GPUs with one multiply per node instead of a
numpy reduction (the filter runs for every request, so this is the hot path).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fgpu.model.types import Allocation, InvalidRequestError, Node, Request
from fgpu.model.units import MILLI_PER_GPU

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_BYTE_SUM = np.uint64(0x0101010101010101)
_TOP_BYTE = np.uint64(56)

_VERSIONS = itertools.count(1)
"""Source of node versions, shared by every state and its copies, so that a version number
names one node state in one lineage and policy caches can never confuse two copies."""


@dataclass(frozen=True, slots=True)
class GpuNeed:
    """A request resolved against every GPU of the cluster.

    Attributes:
        milli: int64[N, G] compute share the request needs on that GPU (1001 where the GPU
            cannot hold it at all, e.g. memory above the GPU's capacity).
        memory: int64[N, G] memory quota the request needs on that GPU in MiB.
        node_milli: int64[N] the per-GPU share on each node's model (``milli[:, 0]``).
    """

    milli: IntArray
    memory: IntArray
    node_milli: IntArray


CONSTRAINED = "excluded by the workload's node constraints"
"""How :meth:`ClusterState.explain` counts nodes a workload may not use (its ``nodes``)."""


class ClusterState:
    """Free and total resources of every node and GPU.

    Args:
        nodes: the nodes, in the order that defines node indices.

    Raises:
        InvalidRequestError: duplicate node names.
    """

    def __init__(self, nodes: Sequence[Node]) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            seen: set[str] = set()
            dup = next(x for x in names if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise InvalidRequestError("name", f"duplicate node name {dup!r}")
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.node_names: tuple[str, ...] = tuple(names)
        self.node_index: dict[str, int] = {name: i for i, name in enumerate(names)}
        models = sorted({n.gpu_model for n in nodes if n.gpu_model is not None})
        self.model_names: tuple[str, ...] = tuple(models)
        """Distinct GPU models; ``node_model`` indexes this tuple (-1: no GPUs)."""
        n = len(nodes)
        g = -(-max([node.gpu_count for node in nodes] + [1]) // 8) * 8
        self.max_gpus = g
        """G: GPU columns per node (the largest GPU count rounded up to a multiple of 8)."""
        self.node_model: IntArray = np.array(
            [models.index(x.gpu_model) if x.gpu_model else -1 for x in nodes], dtype=np.int64
        ).reshape(n)
        self.gpu_count: IntArray = np.array([x.gpu_count for x in nodes], dtype=np.int64).reshape(n)
        self.cpu_capacity: IntArray = np.array(
            [x.cpu_milli for x in nodes], dtype=np.int64
        ).reshape(n)
        self.memory_capacity: IntArray = np.array(
            [x.memory_mib for x in nodes], dtype=np.int64
        ).reshape(n)
        self.gpu_exists: BoolArray = np.arange(g)[None, :] < self.gpu_count[:, None]
        self.gpu_memory_capacity: IntArray = np.where(
            self.gpu_exists,
            np.array([x.gpu_memory_mib for x in nodes], dtype=np.int64).reshape(n)[:, None],
            0,
        ).astype(np.int64)
        self.gpu_milli_capacity: IntArray = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(
            np.int64
        )
        self.suspend_capacity: IntArray = np.array(
            [x.suspend_host_memory_mib for x in nodes], dtype=np.int64
        ).reshape(n)
        self.suspend_free: IntArray = self.suspend_capacity.copy()
        self.cpu_free: IntArray = self.cpu_capacity.copy()
        self.memory_free: IntArray = self.memory_capacity.copy()
        self.gpu_free_milli: IntArray = self.gpu_milli_capacity.copy()
        self.gpu_free_memory: IntArray = self.gpu_memory_capacity.copy()
        self.gpu_free_total: IntArray = self.gpu_free_milli.sum(axis=1)
        self.largest_node_cpu = max(int(self.cpu_capacity.max(initial=0)), 1)
        """CPU of the largest node in milli-cores (normalizer of best-fit and dot-product)."""
        self.largest_node_gpu_milli = max(int(self.gpu_free_total.max(initial=0)), 1)
        """GPU compute of the largest node in milli-GPU."""
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self._model_mask_cache: dict[frozenset[str], BoolArray] = {}
        self._node_mask_cache: dict[frozenset[str], BoolArray] = {}
        self._need_cache: dict[tuple[int | None, int | None], GpuNeed] = {}

    # ----------------------------------------------------------------- sizes
    @property
    def num_nodes(self) -> int:
        """Number of nodes N."""
        return len(self.node_names)

    @property
    def gpu_capacity_milli(self) -> int:
        """Total GPU compute of the cluster in milli-GPU."""
        return int(self.gpu_milli_capacity.sum())

    @property
    def gpu_allocated_milli(self) -> int:
        """GPU compute currently granted, in milli-GPU."""
        return int(self.gpu_milli_capacity.sum() - self.gpu_free_milli.sum())

    # ------------------------------------------------------------------ copy
    def copy(self) -> ClusterState:
        """An independent copy for what-if placement; capacities are shared (read-only)."""
        other = object.__new__(ClusterState)
        other.__dict__.update(self.__dict__)
        other.cpu_free = self.cpu_free.copy()
        other.memory_free = self.memory_free.copy()
        other.gpu_free_milli = self.gpu_free_milli.copy()
        other.gpu_free_memory = self.gpu_free_memory.copy()
        other.gpu_free_total = self.gpu_free_total.copy()
        other.suspend_free = self.suspend_free.copy()
        other.version = self.version.copy()
        return other

    # ---------------------------------------------------------------- filter
    def model_mask(self, allowed: frozenset[str]) -> BoolArray:
        """bool[N]: nodes whose GPU model is in ``allowed`` (all nodes when it is empty)."""
        mask = self._model_mask_cache.get(allowed)
        if mask is None:
            if not allowed:
                mask = np.ones(self.num_nodes, dtype=np.bool_)
            else:
                ok = np.array([m in allowed for m in self.model_names] + [False])
                mask = ok[self.node_model]  # index -1 picks the trailing False
            self._model_mask_cache[allowed] = mask
        return mask

    def node_mask(self, allowed: frozenset[str]) -> BoolArray:
        """bool[N]: nodes whose name is in ``allowed`` (names of no node are ignored)."""
        mask = self._node_mask_cache.get(allowed)
        if mask is None:
            mask = np.zeros(self.num_nodes, dtype=np.bool_)
            index = self.node_index
            picked = [index[name] for name in allowed if name in index]
            mask[picked] = True
            if len(self._node_mask_cache) >= 1024:  # shapes of constraints repeat; stay bounded
                self._node_mask_cache.clear()
            self._node_mask_cache[allowed] = mask
        return mask

    def gpu_need(self, request: Request) -> GpuNeed:
        """Resolve the per-GPU share and memory quota of ``request`` on every GPU.

        Rules (DESIGN.md section 4): a share without memory gets
        ``floor(share * gpu_memory / 1000)`` MiB; memory without a share gets
        ``max(1, ceil(memory * 1000 / gpu_memory))`` milli; a whole GPU (1000) needs all of
        the GPU's memory. A GPU too small for the memory gets an impossible share (1001).
        """
        key = (request.gpu_milli, request.gpu_memory_mib)
        cached = self._need_cache.get(key)
        if cached is not None:
            return cached
        cap = self.gpu_memory_capacity
        if request.gpu_count == 0:
            milli = np.zeros(cap.shape, dtype=np.int64)
            memory = milli
        elif request.gpu_milli is not None and request.gpu_memory_mib is None:
            milli = np.full(cap.shape, request.gpu_milli, dtype=np.int64)
            memory = request.gpu_milli * cap // MILLI_PER_GPU
        elif request.gpu_milli is None:
            assert request.gpu_memory_mib is not None
            mem = request.gpu_memory_mib
            memory = np.full(cap.shape, mem, dtype=np.int64)
            safe = np.maximum(cap, 1)
            milli = np.maximum(1, -(-mem * MILLI_PER_GPU // safe))
            milli = np.where((cap >= mem) & (cap > 0), milli, MILLI_PER_GPU + 1)
        else:
            milli = np.full(cap.shape, request.gpu_milli, dtype=np.int64)
            memory = np.full(cap.shape, request.gpu_memory_mib, dtype=np.int64)
        need = GpuNeed(milli=milli, memory=memory, node_milli=milli[:, 0].copy())
        if len(self._need_cache) < 4096:  # capacities never change; shapes repeat
            self._need_cache[key] = need
        return need

    def eligible_gpus(self, request: Request, need: GpuNeed | None = None) -> BoolArray:
        """bool[N, G]: GPUs with enough free compute and memory for one share of ``request``."""
        need = need or self.gpu_need(request)
        return (self.gpu_free_milli >= need.milli) & (self.gpu_free_memory >= need.memory)

    def feasible(
        self, request: Request, need: GpuNeed | None = None
    ) -> tuple[BoolArray, BoolArray | None]:
        """The filter: which nodes can take ``request`` now.

        Checks the GPU model, CPU, host memory and, for GPU requests, that at least
        ``gpu_count`` distinct GPUs each have the share and memory free (a whole-GPU share of
        1000 therefore needs fully free GPUs).

        Returns:
            ``(nodes, gpus)``: bool[N] feasible nodes and bool[N, G] eligible GPUs (None for
            a CPU-only request).
        """
        ok = (self.cpu_free >= request.cpu_milli) & (self.memory_free >= request.memory_mib)
        if request.gpu_count == 0:
            return ok, None
        ok &= self.model_mask(request.gpu_models)
        gpus = self.eligible_gpus(request, need)
        if request.gpu_count == 1:
            ok &= any_per_node(gpus)
        else:
            ok &= count_per_node(gpus) >= request.gpu_count
        return ok, gpus

    def explain(self, request: Request, allowed: BoolArray | None = None) -> str:
        """Why no node fits ``request``: counts of nodes per first failing check.

        ``allowed`` (bool[N], optional) are the nodes the workload may use at all (its node
        constraints); the others are counted first, as ``"N excluded by the workload's node
        constraints"``.

        The reason is meant for users as it is, e.g. ``"0/3 nodes fit: 1 GPU model not
        allowed, 2 insufficient GPU (need 1 GPU with 500 milli and 20480 MiB free)"``. A
        memory quota larger than every GPU of the remaining nodes reads ``"2 GPU memory too
        small (no GPU has 102400 MiB of memory)"``; a cluster without nodes gives
        ``"0/0 nodes fit: no nodes in the cluster"``.
        """
        n = self.num_nodes
        if n == 0:
            return "0/0 nodes fit: no nodes in the cluster"
        remaining = np.ones(n, dtype=np.bool_)
        parts: list[str] = []

        def take(mask: BoolArray, text: str) -> None:
            nonlocal remaining
            hit = remaining & ~mask
            count = int(hit.sum())
            if count:
                parts.append(f"{count} {text}")
            remaining &= mask

        if allowed is not None:
            take(allowed, CONSTRAINED)
        if request.gpu_count:
            take(self.gpu_count >= request.gpu_count, f"have fewer than {request.gpu_count} GPUs")
            allowed_model = self.model_mask(request.gpu_models)
            other = self.node_model[remaining & ~allowed_model]
            have = sorted({self.model_names[m] for m in other.tolist() if m >= 0})
            take(
                allowed_model,
                f"GPU model not allowed (asked {', '.join(sorted(request.gpu_models))}; "
                f"{'they have' if len(other) > 1 else 'it has'} {', '.join(have) or 'none'})",
            )
        take(self.cpu_free >= request.cpu_milli, f"insufficient CPU (need {request.cpu_milli}m)")
        take(
            self.memory_free >= request.memory_mib,
            f"insufficient memory (need {request.memory_mib} MiB)",
        )
        if request.gpu_count and request.gpu_memory_mib is not None:
            # A quota above the GPUs' total memory can never fit there; saying so beats an
            # impossible share ("1001 milli") in the next check.
            quota = request.gpu_memory_mib
            big = (self.gpu_memory_capacity >= quota).sum(axis=1) >= request.gpu_count
            take(big, f"GPU memory too small (no GPU has {quota} MiB of memory)")
        if request.gpu_count:
            need = self.gpu_need(request)
            gpus = self.eligible_gpus(request, need)
            share = "whole GPU" if request.is_whole_gpu else "GPU share"
            mem = int(need.memory[remaining].max()) if remaining.any() else 0
            milli = int(need.milli[remaining].min()) if remaining.any() else 0
            take(
                gpus.sum(axis=1) >= request.gpu_count,
                f"insufficient GPU (need {request.gpu_count} x {share} of {milli} milli "
                f"and {mem} MiB free)",
            )
        fit = int(remaining.sum())
        return f"{fit}/{n} nodes fit: " + (", ".join(parts) if parts else "no constraint failed")

    # ------------------------------------------------------------- mutations
    def allocate(self, request: Request, node: int, gpus: Sequence[int]) -> Allocation:
        """Grant ``request`` on ``node`` and the listed GPUs, and return the allocation.

        Raises:
            InvalidRequestError: the node or a GPU does not have the resources free, or the
                GPU list does not match ``gpu_count``. Nothing changes in that case.
        """
        gpu_list = tuple(sorted(int(g) for g in gpus))
        if len(gpu_list) != request.gpu_count or len(set(gpu_list)) != len(gpu_list):
            raise InvalidRequestError(
                "gpus", f"need {request.gpu_count} distinct GPUs, got {list(gpu_list)}"
            )
        if self.cpu_free[node] < request.cpu_milli:
            raise InvalidRequestError("cpu_milli", f"node {self.node_names[node]} lacks CPU")
        if self.memory_free[node] < request.memory_mib:
            raise InvalidRequestError("memory_mib", f"node {self.node_names[node]} lacks memory")
        milli: list[int] = []
        memory: list[int] = []
        if gpu_list:
            need = self.gpu_need(request)
            for g in gpu_list:
                if g >= self.gpu_count[node]:
                    raise InvalidRequestError("gpus", f"node has no GPU {g}")
                m, mem = int(need.milli[node, g]), int(need.memory[node, g])
                if self.gpu_free_milli[node, g] < m or self.gpu_free_memory[node, g] < mem:
                    raise InvalidRequestError(
                        "gpus", f"GPU {g} of {self.node_names[node]} lacks {m} milli / {mem} MiB"
                    )
                milli.append(m)
                memory.append(mem)
        self.cpu_free[node] -= request.cpu_milli
        self.memory_free[node] -= request.memory_mib
        for g, m, mem in zip(gpu_list, milli, memory, strict=True):
            self.gpu_free_milli[node, g] -= m
            self.gpu_free_memory[node, g] -= mem
        self.gpu_free_total[node] -= sum(milli)
        self.version[node] = next(_VERSIONS)
        return Allocation(
            node=node,
            node_name=self.node_names[node],
            gpus=gpu_list,
            gpu_milli=tuple(milli),
            gpu_memory_mib=tuple(memory),
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
        )

    def release(self, allocation: Allocation) -> None:
        """Give back everything ``allocation`` holds.

        Raises:
            InvalidRequestError: releasing would exceed a capacity (a double release).
        """
        node = allocation.node
        if self.cpu_free[node] + allocation.cpu_milli > self.cpu_capacity[node]:
            raise InvalidRequestError(
                "allocation", "release exceeds CPU capacity (double release?)"
            )
        for g, m, mem in zip(
            allocation.gpus, allocation.gpu_milli, allocation.gpu_memory_mib, strict=True
        ):
            if (
                self.gpu_free_milli[node, g] + m > self.gpu_milli_capacity[node, g]
                or self.gpu_free_memory[node, g] + mem > self.gpu_memory_capacity[node, g]
            ):
                raise InvalidRequestError("allocation", "release exceeds GPU capacity")
        self.cpu_free[node] += allocation.cpu_milli
        self.memory_free[node] += allocation.memory_mib
        for g, m, mem in zip(
            allocation.gpus, allocation.gpu_milli, allocation.gpu_memory_mib, strict=True
        ):
            self.gpu_free_milli[node, g] += m
            self.gpu_free_memory[node, g] += mem
        self.gpu_free_total[node] += sum(allocation.gpu_milli)
        self.version[node] = next(_VERSIONS)

    def occupy(self, allocation: Allocation) -> None:
        """Take exactly what ``allocation`` holds (the reverse of :meth:`release`).

        Raises:
            InvalidRequestError: something it holds is not free; nothing changes then.
        """
        node = allocation.node
        if (
            self.cpu_free[node] < allocation.cpu_milli
            or self.memory_free[node] < allocation.memory_mib
        ):
            raise InvalidRequestError("allocation", f"{self.node_names[node]} lacks CPU or memory")
        for g, m, mem in zip(
            allocation.gpus, allocation.gpu_milli, allocation.gpu_memory_mib, strict=True
        ):
            if self.gpu_free_milli[node, g] < m or self.gpu_free_memory[node, g] < mem:
                raise InvalidRequestError(
                    "gpus", f"GPU {g} of {self.node_names[node]} lacks {m} milli / {mem} MiB"
                )
        self.cpu_free[node] -= allocation.cpu_milli
        self.memory_free[node] -= allocation.memory_mib
        for g, m, mem in zip(
            allocation.gpus, allocation.gpu_milli, allocation.gpu_memory_mib, strict=True
        ):
            self.gpu_free_milli[node, g] -= m
            self.gpu_free_memory[node, g] -= mem
        self.gpu_free_total[node] -= sum(allocation.gpu_milli)
        self.version[node] = next(_VERSIONS)

    def suspend_compute(self, allocation: Allocation) -> None:
        """Give back the compute ``allocation`` holds, keeping its CPU and memory (it is
        squeezed: :mod:`fgpu.sched.squeeze`).

        Raises:
            InvalidRequestError: the compute would exceed a GPU's capacity (not held).
        """
        node = allocation.node
        for g, m in zip(allocation.gpus, allocation.gpu_milli, strict=True):
            if self.gpu_free_milli[node, g] + m > self.gpu_milli_capacity[node, g]:
                raise InvalidRequestError("allocation", "suspending compute that is not held")
        for g, m in zip(allocation.gpus, allocation.gpu_milli, strict=True):
            self.gpu_free_milli[node, g] += m
        self.gpu_free_total[node] += sum(allocation.gpu_milli)
        self.version[node] = next(_VERSIONS)

    def resume_compute(self, allocation: Allocation) -> None:
        """Take the compute of ``allocation`` again (the end of a squeeze).

        Raises:
            InvalidRequestError: a GPU lacks that compute free; nothing changes then.
        """
        node = allocation.node
        for g, m in zip(allocation.gpus, allocation.gpu_milli, strict=True):
            if self.gpu_free_milli[node, g] < m:
                raise InvalidRequestError(
                    "gpus", f"GPU {g} of {self.node_names[node]} lacks {m} milli"
                )
        for g, m in zip(allocation.gpus, allocation.gpu_milli, strict=True):
            self.gpu_free_milli[node, g] -= m
        self.gpu_free_total[node] -= sum(allocation.gpu_milli)
        self.version[node] = next(_VERSIONS)

    def hold_suspended(self, node: int, host_memory_mib: int) -> None:
        """Charge ``host_memory_mib`` of ``node``'s suspend budget to a suspended workload.

        Raises:
            InvalidRequestError: the budget lacks it (field ``host_memory_mib``); nothing
                changes then.
        """
        if host_memory_mib < 0 or self.suspend_free[node] < host_memory_mib:
            raise InvalidRequestError(
                "host_memory_mib",
                f"{host_memory_mib} MiB do not fit the {int(self.suspend_free[node])} MiB left "
                f"of the suspend budget of {self.node_names[node]}",
            )
        self.suspend_free[node] -= host_memory_mib

    def free_suspended(self, node: int, host_memory_mib: int) -> None:
        """Give back what :meth:`hold_suspended` charged (a restore, or a cancel).

        Raises:
            InvalidRequestError: more than is held (a double release).
        """
        if host_memory_mib < 0 or (
            self.suspend_free[node] + host_memory_mib > self.suspend_capacity[node]
        ):
            raise InvalidRequestError(
                "host_memory_mib",
                f"freeing {host_memory_mib} MiB exceeds the suspend budget of "
                f"{self.node_names[node]} (double release?)",
            )
        self.suspend_free[node] += host_memory_mib


def withhold(
    state: ClusterState,
    node: int,
    cpu_milli: int,
    memory_mib: int,
    gpu_milli: IntArray,
    gpu_memory_mib: IntArray,
) -> None:
    """Make free capacity of ``node`` unavailable in a what-if copy (no allocation owns it).

    The decision core uses it for capacity that is promised but not yet real: what victims
    still hold beyond what their preemptor will take.

    Args:
        state: a working copy (never the live state).
        node: node index.
        cpu_milli, memory_mib: amounts to withhold.
        gpu_milli, gpu_memory_mib: int64[G] per-GPU amounts to withhold.

    Raises:
        InvalidRequestError: more than is free.
    """
    if (
        cpu_milli > state.cpu_free[node]
        or memory_mib > state.memory_free[node]
        or (gpu_milli > state.gpu_free_milli[node]).any()
        or (gpu_memory_mib > state.gpu_free_memory[node]).any()
    ):
        raise InvalidRequestError("withhold", f"more than is free on {state.node_names[node]}")
    state.cpu_free[node] -= cpu_milli
    state.memory_free[node] -= memory_mib
    state.gpu_free_milli[node] -= gpu_milli
    state.gpu_free_memory[node] -= gpu_memory_mib
    state.gpu_free_total[node] -= int(gpu_milli.sum())
    state.version[node] = next(_VERSIONS)


def count_per_node(mask: BoolArray) -> IntArray:
    """int64[N]: number of True entries in each row of a bool[N, G] mask (G % 8 == 0).

    Each 8-byte group of 0/1 bytes is read as one uint64 word; multiplying it by
    0x0101010101010101 adds all eight bytes into the top byte (at most 8, so no carry).
    """
    words = np.ascontiguousarray(mask).view(np.uint64)
    counts = (words * _BYTE_SUM) >> _TOP_BYTE
    if counts.shape[1] == 1:
        return np.asarray(counts[:, 0], dtype=np.int64)
    return np.asarray(counts.sum(axis=1), dtype=np.int64)


def any_per_node(mask: BoolArray) -> BoolArray:
    """bool[N]: whether each row of a bool[N, G] mask (G % 8 == 0) has a True entry."""
    words = np.ascontiguousarray(mask).view(np.uint64)
    if words.shape[1] == 1:
        return np.asarray(words[:, 0] != 0, dtype=np.bool_)
    return np.asarray((words != 0).any(axis=1), dtype=np.bool_)


def check_invariants(state: ClusterState) -> None:
    """Assert that no free amount is negative or above capacity, and padding stays empty.

    Raises:
        AssertionError: naming the first broken invariant.
    """
    pairs = (
        ("cpu_free", state.cpu_free, state.cpu_capacity),
        ("memory_free", state.memory_free, state.memory_capacity),
        ("gpu_free_milli", state.gpu_free_milli, state.gpu_milli_capacity),
        ("gpu_free_memory", state.gpu_free_memory, state.gpu_memory_capacity),
        ("suspend_free", state.suspend_free, state.suspend_capacity),
    )
    for name, free, cap in pairs:
        if (free < 0).any():
            raise AssertionError(f"{name} negative at {np.argwhere(free < 0)[0].tolist()}")
        if (free > cap).any():
            raise AssertionError(f"{name} above capacity at {np.argwhere(free > cap)[0].tolist()}")
    if (state.gpu_free_milli[~state.gpu_exists] != 0).any():
        raise AssertionError("padding GPUs hold compute")
    if (state.gpu_free_total != state.gpu_free_milli.sum(axis=1)).any():
        raise AssertionError("gpu_free_total differs from the per-GPU free compute")
