"""Dynamic admission as the API server does it (test stand-in): which webhooks and
ValidatingAdmissionPolicies a request reaches, and what they answer.

The configurations are given to the stand-in (:attr:`fgpu_standin.Options.admission`,
``fgpu k8s standin --admission FILE``), not served as API objects. For each write the
stand-in builds one :class:`Attributes` and:

1. calls every ``MutatingWebhookConfiguration`` webhook that matches, in the order of the
   configurations' names and then of their webhooks, applying each JSON patch before the
   next is asked;
2. then evaluates every ``ValidatingAdmissionPolicy`` that a
   ``ValidatingAdmissionPolicyBinding`` binds with ``validationActions`` containing ``Deny``,
   and calls every ``ValidatingWebhookConfiguration`` webhook that matches, on the mutated
   object (their patches, if any, are ignored: validation cannot change an object).

A webhook matches (Kubernetes documentation, "Dynamic Admission Control", "Matching
requests"): one of its ``rules`` names the operation, group, version, resource (with
subresource: ``pods`` never matches ``pods/status``; ``*/*`` and ``pods/*`` do) and scope;
its ``namespaceSelector`` matches the labels of the request's namespace (for a namespaced
object; a Namespace matches on its own labels; other cluster-scoped objects are never
skipped by it); its ``objectSelector`` matches the labels of the object or of the old
object; and every ``matchConditions`` CEL expression is true (variables ``object``,
``oldObject``, ``request``; an expression that errors fails the call by the webhook's
``failurePolicy``). A namespace that has no object here carries only the label the API
server sets on every namespace, ``kubernetes.io/metadata.name``.

A policy (Kubernetes documentation, "Validating Admission Policy") applies when its
``matchConstraints`` and its binding's ``matchResources`` (rules and selectors as above)
and its ``matchConditions`` all hold; each of its ``validations`` must then be true, with
``object``, ``oldObject``, ``request``, ``namespaceObject``, ``params`` (always null here:
``paramKind`` is not supported) and ``variables``. A false validation refuses the request
with ``message`` (or ``messageExpression``), worded as the API server words it:
``ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE``, with the
validation's ``reason`` (default ``Invalid``, code 422).

CEL is evaluated with ``cel-python`` (a dev dependency of fgpu, imported only when a
configuration has an expression): the Kubernetes CEL libraries (``quantity``, ``url``,
``authorizer``) are absent.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fgpu_standin.patch import PatchError, json_patch
from fgpu_standin.store import ApiStatusError, Obj

MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"
ADMISSION_KINDS = (MUTATING, VALIDATING, POLICY, BINDING)

Caller = Callable[[str, Obj, Obj], Awaitable[Obj]]
"""``call(url, webhook, review) -> AdmissionReview response``; raises
:class:`ApiStatusError` when the call itself fails."""


@dataclass(frozen=True, slots=True)
class Attributes:
    """One request as admission sees it.

    Attributes:
        operation: ``CREATE``, ``UPDATE`` or ``DELETE``.
        group, version, resource: the resource (``""``, ``v1``, ``pods``).
        subresource: ``""``, ``status``, ``binding``, ...
        namespaced: whether the resource is namespaced.
        namespace: the request's namespace (``""`` for cluster-scoped objects).
        name: the object's name.
        kind: the object's kind (``Pod``).
        user: ``userInfo`` (username, groups, extra).
        old: the stored object (None on CREATE).
        namespace_object: the request's Namespace object, or None.
    """

    operation: str
    group: str
    version: str
    resource: str
    subresource: str
    namespaced: bool
    namespace: str
    name: str
    kind: str
    user: Obj
    old: Obj | None
    namespace_object: Obj | None


def load(paths: Iterable[str | Path]) -> list[Obj]:
    """The admission configurations in YAML files (other documents, such as the
    Deployment beside them, are skipped).

    Raises:
        ValueError: a file that is not YAML, naming it.
    """
    import yaml

    found: list[Obj] = []
    for path in paths:
        try:
            docs = list(yaml.safe_load_all(Path(path).read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        found.extend(d for d in docs if isinstance(d, dict) and d.get("kind") in ADMISSION_KINDS)
    return found


def point_services(configurations: Sequence[Obj], services: Mapping[str, str]) -> list[Obj]:
    """Copies of ``configurations`` whose webhooks' ``clientConfig.service``
    (``namespace/name``) is in ``services`` call that base URL instead (plus the
    service's ``path``): the stand-in has no cluster network to reach a Service."""
    out: list[Obj] = []
    for config in configurations:
        config = json.loads(json.dumps(config))
        for hook in config.get("webhooks") or []:
            client = hook.get("clientConfig") or {}
            svc = client.get("service")
            if not svc:
                continue
            key = f"{svc.get('namespace', '')}/{svc.get('name', '')}"
            if key in services:
                hook["clientConfig"] = {
                    "url": services[key].rstrip("/") + (svc.get("path") or ""),
                    **({"caBundle": client["caBundle"]} if "caBundle" in client else {}),
                }
        out.append(config)
    return out


# ------------------------------------------------------------------ matching
def _listed(values: Sequence[str] | None, value: str) -> bool:
    return values is not None and ("*" in values or value in values)


def rule_matches(rule: Obj, at: Attributes, operations: bool = True) -> bool:
    """Whether one ``rules`` (or ``resourceRules``) entry names the request."""
    if operations and not _listed(rule.get("operations"), at.operation):
        return False
    if not _listed(rule.get("apiGroups"), at.group):
        return False
    if not _listed(rule.get("apiVersions"), at.version):
        return False
    wanted = f"{at.resource}/{at.subresource}" if at.subresource else at.resource
    resources = rule.get("resources") or []
    ok = False
    for r in resources:
        if r in ("*/*", wanted) or (r == "*" and not at.subresource):
            ok = True
        elif "/" in r and at.subresource:
            res, sub = r.split("/", 1)
            ok = (res in ("*", at.resource)) and (sub in ("*", at.subresource))
        if ok:
            break
    if not ok:
        return False
    scope = rule.get("scope") or "*"
    if scope == "Namespaced":
        return at.namespaced
    if scope == "Cluster":
        return not at.namespaced
    return True


def selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A ``LabelSelector`` (``matchLabels``, ``matchExpressions`` with ``In``, ``NotIn``,
    ``Exists``, ``DoesNotExist``); an empty or absent one matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _labels(obj: Obj | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def namespace_labels(at: Attributes) -> dict[str, str]:
    """The labels a ``namespaceSelector`` reads for the request."""
    labels = _labels(at.namespace_object)
    labels.setdefault("kubernetes.io/metadata.name", at.namespace)
    return labels


def _selectors_match(match: Obj, at: Attributes, obj: Obj | None) -> bool:
    if at.resource == "namespaces" and at.group == "" and not at.subresource:
        if not selector_matches(match.get("namespaceSelector"), _labels(obj or at.old)):
            return False
    elif at.namespaced and not selector_matches(
        match.get("namespaceSelector"), namespace_labels(at)
    ):
        return False
    objsel = match.get("objectSelector")
    if not objsel:
        return True
    return selector_matches(objsel, _labels(obj)) or (
        at.old is not None and selector_matches(objsel, _labels(at.old))
    )


# ----------------------------------------------------------------------- CEL
class CelError(Exception):
    """An expression that does not compile or fails to evaluate."""


def _request(at: Attributes, obj: Obj | None) -> Obj:
    return {
        "kind": {"group": at.group, "version": at.version, "kind": at.kind},
        "resource": {"group": at.group, "version": at.version, "resource": at.resource},
        "subResource": at.subresource,
        "name": at.name or ((obj or {}).get("metadata") or {}).get("name", ""),
        "namespace": at.namespace,
        "operation": at.operation,
        "userInfo": {"username": "", "groups": [], "extra": {}, **at.user},
        "dryRun": False,
    }


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    """The compiled program of one CEL expression (compiled once: configurations are
    evaluated on every write)."""
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(expression))


def evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    """Evaluate one CEL ``expression`` over JSON ``activation`` values.

    Raises:
        CelError: the expression does not compile or fails (a missing field, a type error).
    """
    from celpy.adapter import json_to_cel

    try:
        program = _program(expression)
        result = program.evaluate({k: json_to_cel(v) for k, v in activation.items()})
    except Exception as exc:  # celpy's errors share no useful base class
        raise CelError(f"{expression!r}: {exc}") from None
    if isinstance(result, Exception):  # celpy returns some errors as values
        raise CelError(f"{expression!r}: {result}")
    return result


def _conditions_hold(conditions: Sequence[Obj], activation: Mapping[str, Any]) -> bool:
    """All ``matchConditions`` true (any false: False). An error raises :class:`CelError`
    (the caller applies the failure policy), as the API server does when none is false."""
    error: CelError | None = None
    for cond in conditions:
        try:
            if not bool(evaluate(cond["expression"], activation)):
                return False
        except CelError as exc:
            error = exc
    if error is not None:
        raise error
    return True


# ------------------------------------------------------------------ webhooks
def _webhooks(configurations: Sequence[Obj], kind: str) -> list[tuple[str, Obj]]:
    chosen = sorted(
        (c for c in configurations if c.get("kind") == kind),
        key=lambda c: (c.get("metadata") or {}).get("name", ""),
    )
    return [(c["metadata"]["name"], w) for c in chosen for w in c.get("webhooks") or []]


def webhook_matches(hook: Obj, at: Attributes, obj: Obj | None) -> bool:
    """Whether ``hook`` is called for the request (module docstring).

    Raises:
        CelError: a match condition failed to evaluate.
    """
    if not any(rule_matches(r, at) for r in hook.get("rules") or []):
        return False
    if not _selectors_match(hook, at, obj):
        return False
    activation = {"object": obj, "oldObject": at.old, "request": _request(at, obj)}
    return _conditions_hold(hook.get("matchConditions") or [], activation)


def _review(at: Attributes, obj: Obj | None, uid: str) -> Obj:
    request = {
        **_request(at, obj),
        "uid": uid,
        "requestKind": {"group": at.group, "version": at.version, "kind": at.kind},
        "requestResource": {"group": at.group, "version": at.version, "resource": at.resource},
        "object": obj,
        "oldObject": at.old,
    }
    if not at.subresource:
        request.pop("subResource")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def run(
    configurations: Sequence[Obj], at: Attributes, obj: Obj, call: Caller, uid: str
) -> Obj:
    """Admit one write: mutating webhooks, then policies and validating webhooks (module
    docstring). Returns the object as mutated.

    Raises:
        ApiStatusError: a refusal or a failed call under ``failurePolicy: Fail``, worded as
            the API server words them.
    """
    for _, hook in _webhooks(configurations, MUTATING):
        answer = await _call(hook, at, obj, call, uid)
        if answer is None:
            continue
        if answer.get("patch"):
            try:
                obj = json_patch(obj, json.loads(base64.b64decode(answer["patch"])))
            except (ValueError, PatchError) as exc:
                raise ApiStatusError(
                    500,
                    "InternalError",
                    f'Internal error occurred: admission webhook "{hook["name"]}" sent a bad '
                    f"patch: {exc}",
                ) from None
    check_policies(configurations, at, obj)
    for _, hook in _webhooks(configurations, VALIDATING):
        await _call(hook, at, obj, call, uid)
    return obj


async def _call(hook: Obj, at: Attributes, obj: Obj, call: Caller, uid: str) -> Obj | None:
    """Call one webhook if it matches; its response, or None when not called or failed
    under ``failurePolicy: Ignore``.

    Raises:
        ApiStatusError: a denial, or a failure under ``failurePolicy: Fail`` (the default).
    """
    name = hook.get("name", "")
    fail = (hook.get("failurePolicy") or "Fail") == "Fail"
    try:
        if not webhook_matches(hook, at, obj):
            return None
    except CelError as exc:
        if not fail:
            return None
        raise ApiStatusError(
            500,
            "InternalError",
            f'Internal error occurred: failed calling webhook "{name}": match condition '
            f"error: {exc}",
        ) from None
    url = (hook.get("clientConfig") or {}).get("url")
    try:
        if not url:
            raise ApiStatusError(
                500, "InternalError", "no clientConfig.url (give the service's URL)"
            )
        answer = await call(str(url), hook, _review(at, obj, uid))
    except ApiStatusError as exc:
        if not fail:
            return None
        raise ApiStatusError(
            500,
            "InternalError",
            f'Internal error occurred: failed calling webhook "{name}": {exc.message}',
        ) from None
    if not answer.get("allowed"):
        status = answer.get("status") or {}
        raise ApiStatusError(
            int(status.get("code") or 400),
            status.get("reason") or "BadRequest",
            f'admission webhook "{name}" denied the request: {status.get("message", "")}',
        )
    return answer


# ------------------------------------------------------------------ policies
def check_policies(configurations: Sequence[Obj], at: Attributes, obj: Obj | None) -> None:
    """Evaluate the bound ValidatingAdmissionPolicies (module docstring).

    Raises:
        ApiStatusError: a validation false (or failing, under ``failurePolicy: Fail``).
    """
    policies = {c["metadata"]["name"]: c for c in configurations if c.get("kind") == POLICY}
    bindings = sorted(
        (c for c in configurations if c.get("kind") == BINDING),
        key=lambda c: c["metadata"]["name"],
    )
    for binding in bindings:
        spec = binding.get("spec") or {}
        if "Deny" not in (spec.get("validationActions") or []):
            continue
        policy = policies.get(spec.get("policyName", ""))
        if policy is None:
            continue
        _check_policy(policy, binding, at, obj)


def _matches_resources(match: Obj | None, at: Attributes, obj: Obj | None) -> bool:
    if not match:
        return True
    if match.get("resourceRules") and not any(rule_matches(r, at) for r in match["resourceRules"]):
        return False
    if any(rule_matches(r, at) for r in match.get("excludeResourceRules") or []):
        return False
    return _selectors_match(match, at, obj)


def _check_policy(policy: Obj, binding: Obj, at: Attributes, obj: Obj | None) -> None:
    spec = policy.get("spec") or {}
    pname, bname = policy["metadata"]["name"], binding["metadata"]["name"]
    fail = (spec.get("failurePolicy") or "Fail") == "Fail"
    if not _matches_resources(spec.get("matchConstraints"), at, obj):
        return
    if not _matches_resources((binding.get("spec") or {}).get("matchResources"), at, obj):
        return
    activation: dict[str, Any] = {
        "object": obj,
        "oldObject": at.old,
        "request": _request(at, obj),
        "namespaceObject": at.namespace_object,
        "params": None,
    }
    prefix = f"ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied request: "
    try:
        if not _conditions_hold(spec.get("matchConditions") or [], activation):
            return
        variables: dict[str, Any] = {}
        for var in spec.get("variables") or []:
            value = evaluate(var["expression"], {**activation, "variables": variables})
            variables[var["name"]] = _plain(value)
        activation["variables"] = variables
        for rule in spec.get("validations") or []:
            if bool(evaluate(rule["expression"], activation)):
                continue
            message = rule.get("message") or f"failed expression: {rule['expression']}"
            if rule.get("messageExpression"):
                message = str(evaluate(rule["messageExpression"], activation))
            reason = rule.get("reason") or "Invalid"
            code = {"Invalid": 422, "Forbidden": 403, "Unauthorized": 401}.get(reason, 422)
            name = at.name or ((obj or {}).get("metadata") or {}).get("name", "")
            what = f'{at.resource} "{name}" is forbidden: ' if code == 403 else ""
            raise ApiStatusError(code, reason, what + prefix + message)
    except CelError as exc:
        if fail:
            raise ApiStatusError(422, "Invalid", f"{prefix}expression error: {exc}") from None


def _plain(value: Any) -> Any:
    """A CEL value back as JSON (for ``variables``)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return value
