"""``fgpu k8s webhook``: the admission webhook for fgpu pods.

On pod creation it checks the ``fgpu.io/*`` annotations with the rules and the wording of
the CLI and the API (:func:`fgpu.k8s.objects.pod_ask`, which calls
:func:`fgpu.rules.requests.parse_resources`), and refuses a bad pod naming the annotation
and the reason; also an ``fgpu.io/`` annotation fgpu neither reads nor writes (with the
closest one it reads), ``spec.nodeName`` (the pod would skip the scheduler), a
``schedulerName`` other than empty, ``default-scheduler`` or ``fgpu``, and ``nvidia.com/gpu``
resources (GPUs from the device plugin as well). A good pod gets, as one JSON patch:

- ``spec.schedulerName: fgpu``;
- ``fgpu.io/queue`` when absent (``default``);
- ``fgpu.io/env-configmap: fgpu-env-<random>``: the name of the pod's environment
  ConfigMap, always a fresh one (a given name is another pod's: a copied pod). It is chosen
  here, not from the pod's name, because a pod made from ``generateName`` has no name yet
  when admission runs;
- the annotations the scheduler writes (``fgpu.io/assignment``, ``fgpu.io/gpu-uuids``,
  ``fgpu.io/hold``) removed: in a copied pod they are the other pod's placement;
- in every container and init container, ``envFrom`` that ConfigMap (not optional: the
  kubelet does not start the container before the scheduler has written it, and the
  scheduler writes it before the bind);
- the node agent's socket folder: a ``hostPath`` volume ``fgpu-agent`` of the host's
  ``/run/fgpu`` (``DirectoryOrCreate``), mounted read only at ``/run/fgpu`` in every
  container and init container, where ``FGPU_AGENT_SOCKET`` (``/run/fgpu/agent.sock``)
  points, so that :mod:`fgpu.sdk` hints reach the agent. Read only is enough to send on a
  Unix socket and keeps the pod from removing or replacing the agent's socket. The folder,
  not the socket file, is mounted so that a restarted agent's new socket is seen. Off with
  ``agent_socket_volume=False`` (``--no-agent-socket-volume``; e.g. namespaces whose Pod
  Security level forbids ``hostPath``): pods then send no hints.

A pod that sets ``NVIDIA_VISIBLE_DEVICES``, ``CUDA_VISIBLE_DEVICES`` or ``FGPU_*`` in a
container's own ``env`` is refused: ``env`` wins over ``envFrom``, and the container would
see GPUs it was not given. With the socket volume on, a pod is refused when it has another
volume named ``fgpu-agent`` or a container mounts anything else at or below ``/run/fgpu``;
the exact volume and mounts the webhook adds are accepted as they are (a pod copied from an
admitted one).

**The DRA path (default).** Instead of the ConfigMap, the ``envFrom`` and the ``hostPath``
volume above, a good pod that asks for GPUs gets a ResourceClaim: the ``spec.resourceClaims``
entry ``fgpu-gpu`` from the namespace's ResourceClaimTemplate ``fgpu-gpu`` (one device of
class ``gpu.fgpu.io``; the scheduler creates the template where pods name it), referenced
by every container and init container (``resources.claims``), and the toleration of the
fgpu nodes' taint ``fgpu.io/gpu:NoSchedule``. The node's DRA driver puts the GPU, the
interposer and the hint socket's folder into the containers through CDI
(:mod:`fgpu.k8s.dra`), so the pod needs no ``hostPath`` and passes Pod Security
``restricted``. fgpu allocates only the claim it makes for the pod: a ``fgpu-gpu`` entry
other than fgpu's own, and (in the validating webhook, which reads them) any other entry
naming a claim or template of class ``gpu.fgpu.io``, are refused. Refused besides:
a privileged container (it would see every device of the node), also as an ephemeral
container added later (``kubectl debug --profile=sysadmin``), and ``LD_PRELOAD`` or
``FGPU_SEG`` in a container's own ``env`` (they carry the interposer). The ConfigMap path
stays behind ``env_without_isolation`` (``--env-without-isolation``), for clusters before
Kubernetes 1.34 and trusted single-tenant use: it does not isolate anything.

On pod update it only checks (never patches): a change to an annotation fgpu writes
(:data:`fgpu.k8s.wire.FGPU_ANNOTATIONS`) is refused unless the request's user is the
scheduler's (:func:`check_update`).

The HTTP side (the ``/mutate`` and ``/validate`` endpoints, the reads of Namespaces and
Queues) is :mod:`fgpu.k8s.webhook_app`.

Which pods come here is the webhook configuration's choice (deploy/: the creation of pods
whose ``schedulerName`` is ``fgpu`` or that carry an ``fgpu.io/`` annotation, and updates
that change one of those annotations).
"""

from __future__ import annotations

import difflib
import logging
import posixpath
import secrets
from collections.abc import Mapping
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.objects import PodRequestError, pod_ask
from fgpu.k8s.webhook_dra import dra_ops

log = logging.getLogger("fgpu.k8s.webhook")

Obj = Mapping[str, Any]

AGENT_DIR = posixpath.dirname(wire.AGENT_SOCKET)
"""The host folder of the node agent's socket, mounted at the same path in pods."""
AGENT_VOLUME = "fgpu-agent"
"""The name of the pod volume that holds it."""
_AGENT_DIRS = (AGENT_DIR, "/var" + AGENT_DIR)
"""Where a mount would take the folder's place (``/var/run`` is a link to ``/run`` in most
images, and the container runtime follows it)."""


def normal_path(path: str) -> str:
    """``path`` with ``.``, ``..`` and repeated slashes resolved as a mount destination is
    (``//run//fgpu``, ``/run/fgpu/../fgpu`` and ``/run/fgpu/`` are all ``/run/fgpu``;
    :func:`posixpath.normpath` alone keeps a leading ``//``)."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def agent_volume() -> dict[str, Any]:
    """The ``hostPath`` volume of the agent's socket folder."""
    return {"name": AGENT_VOLUME, "hostPath": {"path": AGENT_DIR, "type": "DirectoryOrCreate"}}


def agent_mount() -> dict[str, Any]:
    """Its mount in a container (read only: sending on a Unix socket needs no more)."""
    return {"name": AGENT_VOLUME, "mountPath": AGENT_DIR, "readOnly": True}


def _escape(key: str) -> str:
    """A JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def wants_fgpu(pod: Obj) -> bool:
    """Whether the pod is fgpu's: ``schedulerName: fgpu`` or any ``fgpu.io/`` annotation
    (a misspelt one included: :func:`check_annotation_keys` refuses it with a suggestion
    rather than letting the pod run without the GPU it asked for)."""
    if (pod.get("spec") or {}).get("schedulerName") == wire.SCHEDULER_NAME:
        return True
    return any(k.startswith(wire.PREFIX) for k in wire.annotations_of(pod))


def check_annotation_keys(pod: Obj) -> None:
    """Refuse ``fgpu.io/`` annotation keys that fgpu neither reads nor writes.

    Raises:
        PodRequestError: naming the key and the closest annotation a user writes.
    """
    known = set(wire.USER_ANNOTATIONS) | set(wire.FGPU_ANNOTATIONS)
    for key in sorted(wire.annotations_of(pod)):
        if not key.startswith(wire.PREFIX) or key in known:
            continue
        names = {k.removeprefix(wire.PREFIX): k for k in wire.USER_ANNOTATIONS}
        word = key.removeprefix(wire.PREFIX).lower()
        close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
        hint = f"did you mean {names[close[0]]}? " if close else ""
        raise PodRequestError(
            key,
            f"not an fgpu annotation; {hint}fgpu reads {', '.join(wire.USER_ANNOTATIONS)}",
        )


SCHEDULERS_FOR_FGPU = ("", "default-scheduler", wire.SCHEDULER_NAME)
"""The ``schedulerName`` values an fgpu pod may come with (the webhook sets ``fgpu``)."""

DEVICE_PLUGIN_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""Extended resources of the NVIDIA device plugin (``nvidia.com/gpu``, its renamed shared
forms ``nvidia.com/gpu.shared``, and MIG strategy ``mixed``'s ``nvidia.com/mig-*``)."""


def check_spec(pod: Obj) -> None:
    """The spec checks of an fgpu pod at creation: no node of its own, no other scheduler,
    no GPUs from the NVIDIA device plugin, no variable the environment ConfigMap owns.

    Raises:
        PodRequestError: naming the field and the reason.
    """
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        raise PodRequestError(
            "spec.nodeName",
            f"{spec['nodeName']!r} is set: a pod that names its node skips the scheduler, so "
            "fgpu never gives it GPUs and it waits forever; remove spec.nodeName (choose "
            "nodes with nodeSelector or node affinity, which fgpu honours)",
        )
    scheduler = spec.get("schedulerName") or ""
    if scheduler not in SCHEDULERS_FOR_FGPU:
        raise PodRequestError(
            "spec.schedulerName",
            f"{scheduler!r} is another scheduler, but the pod's fgpu.io/ annotations ask for "
            f"the fgpu scheduler ({wire.SCHEDULER_NAME}); remove the fgpu.io/ annotations or "
            "the schedulerName",
        )
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            for part in ("requests", "limits"):
                asked = (c.get("resources") or {}).get(part) or {}
                for resource in asked:
                    if str(resource).startswith(DEVICE_PLUGIN_PREFIXES):
                        raise PodRequestError(
                            f"spec.{group}[{i}].resources.{part}",
                            f"{resource} comes from the NVIDIA device plugin; a pod takes its "
                            "GPUs from fgpu (fgpu.io/ annotations) or from the device plugin, "
                            f"not both: remove {resource} or the fgpu.io/ annotations",
                        )
            for env in c.get("env") or []:
                name = env.get("name", "")
                if name in wire.RESERVED_ENV:
                    raise PodRequestError(
                        f"spec.{group}[{i}].env",
                        f"{name} is set by fgpu from the GPUs the pod is given; remove it",
                    )


def mutate(
    pod: Obj,
    configmap_name: str | None = None,
    *,
    agent_socket_volume: bool = True,
    env_without_isolation: bool = False,
    queue: str = wire.DEFAULT_QUEUE,
) -> list[dict[str, Any]]:
    """The JSON patch that admits ``pod`` (empty for a pod that is not fgpu's).

    Args:
        pod: the pod as submitted.
        configmap_name: the environment ConfigMap's name (default: ``fgpu-env-`` and 10
            random hex digits; only with ``env_without_isolation``).
        agent_socket_volume: mount the agent's socket folder (module docstring; only with
            ``env_without_isolation``: on the DRA path the CDI spec mounts it).
        env_without_isolation: the ConfigMap path, which does not isolate (module
            docstring); default: the DRA path.
        queue: the ``fgpu.io/queue`` a pod without one gets (its namespace's default,
            :func:`fgpu.k8s.tenancy.default_queue`).

    Raises:
        PodRequestError: a bad annotation (naming it and the reason, as the CLI would), a
            container that sets a variable the ConfigMap owns, or a volume or mount that
            takes the agent socket's name or place.
    """
    if not wants_fgpu(pod):
        return []
    check_annotation_keys(pod)
    check_spec(pod)
    ask = pod_ask(pod)  # the same checks as `fgpu submit`
    spec = pod.get("spec") or {}
    notes = wire.annotations_of(pod)
    ops: list[dict[str, Any]] = []
    if not (pod.get("metadata") or {}).get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key in wire.SCHEDULER_ANNOTATIONS + wire.AGENT_ANNOTATIONS:  # copied: not this pod's
        if key in notes:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(key)}"})
    if wire.QUEUE not in notes:
        ops.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_escape(wire.QUEUE)}",
                "value": queue,
            }
        )
    if spec.get("schedulerName") != wire.SCHEDULER_NAME:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": wire.SCHEDULER_NAME})
    if not env_without_isolation:
        if wire.ENV_CONFIGMAP in notes:  # copied from a pod of the ConfigMap path
            path = f"/metadata/annotations/{_escape(wire.ENV_CONFIGMAP)}"
            ops.append({"op": "remove", "path": path})
        return ops + dra_ops(pod, bool(ask.request.gpu_count or ask.mig_profile))
    # always a fresh name (a given one is another pod's: the scheduler would never bind
    # this one); "add" replaces a member that exists
    name = configmap_name or f"{ENV_PREFIX}{secrets.token_hex(5)}"
    ops.append(
        {"op": "add", "path": f"/metadata/annotations/{_escape(wire.ENV_CONFIGMAP)}", "value": name}
    )
    source = {"configMapRef": {"name": name, "optional": False}}
    copied = notes.get(wire.ENV_CONFIGMAP)

    def fgpus(ref: Obj) -> bool:
        """A reference to an fgpu environment ConfigMap (copied from another pod, in any
        spelling): it is replaced by this pod's own."""
        cm = ref.get("configMapRef") or {}
        named = str(cm.get("name") or "")
        return bool(cm) and (named in (copied, name) or named.startswith(ENV_PREFIX))

    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            refs = c.get("envFrom") or []
            kept = [r for r in refs if not fgpus(r)]
            if len(kept) == len(refs) and refs:
                ops.append({"op": "add", "path": f"/spec/{group}/{i}/envFrom/-", "value": source})
            else:  # none yet, or the copied pod's reference: replaced, not duplicated
                ops.append(
                    {"op": "add", "path": f"/spec/{group}/{i}/envFrom", "value": [*kept, source]}
                )
    if agent_socket_volume:
        ops.extend(_agent_socket_ops(spec))
    return ops


ENV_PREFIX = "fgpu-env-"
"""Names of the pods' environment ConfigMaps start so; an ``envFrom`` reference to one in a
new pod (copied from another pod) is replaced by the pod's own."""


def _agent_socket_ops(spec: Obj) -> list[dict[str, Any]]:
    """The ops that add the agent socket's volume and mounts (none where the pod has them
    exactly as the webhook would add them).

    Raises:
        PodRequestError: another volume named ``fgpu-agent``, or another mount at or below
            ``/run/fgpu``.
    """
    ops: list[dict[str, Any]] = []
    volumes = spec.get("volumes") or []
    have_volume = False
    for i, volume in enumerate(volumes):
        if volume.get("name") != AGENT_VOLUME:
            continue
        if volume.get("hostPath") != agent_volume()["hostPath"] or set(volume) != {
            "name",
            "hostPath",
        }:
            raise PodRequestError(
                f"spec.volumes[{i}].name",
                f"{AGENT_VOLUME} is the volume fgpu adds for the node agent's socket "
                f"(hostPath {AGENT_DIR}, DirectoryOrCreate); rename this volume",
            )
        have_volume = True
    if not have_volume:
        if volumes:
            ops.append({"op": "add", "path": "/spec/volumes/-", "value": agent_volume()})
        else:
            ops.append({"op": "add", "path": "/spec/volumes", "value": [agent_volume()]})
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            mounts = c.get("volumeMounts") or []
            mounted = False
            for j, m in enumerate(mounts):
                where = normal_path(str(m.get("mountPath", "")))
                if not any(where == d or where.startswith(d + "/") for d in _AGENT_DIRS):
                    continue
                if dict(m, mountPath=where) == agent_mount():
                    mounted = True  # exactly the webhook's (a pod copied from an admitted one)
                    continue
                raise PodRequestError(
                    f"spec.{group}[{i}].volumeMounts[{j}].mountPath",
                    f"{AGENT_DIR} is where fgpu mounts the node agent's socket folder "
                    f"(FGPU_AGENT_SOCKET={wire.AGENT_SOCKET}, volume {AGENT_VOLUME}, read "
                    "only); mount this volume elsewhere",
                )
            if mounted:
                continue
            path = f"/spec/{group}/{i}/volumeMounts"
            if mounts:
                ops.append({"op": "add", "path": f"{path}/-", "value": agent_mount()})
            else:
                ops.append({"op": "add", "path": path, "value": [agent_mount()]})
    return ops


SCHEDULER_USER = wire.SCHEDULER_USER
AGENT_USER = wire.AGENT_USER


def check_update(
    old: Obj,
    new: Obj,
    username: str,
    *,
    scheduler_user: str = SCHEDULER_USER,
    agent_user: str = AGENT_USER,
) -> None:
    """Refuse an update of a pod that adds, changes or removes an annotation fgpu writes
    (``fgpu.io/assignment`` is the scheduler's record of what a bound pod holds: editing it
    would let a pod hold GPUs the ledger does not count; ``fgpu.io/suspend`` removed by
    hand would restore a suspended pod onto GPUs given to others) unless ``username`` is
    the scheduler's, or the node agents' for the annotations they write
    (:data:`fgpu.k8s.wire.AGENT_ANNOTATIONS`). The user annotations stay editable: a bound
    pod is counted by its assignment, not by them.

    Raises:
        PodRequestError: naming the annotation and the reason.
    """
    if username == scheduler_user:
        return
    before, after = wire.annotations_of(old), wire.annotations_of(new)
    for key in wire.FGPU_ANNOTATIONS:
        if before.get(key) == after.get(key):
            continue
        if username == agent_user and key in wire.AGENT_ANNOTATIONS:
            continue
        change = "remove" if key not in after else "add" if key not in before else "change"
        writer = (
            "webhook"
            if key in wire.WEBHOOK_ANNOTATIONS
            else "node agent"
            if key in wire.AGENT_ANNOTATIONS
            else "scheduler"
        )
        allowed = f"the fgpu scheduler ({scheduler_user})" + (
            f" and node agent ({agent_user})" if key in wire.AGENT_ANNOTATIONS else ""
        )
        raise PodRequestError(
            key,
            f"written by the fgpu {writer} ({_WHAT.get(key, 'its state of the pod')}); only "
            f"{allowed} may change it, so {username or 'an unknown user'} may not {change} it",
        )


_WHAT = {
    wire.ASSIGNMENT: "its ledger of the GPUs the pod holds",
    wire.GPU_UUIDS: "the GPUs the pod was given",
    wire.HOLD: "the capacity held for the pod while others are preempted",
    wire.ENV_CONFIGMAP: "the ConfigMap of the pod's GPU environment",
    wire.SQUEEZED_BY: "the pods that took its compute",
    wire.SUSPEND: "whether the pod is suspended to host memory",
    wire.SUSPENDED: "the node agent's record of the pod's suspend",
    wire.RESTORED: "the node agent's record of the pod's restore",
}
