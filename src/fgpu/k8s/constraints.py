"""Where a pod may run: its node selector, required node affinity and tolerations against the
nodes' labels and taints, as the kube-scheduler reads them.

The decision core takes the result as :attr:`fgpu.sched.workload.Workload.nodes` (allowed
node names), so placement, preemption and reservation all stay on nodes the pod can use.

Rules (Kubernetes documentation, "Assigning Pods to Nodes" and "Taints and Tolerations"):

- ``spec.nodeSelector``: every key must be a node label with exactly that value.
- ``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``: the node
  must match at least one of ``nodeSelectorTerms``; a term matches when all its
  ``matchExpressions`` (on labels) and ``matchFields`` (only ``metadata.name``) match; a
  term with neither matches no node. Operators: ``In``, ``NotIn``, ``Exists``,
  ``DoesNotExist``, ``Gt``, ``Lt`` (integers; a label that is not one does not match).
  ``NotIn`` and ``DoesNotExist`` match nodes without the label. An unknown operator matches
  nothing. Preferred (soft) affinity is not read: fgpu's placement policy decides among the
  allowed nodes.
- Taints with effect ``NoSchedule`` or ``NoExecute`` keep out every pod that does not
  tolerate them (``PreferNoSchedule`` is a preference and is not read). A toleration
  tolerates a taint when its effect is empty or the same, and either its key is empty with
  operator ``Exists`` (everything), or the keys are equal and the operator is ``Exists`` or
  ``Equal`` (the default) with equal values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]

_BLOCKING = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What constraints are checked against on one node.

    Attributes:
        name: the node's name.
        labels: its labels, as sorted ``(key, value)`` pairs.
        taints: its ``NoSchedule``/``NoExecute`` taints as ``(key, value, effect)``.
    """

    name: str
    labels: tuple[tuple[str, str], ...]
    taints: tuple[tuple[str, str, str], ...]


def node_facts(obj: Obj) -> NodeFacts:
    """The :class:`NodeFacts` of a Node object."""
    meta = obj.get("metadata") or {}
    labels = tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items()))
    taints = tuple(
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in (obj.get("spec") or {}).get("taints") or []
        if t.get("effect") in _BLOCKING
    )
    return NodeFacts(str(meta.get("name", "")), labels, taints)


@dataclass(frozen=True, slots=True)
class PodConstraints:
    """A pod's node selector, required node affinity terms and tolerations (raw API
    shapes)."""

    selector: Mapping[str, str]
    terms: tuple[Obj, ...] | None
    tolerations: tuple[Obj, ...]

    @property
    def key(self) -> str:
        """A canonical text: pods with equal keys may use the same nodes."""
        return json.dumps(
            [self.selector, self.terms, self.tolerations], sort_keys=True, default=str
        )


def pod_constraints(pod: Obj) -> PodConstraints:
    """Read a pod's constraints (absent parts are empty)."""
    spec = pod.get("spec") or {}
    selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or None
    terms = None if required is None else tuple(required.get("nodeSelectorTerms") or ())
    return PodConstraints(selector, terms, tuple(spec.get("tolerations") or ()))


def _int(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _expression(expr: Obj, value: str | None) -> bool:
    """One ``matchExpressions``/``matchFields`` item against a value (None: absent)."""
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _int(value), _int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term(term: Obj, node: NodeFacts, labels: Mapping[str, str]) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    for e in exprs:
        if not _expression(e, labels.get(str(e.get("key")))):
            return False
    for f in fields:
        value = node.name if f.get("key") == "metadata.name" else None
        if not _expression(f, value):
            return False
    return True


def term_matches(term: Obj, node: NodeFacts) -> bool:
    """Whether one ``nodeSelectorTerms`` item (``matchExpressions`` on labels,
    ``matchFields`` on ``metadata.name``) selects ``node`` (a PersistentVolume's node
    affinity uses the same shape)."""
    return _term(term, node, dict(node.labels))


def _tolerates(toleration: Obj, taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    if toleration.get("effect") and toleration.get("effect") != effect:
        return False
    op = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return op == "Exists"
    if toleration.get("key") != key:
        return False
    return op == "Exists" or (op == "Equal" and str(toleration.get("value") or "") == value)


def untolerated(c: PodConstraints, node: NodeFacts) -> tuple[str, str, str] | None:
    """The first taint of ``node`` that ``c`` does not tolerate, or None."""
    for taint in node.taints:
        if not any(_tolerates(t, taint) for t in c.tolerations):
            return taint
    return None


def matches(c: PodConstraints, node: NodeFacts) -> bool:
    """Whether the node selector and required node affinity of ``c`` select ``node``."""
    labels = dict(node.labels)
    for k, v in c.selector.items():
        if labels.get(k) != v:
            return False
    return c.terms is None or any(_term(t, node, labels) for t in c.terms)


@dataclass(frozen=True, slots=True)
class Allowed:
    """Where a pod may run.

    Attributes:
        nodes: allowed node names, or None when every node given is allowed.
        note: why the others are not (``"2 did not match the node selector or affinity,
            1 has the untolerated taint gpu=shared:NoSchedule"``); empty when all are.
    """

    nodes: frozenset[str] | None
    note: str


def allowed_nodes(c: PodConstraints, nodes: Sequence[NodeFacts]) -> Allowed:
    """The nodes of ``nodes`` a pod with constraints ``c`` may run on."""
    ok: list[str] = []
    unmatched = 0
    tainted: dict[tuple[str, str, str], int] = {}
    for node in nodes:
        if not matches(c, node):
            unmatched += 1
            continue
        taint = untolerated(c, node)
        if taint is not None:
            tainted[taint] = tainted.get(taint, 0) + 1
            continue
        ok.append(node.name)
    if len(ok) == len(nodes):
        return Allowed(None, "")
    parts = []
    if unmatched:
        parts.append(f"{unmatched} did not match the pod's node selector or affinity")
    for (key, value, effect), count in sorted(tainted.items()):
        shown = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
        parts.append(f"{count} {'has' if count == 1 else 'have'} the untolerated taint {shown}")
    return Allowed(frozenset(ok), ", ".join(parts))


class ConstraintCache:
    """:func:`allowed_nodes` remembered per distinct pod constraints while the nodes' facts
    are unchanged (pods of one workload share their constraints; the answer is computed
    once per round at most)."""

    def __init__(self) -> None:
        self._facts: tuple[NodeFacts, ...] = ()
        self._memo: dict[str, Allowed] = {}
        self._tainted = False

    def nodes(self, facts: Sequence[NodeFacts]) -> None:
        """The fgpu nodes of this round; forgets answers when their facts changed."""
        facts = tuple(facts)
        if facts != self._facts:
            self._facts = facts
            self._memo.clear()
            self._tainted = any(f.taints for f in facts)

    def allowed(self, pod: Obj) -> Allowed:
        """Where ``pod`` may run among the nodes of :meth:`nodes`."""
        spec = pod.get("spec") or {}
        if not self._tainted and not spec.get("nodeSelector") and not spec.get("affinity"):
            return Allowed(None, "")  # the common case, without reading anything
        c = pod_constraints(pod)
        key = c.key
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= 4096:
                self._memo.clear()
            found = self._memo[key] = allowed_nodes(c, self._facts)
        return found
