"""GPU fragmentation measure of FGD (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23).

Definitions (``docs/design.md``, "The fill experiment's protocol"):

- A *target workload* M is a list of task types m with a popularity p_m (sum 1).
- The fragment of node n for task type m, f(n, m), in milli-GPU, with idle(n) the node's
  free milli-GPU:
  * m asks for no GPU: idle(n);
  * m's GPU model not allowed on n, or m's CPU or GPU request does not fit n: idle(n);
  * otherwise the free milli of the GPUs whose free milli is below m's per-GPU share.
- F_n = sum_m p_m f(n, m); cluster fragmentation = sum_n F_n; fragmentation rate =
  cluster fragmentation / total idle milli-GPU.

To keep accounting in integers, this module works with **weighted** fragments
``Fw_n = sum_m count_m * f(n, m)`` where ``count_m`` is the number of pods of type m, so
``F_n = Fw_n / W`` with ``W = sum_m count_m``. The fast vectorized path and the reference
implementation (:func:`reference_node_fragment`) therefore agree exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fgpu.model.types import InvalidRequestError, Request

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DEFAULT_COVERAGE = 0.95
"""Share of pods the most popular task types must cover (fgd-protocol.md)."""


@dataclass(frozen=True, slots=True, order=True)
class TaskType:
    """One kind of pod in the target workload.

    Attributes:
        cpu_milli: CPU request in milli-cores.
        gpu_milli: per-GPU share in milli-GPU (0 for CPU-only).
        gpu_count: number of GPUs (0 for CPU-only).
        gpu_models: allowed GPU models joined by ``|`` in sorted order ("" means any).
        count: number of pods of this type (its popularity weight).
    """

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    gpu_models: str
    count: int = 1

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise InvalidRequestError("count", "a task type needs a positive pod count")
        if self.cpu_milli < 0 or self.gpu_milli < 0 or self.gpu_count < 0:
            raise InvalidRequestError("task_type", "negative amounts")
        if (self.gpu_count == 0) != (self.gpu_milli == 0):
            raise InvalidRequestError("gpu_milli", "0 only for CPU-only task types")


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """Task types with integer popularity weights; p_m = count_m / sum(count).

    Build it from a pod list with :meth:`from_requests` (the protocol's rule) or pass your
    own types, e.g. the recent submissions of an online service.
    """

    types: tuple[TaskType, ...]

    def __post_init__(self) -> None:
        if not self.types:
            raise InvalidRequestError("types", "a target workload needs at least one task type")

    @property
    def total_count(self) -> int:
        """W, the sum of the counts of the kept task types."""
        return sum(t.count for t in self.types)

    @classmethod
    def from_requests(
        cls, requests: Iterable[Request], coverage: float = DEFAULT_COVERAGE
    ) -> TargetWorkload:
        """The protocol's target workload from a pod list.

        Group by (cpu_milli, gpu_milli, gpu_count, gpu models); sort groups by count,
        descending, equal counts by the key, descending; keep adding groups while the running
        total is below ``coverage`` of all pods. For the default Alibaba trace this keeps 35
        groups covering 95.3 % of 8152 pods.

        Raises:
            InvalidRequestError: an empty list, a coverage outside (0, 1], or a request whose
                share is derived from memory (the measure needs explicit shares).
        """
        if not 0 < coverage <= 1:
            raise InvalidRequestError("coverage", "must be in (0, 1]")
        counts: Counter[tuple[int, int, int, str]] = Counter()
        for r in requests:
            if r.gpu_count and r.gpu_milli is None:
                raise InvalidRequestError("gpu_milli", "target task types need explicit shares")
            key = (r.cpu_milli, r.gpu_milli or 0, r.gpu_count, "|".join(sorted(r.gpu_models)))
            counts[key] += 1
        total = sum(counts.values())
        if total == 0:
            raise InvalidRequestError("requests", "cannot build a target workload from no pods")
        ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        kept: list[TaskType] = []
        running = 0
        for (cpu, milli, count, models), n in ordered:
            if running >= coverage * total:
                break
            kept.append(TaskType(cpu, milli, count, models, n))
            running += n
        return cls(tuple(kept))


class FragmentationMeasure:
    """Vectorized FGD fragmentation for one target workload over one cluster's models.

    Args:
        model_names: the cluster's GPU model names; node model index i refers to
            ``model_names[i]`` and -1 to a node without GPUs.
        target: the target workload.

    All methods take node slices in the shapes of :class:`fgpu.sched.state.ClusterState`
    (free milli int64[..., G], free CPU int64[...], model index int64[...]) and return
    weighted fragments (``count``-weighted milli-GPU; divide by :attr:`total_weight`).
    """

    def __init__(self, model_names: Sequence[str], target: TargetWorkload) -> None:
        self.target = target
        types = target.types
        self.cpu = np.array([t.cpu_milli for t in types], dtype=np.int64)
        self.milli = np.array([t.gpu_milli for t in types], dtype=np.int64)
        self.count = np.array([t.gpu_count for t in types], dtype=np.int64)
        self.weight = np.array([t.count for t in types], dtype=np.int64)
        self.total_weight = int(self.weight.sum())
        # allowed[model_index, m]; the extra last row is for nodes without GPUs (-1).
        allowed = np.zeros((len(model_names) + 1, len(types)), dtype=np.bool_)
        for j, t in enumerate(types):
            names = set(t.gpu_models.split("|")) if t.gpu_models else None
            for i, name in enumerate(model_names):
                allowed[i, j] = names is None or name in names
        allowed &= (self.count > 0)[None, :]  # CPU-only types: every idle GPU is fragment
        self.allowed = allowed

    # ------------------------------------------------------------- full measure
    def node_fragment(self, free: IntArray, cpu: IntArray, model: IntArray) -> IntArray:
        """Weighted fragment Fw of each node.

        Args:
            free: int64[..., G] free milli-GPU per GPU.
            cpu: int64[...] free CPU in milli-cores.
            model: int64[...] model index (-1: no GPUs).

        Returns:
            int64[...] sum over task types of count_m * f(n, m).
        """
        milli = self.milli
        ge = free[..., None, :] >= milli[:, None]  # [..., M, G]
        fits = self.allowed[model]  # [..., M]
        fits = fits & (cpu[..., None] >= self.cpu) & (ge.sum(axis=-1) >= self.count)
        frag_fit = np.where(ge, 0, free[..., None, :]).sum(axis=-1)  # [..., M]
        idle = free.sum(axis=-1)
        f = np.where(fits, frag_fit, idle[..., None])
        return np.asarray(f @ self.weight, dtype=np.int64)

    def fractional_trials(
        self, free: IntArray, cpu: IntArray, model: IntArray, share: IntArray, cpu_req: int
    ) -> tuple[IntArray, IntArray]:
        """Weighted fragment before, and after putting a one-GPU share on each GPU.

        Incremental: only the trial GPU's free milli and the node's CPU change, so the
        per-type fitting-GPU count and below-share sum are updated, not recomputed.

        Args:
            free: int64[D, G] free milli-GPU.
            cpu: int64[D] free CPU.
            model: int64[D] model index.
            share: int64[D] the pod's per-GPU share on each node.
            cpu_req: the pod's CPU request in milli-cores.

        Returns:
            ``(before, after)``: int64[D] and int64[D, G]; ``after[d, j]`` is meaningless
            where GPU j cannot hold the share (the caller masks it).
        """
        milli = self.milli[None, :, None]  # [1, M, 1]
        ge = free[:, None, :] >= milli  # [D, M, G]
        below = np.where(ge, 0, free[:, None, :])  # [D, M, G]
        cnt = ge.sum(axis=-1)  # [D, M]
        frag = below.sum(axis=-1)  # [D, M]
        idle = free.sum(axis=-1)  # [D]
        allowed = self.allowed[model]  # [D, M]
        need = self.count[None, :]
        fits_before = allowed & (cpu[:, None] >= self.cpu) & (cnt >= need)
        before = np.where(fits_before, frag, idle[:, None]) @ self.weight

        new = free - share[:, None]  # [D, G]
        ge_new = new[:, None, :] >= milli  # [D, M, G]
        cnt_t = cnt[:, :, None] - ge + ge_new  # [D, M, G]
        frag_t = frag[:, :, None] - below + np.where(ge_new, 0, new[:, None, :])
        cpu_ok = (cpu - cpu_req)[:, None] >= self.cpu  # [D, M]
        fits_t = (allowed & cpu_ok)[:, :, None] & (cnt_t >= need[:, :, None])
        idle_t = (idle - share)[:, None, None]
        f_t = np.where(fits_t, frag_t, idle_t)  # [D, M, G]
        after = np.einsum("dmg,m->dg", f_t, self.weight)
        return np.asarray(before, dtype=np.int64), np.asarray(after, dtype=np.int64)

    def fragment_milli(self, weighted: IntArray | int) -> npt.NDArray[np.float64] | float:
        """Convert weighted fragments to milli-GPU (divide by W)."""
        return np.asarray(weighted) / self.total_weight


def reference_node_fragment(
    free: Sequence[int], cpu_free: int, model: str | None, target: TargetWorkload
) -> int:
    """Weighted fragment of one node, straight from the definition (no numpy, no caching).

    The test suite checks the vectorized paths against this function exactly.

    Args:
        free: free milli-GPU of each GPU of the node.
        cpu_free: free CPU in milli-cores.
        model: the node's GPU model name (None: no GPUs).
        target: the target workload.

    Returns:
        sum over task types of count_m * f(n, m), in count-weighted milli-GPU.
    """
    idle = sum(free)
    total = 0
    for t in target.types:
        if t.gpu_count == 0:
            f = idle
        else:
            allowed = model is not None and (not t.gpu_models or model in t.gpu_models.split("|"))
            fitting = sum(1 for x in free if x >= t.gpu_milli)
            if allowed and cpu_free >= t.cpu_milli and fitting >= t.gpu_count:
                f = sum(x for x in free if x < t.gpu_milli)
            else:
                f = idle
        total += t.count * f
    return total
