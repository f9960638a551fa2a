"""The per-user output ledger (:class:`fgpu.server.output_limits.OutputLedger`): figures per
user and queue from the log folders, stop files at a limit, and pruning."""

from __future__ import annotations

from pathlib import Path

from fgpu.disk_room import STOP_FILE
from fgpu.server.output_limits import OutputLedger, Running, folder_bytes


def write(folder: Path, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "output.log").write_bytes(b"x" * size)


def test_figures_count_every_stored_workload_of_the_user(tmp_path: Path) -> None:
    write(tmp_path / "old", 300)
    write(tmp_path / "other", 10_000)
    stored = {1000: [("old", "a")], 1001: [("other", "a")]}
    ledger = OutputLedger(tmp_path, lambda uid: stored[uid], max_bytes=1000)
    assert ledger.used(1000) == 300
    write(tmp_path / "new", 500)
    assert ledger.check([Running("new", 1000, "b")], {}) == []
    assert ledger.used(1000) == 800
    assert ledger.used(1000, "b") == 500
    assert ledger.used(1001) == 10_000  # another user's figure is their own


def test_at_the_machine_limit_running_work_gets_a_stop_file_once(tmp_path: Path) -> None:
    write(tmp_path / "w", 100)
    ledger = OutputLedger(tmp_path, lambda uid: [], max_bytes=1000)
    assert ledger.check([Running("w", 7, "q")], {}) == []
    write(tmp_path / "w", 1000)
    stopped = ledger.check([Running("w", 7, "q")], {})
    assert [w for w, _ in stopped] == ["w"]
    assert "--max-output-bytes 1000 bytes" in stopped[0][1]
    assert "--max-output-bytes" in (tmp_path / "w" / STOP_FILE).read_text()
    assert ledger.check([Running("w", 7, "q")], {}) == []  # written once


def test_a_queue_limit_counts_the_queue_only(tmp_path: Path) -> None:
    write(tmp_path / "in-a", 600)
    write(tmp_path / "in-b", 600)
    ledger = OutputLedger(tmp_path, lambda uid: [], max_bytes=10_000)
    running = [Running("in-a", 7, "a"), Running("in-b", 7, "b")]
    stopped = ledger.check(running, {"a": 500, "b": None})
    assert [w for w, _ in stopped] == ["in-a"]
    assert "queue a" in stopped[0][1]
    assert "max_output_bytes 500 bytes" in stopped[0][1]


def test_a_launch_below_the_limit_removes_an_old_stop_and_one_at_it_writes_one(
    tmp_path: Path,
) -> None:
    write(tmp_path / "w", 10)
    (tmp_path / "w" / STOP_FILE).write_text("old\n")
    ledger = OutputLedger(tmp_path, lambda uid: [("w", "q")], max_bytes=1000)
    assert ledger.before_launch(Running("w", 7, "q"), None) is None
    assert not (tmp_path / "w" / STOP_FILE).exists()
    write(tmp_path / "big", 5000)
    ledger.check([Running("big", 7, "q")], {})
    reason = ledger.before_launch(Running("fresh", 7, "q"), None)
    assert reason is not None
    assert (tmp_path / "fresh" / STOP_FILE).read_text().strip() == reason


def test_pruning_frees_the_figure(tmp_path: Path) -> None:
    write(tmp_path / "w", 5000)
    ledger = OutputLedger(tmp_path, lambda uid: [("w", "q")], max_bytes=1000)
    assert ledger.over(7, "q", None) is not None
    ledger.pruned(["w"])
    assert ledger.used(7) == 0
    assert ledger.over(7, "q", None) is None


def test_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert folder_bytes(tmp_path / "none") == 0
