"""Idempotent submissions at the service (issue 27): the ``Idempotency-Key`` header checked,
and the answer to a submission already made with a key (the store's side is
:mod:`fgpu.store.idempotency`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fgpu.rules.errors import BadRequest
from fgpu.server import views
from fgpu.store import Store
from fgpu.store.errors import NotFound
from fgpu.store.idempotency import KeyReused
from fgpu.store.schema import IDEMPOTENCY_KEY_LENGTH
from fgpu.wire import WorkloadView
from fgpu.wire_basics import IDEMPOTENCY_HEADER

log = logging.getLogger("fgpu.server")


def check_key(key: str) -> str:
    """An ``Idempotency-Key`` as given, when it is 1 to 255 visible ASCII characters.

    Raises:
        BadRequest: ``Idempotency-Key``, echoing the value (shortened) and why.
    """
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_LENGTH or not all("!" <= ch <= "~" for ch in key):
        raise BadRequest(
            IDEMPOTENCY_HEADER,
            f"{_shown(key)!r} is not a key: use 1 to {IDEMPOTENCY_KEY_LENGTH} visible ASCII "
            "characters (a UUID, say)",
        )
    return key


def check_one_key(keys: list[str]) -> None:
    """The ``Idempotency-Key`` header given at most once (a retry could send either of two).

    Raises:
        BadRequest: ``Idempotency-Key`` given more than once, echoing the keys (shortened).
    """
    if len(keys) > 1:
        shown = ", ".join(repr(_shown(k)) for k in keys[:4])
        raise BadRequest(IDEMPOTENCY_HEADER, f"given {len(keys)} times ({shown}): send one key")


def _shown(key: str) -> str:
    """A key as refusals echo it: its first 64 characters."""
    return key if len(key) <= 64 else key[:64] + "..."


def replay(
    store: Store, owner_uid: int, keyed: tuple[str, str], reasons: Mapping[str, str]
) -> WorkloadView | None:
    """The answer to an earlier submission of ``owner_uid`` with ``keyed`` (key, fingerprint
    of the body): the workload it created, as it now stands (``reasons``: why pending
    workloads wait); None when the key is new, expired, or its workload is gone.

    Raises:
        BadRequest: ``Idempotency-Key`` used by this user for another body.
    """
    try:
        workload_id = store.keyed_workload(owner_uid, *keyed)
    except KeyReused as exc:
        raise BadRequest(IDEMPOTENCY_HEADER, str(exc)) from None
    if workload_id is None:
        return None
    try:
        record = store.get(workload_id)
    except NotFound:  # pruned since: the key names nothing any more
        return None
    log.info("submission with a known key: workload %s, not stored again", workload_id)
    return views.workload(record, reasons.get(record.id))


__all__ = ["check_key", "check_one_key", "replay"]
