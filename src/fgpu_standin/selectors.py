"""Label and field selectors as the Kubernetes API server reads them (test stand-in).

Label selectors: ``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``,
``key in (a,b)``, ``key notin (a,b)``, joined by commas (all must hold). Field selectors:
``path=value``, ``path==value``, ``path!=value`` on dotted paths of the object; a missing
field reads as the empty string, as in the API server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*([^\s]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")


class SelectorError(ValueError):
    """A selector that cannot be parsed; the message says which part."""


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> tuple[str, str, frozenset[str]]:
    """``(op, key, values)`` of one label selector term; op is in/notin/eq/ne/exists/absent."""
    if m := _SET_TERM.match(term):
        values = frozenset(v.strip() for v in m.group(3).split(","))
        return m.group(2), m.group(1), values
    if m := _EQ_TERM.match(term):
        return ("ne" if m.group(2) == "!=" else "eq"), m.group(1), frozenset({m.group(3)})
    if m := _EXISTS.match(term):
        return ("absent" if m.group(1) == "!" else "exists"), m.group(2), frozenset()
    raise SelectorError(f"unable to parse requirement: {term.strip()!r}")


def _label_holds(term: tuple[str, str, frozenset[str]], labels: Mapping[str, str]) -> bool:
    op, key, values = term
    value = labels.get(key)
    if op in ("in", "eq"):
        return value in values
    if op in ("notin", "ne"):
        return value not in values
    if op == "exists":
        return key in labels
    return key not in labels


def label_selector(text: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over a label map for a label selector string (None or "": all).

    Raises:
        SelectorError: a term that is not one of the forms above.
    """
    terms = [_label_term(t) for t in _split_terms(text or "")]
    return lambda labels: all(_label_holds(t, labels) for t in terms)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path as the API server compares it ("" when missing)."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return ""
        cur = cur[part]
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_selector(text: str | None, allowed: frozenset[str]) -> Predicate:
    """A predicate over an object for a field selector string (None or "": all).

    Args:
        text: the selector.
        allowed: the field paths this resource supports (others are refused, as the API
            server refuses them).

    Raises:
        SelectorError: an unparsable term or an unsupported field.
    """
    terms: list[tuple[str, bool, str]] = []
    for term in _split_terms(text or ""):
        m = _EQ_TERM.match(term)
        if m is None:
            raise SelectorError(f"invalid field selector: {term.strip()!r}")
        path, op, value = m.group(1), m.group(2), m.group(3)
        if path not in allowed:
            raise SelectorError(f'field label not supported: "{path}"')
        terms.append((path, op == "!=", value))
    return lambda obj: all((field_value(obj, p) == v) != neg for p, neg, v in terms)


def match_label_selector_object(
    selector: Mapping[str, Any] | None, labels: Mapping[str, str]
) -> bool:
    """Whether labels match a structured selector (``matchLabels``, ``matchExpressions``,
    as in a PodDisruptionBudget). An empty selector matches everything; None nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
