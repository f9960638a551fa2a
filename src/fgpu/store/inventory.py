"""The GPU inventory and the decision core's holds in the store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from fgpu.model.types import InvalidRequestError
from fgpu.sched.workload import Hold
from fgpu.store import convert, validate
from fgpu.store.base import StoreBase
from fgpu.store.errors import NotFound, StoreConflict
from fgpu.store.records import HOLDING_PHASES, NodeRecord
from fgpu.store.schema import GpuRow, HoldRow, NodeRow, WorkloadRow


class InventoryStore(StoreBase):
    """Node inventory and hold operations of :class:`fgpu.store.Store`."""

    # --------------------------------------------------------------------- inventory
    def upsert_node(self, node: NodeRecord) -> bool:
        """Store a node and its GPUs as the GPU backend reports them (event
        ``node-updated`` when anything changed).

        Returns:
            True when the stored inventory changed.

        Raises:
            InvalidRequestError: a malformed node.
            StoreConflict: a GPU UUID already stored on another node.
        """
        validate.node(node)
        with self._write() as session:
            return self._upsert(session, node)

    def sync_nodes(self, nodes: Sequence[NodeRecord]) -> bool:
        """Make the stored inventory exactly ``nodes`` (what the GPU backend reports now).

        Nodes no longer reported are removed (event ``node-removed``), even with work
        allocated on them: the machine no longer has them, and recovery requeues that work.
        A GPU that moved to another node name (the machine came back with other models) is
        moved. One transaction: the stored inventory is the old one or the new one.

        Returns:
            True when the stored inventory changed.

        Raises:
            InvalidRequestError: a malformed node, or a GPU UUID on two of ``nodes``.
        """
        seen: dict[str, str] = {}
        for node in nodes:
            validate.node(node)
            for gpu in node.gpus:
                other = seen.setdefault(gpu.uuid, node.name)
                if other != node.name:
                    raise InvalidRequestError(
                        "nodes", f"GPU {gpu.uuid} is on both {other} and {node.name}"
                    )
        names = {node.name for node in nodes}
        with self._write() as session:
            changed = False
            for row in session.scalars(
                select(NodeRow).where(NodeRow.name.not_in(names)).with_for_update()
            ).all():
                session.execute(delete(GpuRow).where(GpuRow.node_name == row.name))
                session.delete(row)
                self._event(
                    session,
                    self._clock(),
                    None,
                    "node-removed",
                    "inventory",
                    f"node {row.name} removed: the GPU backend no longer reports it",
                )
                changed = True
            for node in nodes:
                moved = [g.uuid for g in node.gpus]
                session.execute(
                    delete(GpuRow).where(GpuRow.uuid.in_(moved), GpuRow.node_name != node.name)
                )
                changed = self._upsert(session, node) or changed
            return changed

    def _upsert(self, session: Session, node: NodeRecord) -> bool:
        row = session.scalars(
            select(NodeRow).where(NodeRow.name == node.name).with_for_update()
        ).one_or_none()
        if row is not None and convert.node_record(row, self._gpu_rows(session, node.name)) == node:
            return False
        now = self._clock()
        if row is None:
            row = NodeRow(name=node.name, cpu_milli=0, memory_mib=0, updated_at=now)
            session.add(row)
        row.cpu_milli = node.cpu_milli
        row.memory_mib = node.memory_mib
        row.updated_at = now
        session.execute(delete(GpuRow).where(GpuRow.node_name == node.name))
        session.flush()
        session.add_all(
            GpuRow(
                node_name=node.name,
                gpu_index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                mig_enabled=g.mig_enabled,
            )
            for g in node.gpus
        )
        models = ", ".join(sorted({g.model for g in node.gpus})) or "no GPUs"
        self._event(
            session,
            now,
            None,
            "node-updated",
            "inventory",
            f"node {node.name}: {len(node.gpus)} GPU(s) ({models}), "
            f"{node.cpu_milli} milli-CPU, {node.memory_mib} MiB",
        )
        return True

    @staticmethod
    def _gpu_rows(session: Session, node_name: str) -> list[GpuRow]:
        return list(session.scalars(select(GpuRow).where(GpuRow.node_name == node_name)))

    def remove_node(self, name: str) -> None:
        """Remove a node and its GPUs from the inventory (event ``node-removed``).

        Raises:
            NotFound: no such node.
            StoreConflict: a running or paused workload is allocated on it.
        """
        with self._write() as session:
            row = session.scalars(
                select(NodeRow).where(NodeRow.name == name).with_for_update()
            ).one_or_none()
            if row is None:
                raise NotFound("node", name)
            busy = session.scalar(
                select(func.count())
                .select_from(WorkloadRow)
                .where(WorkloadRow.node_name == name, WorkloadRow.phase.in_(HOLDING_PHASES))
            )
            if busy:
                raise StoreConflict(f"node {name} still runs {busy} workload(s)")
            session.execute(delete(GpuRow).where(GpuRow.node_name == name))
            session.delete(row)
            self._event(
                session, self._clock(), None, "node-removed", "inventory", f"node {name} removed"
            )

    def list_nodes(self) -> list[NodeRecord]:
        """The inventory, nodes by name, GPUs by index."""
        with self._read() as session:
            gpus: dict[str, list[GpuRow]] = {}
            for g in session.scalars(select(GpuRow)):
                gpus.setdefault(g.node_name, []).append(g)
            return [
                convert.node_record(n, gpus.get(n.name, []))
                for n in session.scalars(select(NodeRow).order_by(NodeRow.name))
            ]

    # ------------------------------------------------------------------------- holds
    def save_holds(self, holds: Mapping[str, Hold]) -> None:
        """Replace the stored holds with ``holds`` (workload id -> hold), as the decision core
        returned them. Holds are bookkeeping of the core and get no events.

        Raises:
            InvalidRequestError: a key that differs from its hold's workload.
            NotFound: a hold for a workload that does not exist.
        """
        for key, hold in holds.items():
            if key != hold.workload:
                raise InvalidRequestError("holds", f"key {key!r} holds workload {hold.workload!r}")
        with self._write() as session:
            known = set(
                session.scalars(select(WorkloadRow.id).where(WorkloadRow.id.in_(list(holds))))
            )
            missing = sorted(set(holds) - known)
            if missing:
                raise NotFound("workload", missing[0])
            session.execute(delete(HoldRow))
            session.add_all(convert.hold_row(h) for h in holds.values())

    def load_holds(self) -> dict[str, Hold]:
        """The stored holds, workload id -> hold."""
        with self._read() as session:
            rows = session.scalars(select(HoldRow).order_by(HoldRow.workload_id))
            return {r.workload_id: convert.hold_from_row(r) for r in rows}
