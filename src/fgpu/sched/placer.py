"""Placement: filter, score, select, bind (DESIGN.md section 6).

:class:`Placer` is what the single-machine service, the Kubernetes adapter and the
simulators call to put one request on the cluster. "Does not fit" is a value
(:class:`Unschedulable` with a reason for users), not an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.state import BoolArray, ClusterState, IntArray


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No node can take the request now; ``reason`` says why, per check."""

    reason: str


PlacementResult = Allocation | Unschedulable


def name_order_rank(names: Sequence[str]) -> IntArray:
    """Tie-break rank by node name: rank[i] is the position of node i in name order."""
    order = np.argsort(np.array(names, dtype=object), kind="stable")
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    return rank


def seeded_rank(names: Sequence[str], rng: np.random.Generator) -> IntArray:
    """Tie-break rank: a random permutation of the name-sorted nodes (fgd-protocol.md).

    ``rank[i]`` is the position of node i in the permuted order; the node with the lowest
    rank wins a tie.
    """
    by_name = np.argsort(np.array(names, dtype=object), kind="stable")
    permuted = by_name[rng.permutation(len(names))]
    rank = np.empty(len(names), dtype=np.int64)
    rank[permuted] = np.arange(len(names))
    return rank


def _check_request(request: object) -> None:
    if not isinstance(request, Request):
        raise InvalidRequestError(
            "request", f"must be a Request (got {type(request).__name__}: {request!r})"
        )


class Placer:
    """Places requests on a :class:`ClusterState` with one policy.

    Args:
        state: the cluster state it mutates on :meth:`place` and :meth:`release`.
        policy: the placement policy.
        rank: int64[N] tie-break rank of the nodes (default: by name).

    Raises:
        InvalidRequestError: ``state`` is not a :class:`ClusterState`, ``policy`` not a
            :class:`PlacementPolicy` (e.g. a policy name: build the policy with
            :func:`fgpu.plugins.create_policy`), or ``rank`` has the wrong shape.
    """

    def __init__(
        self, state: ClusterState, policy: PlacementPolicy, rank: IntArray | None = None
    ) -> None:
        given: tuple[object, object] = (state, policy)  # callers outside mypy pass anything
        if not isinstance(given[0], ClusterState):
            raise InvalidRequestError(
                "state", f"must be a ClusterState (got {type(given[0]).__name__})"
            )
        if not isinstance(given[1], PlacementPolicy):
            hint = (
                f"; build it with fgpu.plugins.create_policy({given[1]!r}, ...)"
                if isinstance(given[1], str)
                else ""
            )
            raise InvalidRequestError(
                "policy", f"must be a PlacementPolicy (got {type(given[1]).__name__}){hint}"
            )
        self.state = state
        self.policy = policy
        self.rank = name_order_rank(state.node_names) if rank is None else rank
        if not isinstance(self.rank, np.ndarray) or self.rank.shape != (state.num_nodes,):
            raise InvalidRequestError("rank", f"need {state.num_nodes} ranks")

    def choose(
        self,
        request: Request,
        explain: bool = True,
        exclude: BoolArray | None = None,
        allowed: BoolArray | None = None,
    ) -> tuple[int, tuple[int, ...]] | Unschedulable:
        """Decide where ``request`` would go without binding it: ``(node, gpus)``.

        Args:
            request: what to place.
            explain: with False an unschedulable result carries an empty reason (the
                simulators skip the per-node accounting of why nothing fits).
            exclude: bool[N] nodes not to use (reserved for other work).
            allowed: bool[N] nodes the workload may use at all (its node constraints;
                None: every node).

        Raises:
            InvalidRequestError: ``request`` is not a :class:`Request`.
        """
        _check_request(request)
        state = self.state
        need = state.gpu_need(request)
        feasible, gpus = state.feasible(request, need)
        if exclude is not None:
            feasible = feasible & ~exclude
        if allowed is not None:
            feasible = feasible & allowed
        candidates = np.flatnonzero(feasible)
        if candidates.size == 0:
            if not explain:
                return Unschedulable("")
            reason = state.explain(request, allowed)
            if exclude is not None and exclude.any() and not reason.startswith("0/"):
                reason = f"{reason}; {int(exclude.sum())} nodes are reserved for other work"
            return Unschedulable(reason)
        node = self.policy.select_node(state, request, need, candidates, gpus, self.rank)
        chosen = self.policy.select_gpus(state, request, need, node, gpus)
        return node, chosen

    def place(
        self,
        request: Request,
        explain: bool = True,
        exclude: BoolArray | None = None,
        allowed: BoolArray | None = None,
    ) -> PlacementResult:
        """Choose a node and GPUs for ``request`` and bind it (arguments as :meth:`choose`).

        Returns:
            The :class:`Allocation`, or :class:`Unschedulable` with the reason (empty when
            ``explain`` is False).

        Raises:
            InvalidRequestError: ``request`` is not a :class:`Request`.
        """
        choice = self.choose(request, explain, exclude, allowed)
        if isinstance(choice, Unschedulable):
            return choice
        node, chosen = choice
        allocation = self.state.allocate(request, node, chosen)
        self.policy.on_allocate(self.state, allocation)
        return allocation

    def release(self, allocation: Allocation) -> None:
        """Give an allocation back (see :meth:`ClusterState.release`)."""
        self.state.release(allocation)
        self.policy.on_release(self.state, allocation)
