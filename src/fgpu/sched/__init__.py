"""The decision core: cluster state, fragmentation measure, placement.

Pure: no clock, no I/O, no global random. Callers pass the generator and the policy.
"""

from fgpu.sched.frag import FragmentationMeasure, TargetWorkload, TaskType, reference_node_fragment
from fgpu.sched.placer import PlacementResult, Placer, Unschedulable, name_order_rank, seeded_rank
from fgpu.sched.policy import PlacementPolicy, best_fit_gpus, pick_highest
from fgpu.sched.state import ClusterState, GpuNeed, check_invariants

__all__ = [
    "ClusterState",
    "FragmentationMeasure",
    "GpuNeed",
    "PlacementPolicy",
    "PlacementResult",
    "Placer",
    "TargetWorkload",
    "TaskType",
    "Unschedulable",
    "best_fit_gpus",
    "check_invariants",
    "name_order_rank",
    "pick_highest",
    "reference_node_fragment",
    "seeded_rank",
]
