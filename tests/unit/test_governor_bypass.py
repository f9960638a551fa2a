"""The governor's look for processes on the GPU without an entry of their segment
(:mod:`fgpu.agent.governor.bypass`), on this test's own process (its /proc is real)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from fgpu.agent.backend import GpuProcess
from fgpu.agent.governor.bypass import Bypass, BypassWatch, attached_pids
from fgpu.agent.interposer.segment import AttachedProcess
from fgpu.agent.process import proc_stat

G0 = "GPU-0"
ME = os.getpid()


def own_entry(start_ticks: int | None = None) -> AttachedProcess:
    st = os.stat("/proc/self/ns/pid")
    stat = proc_stat(ME)
    assert stat is not None
    ticks = stat.start_ticks if start_ticks is None else start_ticks
    return AttachedProcess(ME, ticks, (st.st_dev, st.st_ino))


@pytest.mark.parametrize(
    ("entries", "attached"),
    [
        pytest.param(lambda: [own_entry()], True, id="pid-start-and-namespace"),
        pytest.param(lambda: [own_entry(start_ticks=1)], False, id="pid-reused"),
        pytest.param(lambda: [AttachedProcess(ME, 0, (0, 0))], True, id="namespace-unknown"),
        pytest.param(lambda: [AttachedProcess(ME, 0, (1, 2))], False, id="other-namespace"),
        pytest.param(lambda: [], False, id="no-entry"),
    ],
)
def test_which_processes_hold_an_entry(
    entries: Callable[[], list[AttachedProcess]], attached: bool
) -> None:
    assert attached_pids([ME], entries()) == ({ME} if attached else set())


def test_a_process_without_an_entry_is_a_bypass_after_the_grace_time() -> None:
    watch = BypassWatch(grace_s=0.5)
    on_gpu = [GpuProcess(ME, G0, 300)]
    assert watch.look("w", on_gpu, [], now_ns=1_000_000_000) is None  # first seen
    assert watch.look("w", on_gpu, [], now_ns=1_400_000_000) is None  # within the grace
    found = watch.look("w", on_gpu, [], now_ns=1_500_000_000)
    assert found == Bypass(ME, G0, 300, 0.5)


def test_an_entry_in_time_or_a_forgotten_workload_starts_again() -> None:
    watch = BypassWatch(grace_s=0.5)
    on_gpu = [GpuProcess(ME, G0, 300)]
    assert watch.look("w", on_gpu, [], now_ns=0) is None
    assert watch.look("w", on_gpu, [own_entry()], now_ns=400_000_000) is None  # attached
    assert watch.look("w", on_gpu, [], now_ns=600_000_000) is None  # counted from here
    watch.forget("w")
    assert watch.look("w", on_gpu, [], now_ns=1_000_000_000) is None
    assert watch.look("w", on_gpu, [], now_ns=1_500_000_000) is not None


def test_a_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError, match="grace_s: -1 is negative"):
        BypassWatch(grace_s=-1)
