"""``fgpu ls`` and ``fgpu top`` in an 80-column terminal: no word of a short column is split
across lines (issue 18 trial: "runnin/g", "defaul/t", "PRIORIT/Y", "fgpu-te/st-bob")."""

from __future__ import annotations

import re

from rich.console import Console

from fgpu.cli import render
from fgpu.wire import GpuHolder, GpuView, NodeView
from tests.builders import workload_view

REASON = "waiting for 0.5 GPU: queue default is over its limit of 1 GPU (1 GPU allocated)"


view = workload_view


def shown(renderable: object, width: int) -> list[str]:
    console = Console(width=width, record=True)
    console.print(renderable)
    return console.export_text().splitlines()


def words(lines: list[str]) -> set[str]:
    return {w for line in lines for w in re.split(r"\s+", line) if w}


def test_ls_in_80_columns_keeps_every_short_word_whole() -> None:
    views = [
        view(),
        view(id="11111111", name="fgpu-test-alice", phase="pending", gpus=[], reason=REASON),
        view(id="22222222", name="x" * 60, phase="succeeded", priority=125),
    ]
    for width in (80, 100, 200):
        lines = shown(render.workloads_table(views, now=90.0), width)
        assert all(len(line.rstrip()) <= width for line in lines), lines
        found = words(lines)
        for word in ("ID", "NAME", "PHASE", "QUEUE", "PRIORITY", "AGE", "running", "pending"):
            assert word in found, (width, lines)
        assert {"default", "normal", "critical", "succeeded", "1m"} <= found, lines
        assert {"fgpu-test-bob", "fgpu-test-alice", "237094bf", "11111111"} <= found, lines
        assert "x" * 15 + "…" in found  # a long name ends in an ellipsis
        # the reason is whole: its words in order, wrapped only at spaces
        assert " ".join(w for line in lines for w in line.split()).count("over its limit") == 1
        assert set(REASON.split()) <= found, lines


def test_top_in_80_columns_wraps_only_the_holders_at_spaces() -> None:
    holders = [
        GpuHolder(workload_id=f"{i}a2b3c4d", name=f"train-{i}", compute_milli=250, memory_mib=1)
        for i in range(3)
    ]
    gpu = GpuView(
        index=0,
        uuid="GPU-0",
        model="A100-40GB",
        memory_mib=40960,
        allocated_milli=750,
        allocated_memory_mib=3,
        holders=holders,
    )
    node = NodeView(name="vm", backend="simulated", cpu_milli=0, memory_mib=0, gpus=[gpu])
    lines = shown(render.top_table([node]), 80)
    found = words(lines)
    assert {"GPU", "MODEL", "COMPUTE", "MEMORY", "HOLDERS", "A100-40GB", "vm/0"} <= found, lines
    for holder in holders:
        assert {holder.workload_id, f"{holder.name}:"} <= found, lines


def test_messages_name_users_as_ls_does_with_the_uid_where_none_resolves() -> None:
    import pwd

    from fgpu.users import user_text

    assert user_text(0) == pwd.getpwuid(0).pw_name == render.user_text(0)
    unknown = next(uid for uid in range(4_000_000, 4_001_000) if _no_user(uid))
    assert user_text(unknown) == f"uid {unknown}"


def _no_user(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


def test_ls_user_grows_to_the_longest_user_name_where_the_width_allows() -> None:
    # issue 18 trial: fgpu-test-alice and fgpu-test-bob both showed as "fgpu-test…"
    from tests.localusers import ALICE, BOB, ensure_users, uid_of

    ensure_users()
    views = [
        view(id="11111111", owner_uid=uid_of(ALICE), phase="pending", gpus=[], reason=REASON),
        view(id="22222222", owner_uid=uid_of(BOB)),
    ]
    wide = shown(render.workloads_table(views, now=90.0), 200)
    assert {ALICE, BOB} <= words(wide), wide
    assert not any("fgpu-test…" in line for line in wide), wide
    assert any(line.startswith("11111111") and REASON in line for line in wide), wide
    # 80 columns: the short USER column and the reasons' rules as before
    narrow = shown(render.workloads_table(views, now=90.0), 80)
    assert all(len(line.rstrip()) <= 80 for line in narrow), narrow
    assert "fgpu-test…" in words(narrow), narrow
    assert set(REASON.split()) <= words(narrow), narrow


def test_ls_keeps_every_column_when_long_states_fill_80_columns() -> None:
    """A re-trial saw AGE (or GPUS) vanish at 80 columns with three rows of a long state
    ("waiting-for-share" now), and an empty REASO column at 90: long states wrap at spaces,
    and REASON is there only when it fits."""
    views = [
        view(id=f"{i}2ea5ef4", name=f"train-{i}", gpu_state="waiting-for-share") for i in range(3)
    ] + [
        view(id="32ea5ef4", name="svc", gpu_state="paused-by-priority"),
        view(id="11111111", name="fgpu-test-alice", phase="pending", gpus=[], reason=REASON),
    ]
    for width in (80, 90, 100):
        lines = shown(render.workloads_table(views, now=90.0), width)
        assert all(len(line.rstrip()) <= width for line in lines), lines
        header = lines[0].split()
        assert header[:9] == [
            "ID",
            "NAME",
            "USER",
            "PHASE",
            "STATE",
            "QUEUE",
            "PRIORITY",
            "GPUS",
            "AGE",
        ], (width, lines)
        assert "REASO" not in lines[0] or "REASON" in header, (width, lines)
        found = words(lines)
        assert {"waiting-for-share", "paused-by-priority", "1m", "normal"} <= found, (width, lines)
        assert set(REASON.split()) <= found, (width, lines)
