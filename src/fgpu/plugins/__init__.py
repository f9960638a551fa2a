"""Placement policies, registered by name.

``create_policy("fgd", target=..., rng=...)`` builds one; :func:`policy_names` lists them.
The six policies of the FGD paper's experiment are :data:`PUBLISHED_POLICIES`.
"""

from __future__ import annotations

# Importing the modules registers their policies.
from fgpu.plugins import (  # noqa: F401
    allocated,
    bestfit,
    clustering,
    dotprod,
    fgd,
    fgd_lookahead,
    fgd_pattern,
    packing,
    random_policy,
)
from fgpu.plugins.registry import (
    DEFAULT_POLICY,
    PUBLISHED_POLICIES,
    UnknownPolicyError,
    create_policy,
    policy_names,
    register,
)

__all__ = [
    "DEFAULT_POLICY",
    "PUBLISHED_POLICIES",
    "UnknownPolicyError",
    "create_policy",
    "policy_names",
    "register",
]
