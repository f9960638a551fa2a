"""Node selector, required node affinity and taint rules (fgpu.k8s.constraints) against the
Kubernetes documentation's semantics, one rule per case."""

from __future__ import annotations

from typing import Any

import pytest

from fgpu.k8s.constraints import (
    ConstraintCache,
    allowed_nodes,
    matches,
    node_facts,
    pod_constraints,
    untolerated,
)


def node(name: str, labels: dict[str, str] | None = None, taints: list[Any] | None = None):  # type: ignore[no-untyped-def]
    return node_facts(
        {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}
    )


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": spec}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


GPU_NODE = node("gpu-1", {"pool": "train", "gen": "9"})


@pytest.mark.parametrize(
    ("spec", "selected"),
    [
        ({}, True),
        ({"nodeSelector": {"pool": "train"}}, True),
        ({"nodeSelector": {"pool": "train", "zone": "a"}}, False),  # every key must match
        ({"affinity": required(expr("pool", "In", "serve", "train"))}, True),
        ({"affinity": required(expr("pool", "NotIn", "train"))}, False),
        ({"affinity": required(expr("zone", "NotIn", "a"))}, True),  # absent label: NotIn holds
        ({"affinity": required(expr("pool", "Exists"))}, True),
        ({"affinity": required(expr("zone", "DoesNotExist"))}, True),
        ({"affinity": required(expr("gen", "Gt", "8"))}, True),
        ({"affinity": required(expr("gen", "Lt", "9"))}, False),
        ({"affinity": required(expr("pool", "Gt", "1"))}, False),  # not an integer label
        ({"affinity": required(expr("pool", "Like", "train"))}, False),  # unknown operator
        ({"affinity": required({})}, False),  # an empty term selects no node
        ({"affinity": required(expr("pool", "In", "serve"), expr("gen", "In", "9"))}, True),
        (
            {
                "affinity": required(
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}
                        ]
                    }
                )
            },
            True,
        ),
        (
            {
                "affinity": required(
                    {
                        "matchExpressions": [{"key": "pool", "operator": "Exists"}],
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}
                        ],
                    }
                )
            },
            False,  # within a term everything must hold
        ),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            True,
        ),
    ],
)
def test_selector_and_affinity(spec: dict[str, Any], selected: bool) -> None:
    assert matches(pod_constraints(pod(**spec)), GPU_NODE) is selected


TAINTED = node(
    "gpu-2",
    taints=[
        {"key": "dedicated", "value": "infer", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"},  # a preference: never filters
    ],
)


@pytest.mark.parametrize(
    ("tolerations", "tolerated"),
    [
        ([], False),
        ([{"key": "dedicated", "value": "infer"}], True),  # operator defaults to Equal
        ([{"key": "dedicated", "operator": "Equal", "value": "train"}], False),
        ([{"key": "dedicated", "operator": "Exists"}], True),
        ([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], False),
        ([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}], True),
        ([{"operator": "Exists"}], True),  # empty key with Exists tolerates everything
        ([{"operator": "Equal", "value": "infer"}], False),
        ([{"key": "other", "operator": "Exists"}], False),
    ],
)
def test_tolerations(tolerations: list[dict[str, str]], tolerated: bool) -> None:
    c = pod_constraints(pod(tolerations=tolerations))
    assert (untolerated(c, TAINTED) is None) is tolerated


def test_allowed_names_the_reasons_and_none_means_everywhere() -> None:
    nodes = [GPU_NODE, TAINTED, node("gpu-3", {"pool": "serve"})]
    assert (
        allowed_nodes(pod_constraints(pod(tolerations=[{"operator": "Exists"}])), nodes).nodes
        is None
    )
    got = allowed_nodes(
        pod_constraints(pod(affinity=required(expr("pool", "DoesNotExist")))), nodes
    )
    assert got.nodes == frozenset()
    assert got.note == (
        "2 did not match the pod's node selector or affinity, "
        "1 has the untolerated taint dedicated=infer:NoSchedule"
    )


def test_the_cache_forgets_answers_when_a_node_changes() -> None:
    cache = ConstraintCache()
    cache.nodes([GPU_NODE, node("gpu-3", {"pool": "serve"})])
    p = pod(nodeSelector={"pool": "serve"})
    assert cache.allowed(p).nodes == frozenset({"gpu-3"})
    cache.nodes([node("gpu-1", {"pool": "serve"}), node("gpu-3", {"pool": "serve"})])
    assert cache.allowed(p).nodes is None
    cache.nodes([GPU_NODE, TAINTED])
    assert cache.allowed(pod()).nodes == frozenset({"gpu-1"})  # taints apply to every pod
