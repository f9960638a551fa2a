"""What the kube-scheduler checks beyond resources and node constraints, checked the same way
by fgpu, so that the kubelet and the volume binder never reject a pod fgpu placed.

Each check removes nodes from the ones a pod may use (:class:`~fgpu.k8s.constraints.Allowed`)
and says why in kube-scheduler's own words, which then appear in the pod's pending reason
("0/3 nodes fit: 3 excluded by the workload's node constraints (1 Too many pods, 2 node(s)
didn't have free ports for the requested pod ports)"):

- **Allocatable pods** (plugin NodeResourcesFit): a node holds at most
  ``status.allocatable.pods`` pods that are bound to it and not finished (``Succeeded`` or
  ``Failed``), of any scheduler; reason ``Too many pods``.
- **Host ports** (plugin NodePorts): a container port with a ``hostPort`` (in ``containers``
  and in restartable init containers, which keep running) conflicts with a port of a pod
  already on the node with the same protocol (default TCP) and host port, when their
  ``hostIP`` are equal or either is ``0.0.0.0`` (the default); reason ``node(s) didn't have
  free ports for the requested pod ports``.
- **PersistentVolume node affinity** (plugin VolumeBinding): a pod's volume from a
  PersistentVolumeClaim (``persistentVolumeClaim.claimName``, or the claim
  ``<pod>-<volume>`` of a generic ephemeral volume) bound to a PersistentVolume whose
  ``spec.nodeAffinity.required`` does not select the node; reason ``node(s) had volume node
  affinity conflict``. A claim that does not exist waits with ``persistentvolumeclaim
  "NAME" not found``; a claim not yet bound waits too: fgpu neither binds nor provisions
  volumes (the kube-scheduler does this for ``WaitForFirstConsumer`` claims; fgpu does not).

Pod overhead and sidecars are counted in the pod's CPU and memory request
(:func:`fgpu.k8s.objects.container_requests`); :func:`requests_note` names them where a pod
waits for CPU or memory.

Sources: Kubernetes documentation, "Scheduling Framework" (plugins NodeResourcesFit,
NodePorts, VolumeBinding), "Pod Overhead", "Sidecar Containers" and "Effective Pod requests
and limits"; the reasons are the plugins' messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fgpu.k8s.constraints import Allowed, NodeFacts, term_matches
from fgpu.k8s.kube import KubeApi, KubeError

log = logging.getLogger("fgpu.k8s.parity")

Obj = Mapping[str, Any]

TOO_MANY_PODS = "Too many pods"
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"
VOLUME_CONFLICT = "node(s) had volume node affinity conflict"
_TERMINAL = ("Succeeded", "Failed")
_ANY_IP = "0.0.0.0"

Port = tuple[str, str, int]
"""``(protocol, hostIP, hostPort)``."""


def _sidecar(container: Obj) -> bool:
    return container.get("restartPolicy") == "Always"


def host_ports(pod: Obj) -> list[Port]:
    """The host ports a pod takes: ``(protocol, hostIP, hostPort)`` of its containers' and
    restartable init containers' ports with a ``hostPort``."""
    spec = pod.get("spec") or {}
    out: list[Port] = []
    containers = list(spec.get("containers") or [])
    containers += [c for c in spec.get("initContainers") or [] if _sidecar(c)]
    for c in containers:
        for p in c.get("ports") or []:
            port = int(p.get("hostPort") or 0)
            if port > 0:
                out.append((str(p.get("protocol") or "TCP"), str(p.get("hostIP") or _ANY_IP), port))
    return out


def _conflict(a: Port, b: Port) -> bool:
    return a[0] == b[0] and a[2] == b[2] and (a[1] == b[1] or _ANY_IP in (a[1], b[1]))


def claim_names(pod: Obj) -> list[str]:
    """The PersistentVolumeClaims a pod's volumes use (a generic ephemeral volume's claim is
    named ``<pod>-<volume>``)."""
    name = (pod.get("metadata") or {}).get("name", "")
    out: list[str] = []
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if v.get("persistentVolumeClaim"):
            out.append(str(v["persistentVolumeClaim"].get("claimName", "")))
        elif v.get("ephemeral"):
            out.append(f"{name}-{v.get('name', '')}")
    return out


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """What is on the fgpu nodes: pods counted against ``allocatable.pods``, host ports.

    Attributes:
        capacity: node name -> ``status.allocatable.pods`` (absent: no limit read).
        pods: node name -> pods bound there and not finished.
        ports: node name -> host ports taken there.
    """

    capacity: dict[str, int]
    pods: dict[str, int]
    ports: dict[str, list[Port]]

    def full(self) -> set[str]:
        """Nodes with no room for one more pod."""
        return {n for n, cap in self.capacity.items() if self.pods.get(n, 0) >= cap}


def _pod_facts(pod: Obj) -> tuple[str | None, bool, tuple[Port, ...], str]:
    """``(node, unfinished, host ports, key)`` of one pod object."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    live = (pod.get("status") or {}).get("phase") not in _TERMINAL
    key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    return node, live, tuple(host_ports(pod)), key


def _capacity(node: Obj) -> int | None:
    text = ((node.get("status") or {}).get("allocatable") or {}).get("pods")
    if text is None:
        return None
    try:
        return int(str(text))
    except ValueError:
        log.warning("node %s: allocatable pods %r is not a number", node["metadata"]["name"], text)
        return None


class LoadCounter:
    """:class:`NodeLoad` round after round, reading each pod and node object once: what it
    reads of an object is remembered while the cache holds that very object (the cache
    replaces an object when it changes), so a round costs a dictionary lookup per pod."""

    def __init__(self) -> None:
        self._pods: dict[int, tuple[Obj, tuple[str | None, bool, tuple[Port, ...], str]]] = {}
        self._nodes: dict[int, tuple[Obj, int | None]] = {}

    def count(
        self, nodes: Iterable[Obj], pods: Sequence[Obj], assumed: Mapping[str, str] | None = None
    ) -> NodeLoad:
        """The :class:`NodeLoad` of ``nodes`` from every pod object.

        Args:
            nodes: Node objects (only these are counted).
            pods: all pods (any scheduler).
            assumed: pod key -> node of pods bound by this scheduler that the pod objects
                do not show bound yet.
        """
        capacity: dict[str, int] = {}
        seen_nodes: dict[int, tuple[Obj, int | None]] = {}
        for n in nodes:
            m = self._nodes.get(id(n))
            if m is None or m[0] is not n:
                m = (n, _capacity(n))
            seen_nodes[id(n)] = m
            if m[1] is not None:
                capacity[n["metadata"]["name"]] = m[1]
        self._nodes = seen_nodes
        count: dict[str, int] = {}
        ports: dict[str, list[Port]] = {}
        late = assumed or {}
        memo = self._pods
        for pod in pods:
            got = memo.get(id(pod))
            if got is None or got[0] is not pod:
                got = memo[id(pod)] = (pod, _pod_facts(pod))
            node, live, taken, key = got[1]
            if not live or (node is None and (node := late.get(key)) is None):
                continue
            count[node] = count.get(node, 0) + 1
            if taken:
                ports.setdefault(node, []).extend(taken)
        if len(memo) > 2 * len(pods) + 1024:  # objects the cache let go: forget them now and then
            held = {id(p) for p in pods}
            self._pods = {k: v for k, v in memo.items() if k in held}
        return NodeLoad(capacity, count, ports)


def node_load(
    nodes: Iterable[Obj], pods: Sequence[Obj], assumed: Mapping[str, str] | None = None
) -> NodeLoad:
    """:meth:`LoadCounter.count` without memory between calls."""
    return LoadCounter().count(nodes, pods, assumed)


class VolumeLookup:
    """PersistentVolumeClaims and PersistentVolumes read on demand and remembered: a bound
    claim's volume and a volume's node affinity do not change, so each is read once; a
    claim missing or not bound yet is read again after ``recheck_s``.

    Args:
        api: the Kubernetes API.
        clock: monotonic seconds.
        recheck_s: seconds before a missing or unbound claim is read again.
    """

    def __init__(
        self, api: KubeApi, clock: Callable[[], float] = time.monotonic, recheck_s: float = 10.0
    ) -> None:
        self.api = api
        self.clock = clock
        self.recheck_s = recheck_s
        self._bound: dict[tuple[str, str], tuple[str, str]] = {}  # claim -> (uid, volume)
        self._waiting: dict[tuple[str, str], tuple[float, str]] = {}  # claim -> (at, why)
        self._terms: dict[str, tuple[Obj, ...] | None] = {}  # volume -> required terms

    def volume_of(self, namespace: str, claim: str) -> str:
        """The PersistentVolume bound to a claim.

        Raises:
            LookupError: naming why the pod must wait (missing or unbound claim).
        """
        key = (namespace, claim)
        if key in self._bound:
            return self._bound[key][1]
        seen = self._waiting.get(key)
        if seen is not None and self.clock() - seen[0] < self.recheck_s:
            raise LookupError(seen[1])
        try:
            obj = self.api._call(
                self.api.core.read_namespaced_persistent_volume_claim, claim, namespace
            )
        except KubeError as exc:
            why = (
                f'persistentvolumeclaim "{claim}" not found'
                if exc.status == 404
                else f'persistentvolumeclaim "{claim}" could not be read ({exc.reason})'
            )
            self._waiting[key] = (self.clock(), why)
            raise LookupError(why) from None
        volume = (obj.get("spec") or {}).get("volumeName")
        if not volume:
            why = (
                f'persistentvolumeclaim "{claim}" is not bound to a volume yet; fgpu does not '
                "bind or provision volumes (bind it first, or use a StorageClass with "
                "volumeBindingMode Immediate)"
            )
            self._waiting[key] = (self.clock(), why)
            raise LookupError(why)
        self._waiting.pop(key, None)
        self._bound[key] = (str(obj["metadata"].get("uid", "")), str(volume))
        return str(volume)

    def terms(self, volume: str) -> tuple[Obj, ...] | None:
        """A volume's ``spec.nodeAffinity.required.nodeSelectorTerms`` (None: any node).

        Raises:
            LookupError: the volume cannot be read.
        """
        if volume in self._terms:
            return self._terms[volume]
        try:
            obj = self.api.get_volume(volume)
        except KubeError as exc:
            raise LookupError(f'persistentvolume "{volume}" not found ({exc.reason})') from None
        required = (((obj.get("spec") or {}).get("nodeAffinity") or {}).get("required")) or None
        found = None if required is None else tuple(required.get("nodeSelectorTerms") or ())
        self._terms[volume] = found
        return found


def narrow(
    pod: Obj,
    allowed: Allowed,
    facts: Sequence[NodeFacts],
    load: NodeLoad,
    full: set[str],
    volumes: VolumeLookup | None,
) -> Allowed:
    """``allowed`` less the nodes these checks exclude for ``pod``, with their reasons added
    to the note (each node counted once, under its first reason).

    Raises:
        LookupError: the pod must wait whatever the node (a claim missing or not bound).
    """
    ports = host_ports(pod)
    terms_list: list[tuple[Obj, ...]] = []
    if volumes is not None:
        namespace = (pod.get("metadata") or {}).get("namespace", "default")
        for claim in claim_names(pod):
            terms = volumes.terms(volumes.volume_of(namespace, claim))
            if terms is not None:
                terms_list.append(terms)
    if not full and not ports and not terms_list:
        return allowed
    names = [f.name for f in facts] if allowed.nodes is None else sorted(allowed.nodes)
    by_name = {f.name: f for f in facts}
    keep: list[str] = []
    counts: dict[str, int] = {}
    for name in names:
        why = None
        if name in full:
            why = TOO_MANY_PODS
        elif ports and any(_conflict(p, q) for p in ports for q in load.ports.get(name, ())):
            why = PORTS_TAKEN
        elif terms_list and name in by_name:
            node = by_name[name]
            if not all(any(term_matches(t, node) for t in terms) for terms in terms_list):
                why = VOLUME_CONFLICT
        if why is None:
            keep.append(name)
        else:
            counts[why] = counts.get(why, 0) + 1
    if not counts:
        return allowed
    parts = [allowed.note] if allowed.note else []
    parts += [f"{n} {why}" for why, n in counts.items()]
    return Allowed(frozenset(keep), ", ".join(parts))


class RoundTally:
    """Placements of one round checked against each other: the decision core places many
    pods at once, and two of them must not take a node's last pod slot or the same host
    port (the kube-scheduler, one pod at a time, sees its earlier choice in its cache).

    Args:
        load: the nodes' load at the start of the round.
    """

    def __init__(self, load: NodeLoad) -> None:
        self.load = load
        self._pods: dict[str, int] = {}
        self._ports: dict[str, list[Port]] = {}

    def admit(self, pod: Obj, node: str) -> str | None:
        """Record ``pod`` on ``node`` and return None, or the reason it must wait."""
        cap = self.load.capacity.get(node)
        have = self.load.pods.get(node, 0) + self._pods.get(node, 0)
        if cap is not None and have >= cap:
            return f"0/1 nodes fit: {node}: {TOO_MANY_PODS} (taken this round)"
        ports = host_ports(pod)
        taken = self._ports.get(node, [])
        if any(_conflict(p, q) for p in ports for q in taken):
            return f"0/1 nodes fit: {node}: {PORTS_TAKEN} (taken this round)"
        self._pods[node] = self._pods.get(node, 0) + 1
        if ports:
            self._ports.setdefault(node, []).extend(ports)
        return None


def requests_note(pod: Obj) -> str:
    """What a pod's CPU and memory request holds beyond its containers (its overhead, its
    sidecars), for a reason about CPU or memory; empty when nothing."""
    spec = pod.get("spec") or {}
    parts = []
    overhead = spec.get("overhead") or {}
    if overhead.get("cpu") or overhead.get("memory"):
        shown = ", ".join(f"{k} {overhead[k]}" for k in ("cpu", "memory") if overhead.get(k))
        parts.append(f"the pod overhead ({shown}) of its RuntimeClass")
    sidecars = [str(c.get("name")) for c in spec.get("initContainers") or [] if _sidecar(c)]
    if sidecars:
        parts.append(f"restartable init (sidecar) containers {', '.join(sidecars)}")
    return f"requests include {' and '.join(parts)}" if parts else ""
