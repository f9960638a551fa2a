"""JSON patch, JSON merge patch and a strategic merge patch subset (test stand-in).

Strategic merge here merges lists of objects by their key for the lists the fgpu
components patch (``conditions`` by ``type``; ``containers``, ``env``, ``volumes`` by
``name``) and otherwise behaves as a JSON merge patch, which is what the API server does
for maps and for lists without a merge key.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "ownerReferences": "uid",
}


class PatchError(ValueError):
    """A patch that cannot be applied; the message says why."""


def merge_patch(target: Any, patch: Any, strategic: bool = False, key: str = "") -> Any:
    """RFC 7386 merge of ``patch`` into a copy of ``target`` (strategic: lists merged by key)."""
    if not isinstance(patch, dict):
        if (
            strategic
            and isinstance(patch, list)
            and key in MERGE_KEYS
            and isinstance(target, list)
            and all(isinstance(x, dict) for x in patch)
        ):
            merge_key = MERGE_KEYS[key]
            out = [copy.deepcopy(x) for x in target]
            for item in patch:
                for i, old in enumerate(out):
                    if isinstance(old, dict) and old.get(merge_key) == item.get(merge_key):
                        out[i] = merge_patch(old, item, strategic)
                        break
                else:
                    out.append(copy.deepcopy(item))
            return out
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v, strategic, k)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test`` on a copy of ``target``.

    Raises:
        PatchError: a path that does not exist, a failed test, an unknown operation.
    """
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op or "op" not in op:
            raise PatchError(f"invalid operation {op!r}")
        parts = _pointer(op["path"])
        kind = op["op"]
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op["value"])
                continue
            raise PatchError(f"cannot {kind} the whole document")
        parent: Any = doc
        for part in parts[:-1]:
            if isinstance(parent, list):
                parent = parent[int(part)]
            elif isinstance(parent, dict) and part in parent:
                parent = parent[part]
            else:
                raise PatchError(f"path {op['path']!r} does not exist")
        last = parts[-1]
        if kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op.get("value"):
                raise PatchError(f"test failed at {op['path']!r}")
        elif kind == "add":
            if isinstance(parent, list):
                if last == "-":
                    parent.append(copy.deepcopy(op["value"]))
                else:
                    parent.insert(int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind in ("remove", "replace"):
            if isinstance(parent, list):
                index = int(last)
                if not 0 <= index < len(parent):
                    raise PatchError(f"path {op['path']!r} does not exist")
                if kind == "remove":
                    parent.pop(index)
                else:
                    parent[index] = copy.deepcopy(op["value"])
            else:
                if last not in parent:
                    raise PatchError(f"path {op['path']!r} does not exist")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = copy.deepcopy(op["value"])
        else:
            raise PatchError(f"unsupported operation {kind!r}")
    return doc
