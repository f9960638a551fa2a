"""Placement policies, registered by name.

``create_policy("fgd", target=..., rng=...)`` builds one; :func:`policy_names` lists them.
The six policies of the FGD paper's experiment are :data:`PUBLISHED_POLICIES`.
"""

from __future__ import annotations

# Importing the modules registers their policies.
from fgpu.plugins import allocated, bestfit, clustering, dotprod, fgd, packing, random_policy  # noqa: F401
from fgpu.plugins.registry import (
    PUBLISHED_POLICIES,
    UnknownPolicyError,
    create_policy,
    policy_names,
    register,
)

__all__ = [
    "PUBLISHED_POLICIES",
    "UnknownPolicyError",
    "create_policy",
    "policy_names",
    "register",
]
