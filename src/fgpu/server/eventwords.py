"""Event messages in the words of ``fgpu ls`` (issue 25, point 6).

The node agent (governor, memory guard, interposer statistics) and the decision core name
GPUs by UUID, workloads by id and priorities by number; ``fgpu ls`` says ``vm/0``, the
workload's NAME with its id, and ``critical``. :func:`as_listed` rewrites a message so, at
the edge where the service stores it: events and the reasons of preemption read like the
listing beside them.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fgpu.states import priority_word

_UUID = re.compile(r"\b(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*[0-9A-Za-z]")
_PRIORITY = re.compile(r"\bpriority (\d{1,4})\b")
_WORD = re.compile(r"\b[0-9a-z]{6,64}\b")


def as_listed(
    message: str,
    gpus: Mapping[str, str],
    workloads: Mapping[str, str] | None = None,
) -> str:
    """``message`` with GPU UUIDs, workload ids and priority numbers as ``fgpu ls`` shows
    them.

    Args:
        message: the text to rewrite.
        gpus: GPU UUID -> how ``fgpu ls`` names that GPU (``vm/0``); UUIDs not in it stay.
        workloads: workload id -> its NAME; an id in it becomes ``NAME (ID)`` (ids not in
            it, and words that are not ids, stay). None: workloads stay as they are.

    Returns:
        The rewritten message (``paused: serve (3f2a9c1b, priority critical) is busy on
        vm/0`` for ``paused: 3f2a9c1b (priority 125) is busy on GPU-5e1f...``).
    """
    text = _UUID.sub(lambda m: gpus.get(m.group(0), m.group(0)), message)
    text = _PRIORITY.sub(lambda m: f"priority {priority_word(int(m.group(1)))}", text)
    if workloads:
        text = _WORD.sub(lambda m: _workload(m.group(0), text, m.start(), workloads), text)
        text = text.replace(") (priority ", ", priority ")
    return text


def _workload(word: str, text: str, at: int, names: Mapping[str, str]) -> str:
    name = names.get(word)
    if name is None or name == word:
        return word
    if text[max(0, at - len(name) - 2) : at] == f"{name} (":  # already named
        return word
    return f"{name} ({word})"


__all__ = ["as_listed"]
