"""Nothing stays frozen without the agent: a small watchdog process that outlives it.

The governor freezes workloads (cgroup v2 freezer, or SIGSTOP to their process group). When
the agent stops cleanly it thaws them first; when it is killed (``kill -9``, OOM killer, a
crash) nothing would thaw them until it starts again. So the agent starts this watchdog,
``python -m fgpu.agent.governor.watchdog``, in its own session, and keeps the write end of
a pipe that is the watchdog's standard input. Over it the agent says which workloads it
governs (``+ PGID PID START_TICKS``: the process group, and the wrapper that guards against
a reused group id) and which it let go (``- PGID``). The kernel closes the pipe when the
agent dies, however it dies; the watchdog then reads end-of-file at once and:

1. writes ``0`` to ``cgroup.freeze`` of every cgroup under the agent's cgroup subtree
   (``--cgroup-root``), and removes the ones that are empty;
2. sends ``SIGCONT`` to every process group it was told about whose wrapper is still the
   same process (pid and start time, so a reused pid is never signalled);

then exits. A clean stop closes the pipe too, after the agent has thawed everything itself,
so the watchdog's pass finds nothing to do. It imports little (the freezer module and
psutil), so it is up well before it is needed, and thaws within milliseconds of the agent's
death (``bench/governor.py``-style figures are not kept for it; the test waits on the thaw).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from fgpu.agent.governor.freezer import CgroupFreezer, Freezer
from fgpu.agent.process import ProcessHandle

log = logging.getLogger(__name__)


class Watchdog:
    """The agent's side: starts the watchdog process and tells it what is governed.

    Args:
        cgroup_root: the agent's cgroup subtree (None with the signal freezer).
        python: the interpreter to run it with (default: this one).

    Raises:
        OSError: the watchdog process cannot be started.
    """

    def __init__(self, cgroup_root: Path | None, python: str | None = None) -> None:
        command = [python or sys.executable, "-m", "fgpu.agent.governor.watchdog"]
        if cgroup_root is not None:
            command += ["--cgroup-root", str(cgroup_root)]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the agent's process group misses it
            close_fds=True,
            env={**os.environ, "PYTHONPATH": _package_path()},
        )
        assert self.process.stdin is not None
        self._pipe: IO[bytes] | None = self.process.stdin

    def _send(self, line: str) -> None:
        pipe = self._pipe
        if pipe is None:
            return
        try:
            pipe.write(line.encode() + b"\n")
            pipe.flush()
        except (BrokenPipeError, ValueError):  # it died; the agent keeps going without
            log.warning("the freeze watchdog (pid %d) is gone", self.process.pid)
            self._pipe = None

    def watch(self, pgid: int, pid: int, start_ticks: int | None) -> None:
        """A workload is governed from now on (it may be frozen)."""
        self._send(f"+ {pgid} {pid} {start_ticks if start_ticks is not None else -1}")

    def forget(self, pgid: int) -> None:
        """A workload is not governed any more (thawed and released)."""
        self._send(f"- {pgid}")

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the pipe (the watchdog makes its pass and exits) and reap it."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class WatchedFreezer:
    """A :class:`~fgpu.agent.governor.freezer.Freezer` whose workloads the watchdog thaws
    when the agent dies: every call goes to ``inner``; :meth:`adopt` and :meth:`release`
    also tell the watchdog, which is started at the first :meth:`adopt` (an agent that
    never governs anything starts none). When the watchdog cannot be started, the freezer
    works as ``inner`` alone and a warning says so.

    Args:
        inner: the freeze mechanism.
        python: the interpreter for the watchdog (default: this one).
    """

    def __init__(self, inner: Freezer, python: str | None = None) -> None:
        self.inner = inner
        self._python = python
        self._watchdog: Watchdog | None = None
        self._failed = False

    @property
    def kind(self) -> str:
        return self.inner.kind

    @property
    def watchdog(self) -> Watchdog | None:
        """The watchdog, once started."""
        return self._watchdog

    def _started(self) -> Watchdog | None:
        if self._watchdog is None and not self._failed:
            root = self.inner.root if isinstance(self.inner, CgroupFreezer) else None
            try:
                self._watchdog = Watchdog(root, self._python)
            except OSError as exc:
                self._failed = True
                log.warning("no freeze watchdog (%s): a killed agent leaves work frozen", exc)
        return self._watchdog

    def adopt(self, handle: ProcessHandle) -> None:
        watchdog = self._started()
        if watchdog is not None:
            watchdog.watch(handle.pgid, handle.pid, handle.start_ticks)
        self.inner.adopt(handle)

    def freeze(self, handle: ProcessHandle) -> None:
        self.inner.freeze(handle)

    def wait_frozen(self, handle: ProcessHandle, timeout_s: float) -> bool:
        return self.inner.wait_frozen(handle, timeout_s)

    def thaw(self, handle: ProcessHandle) -> None:
        self.inner.thaw(handle)

    def is_frozen(self, handle: ProcessHandle) -> bool:
        return self.inner.is_frozen(handle)

    def pids(self, handle: ProcessHandle) -> list[int]:
        return self.inner.pids(handle)

    def owns(self, handle: ProcessHandle, pid: int) -> bool:
        return self.inner.owns(handle, pid)

    def release(self, handle: ProcessHandle) -> None:
        self.inner.release(handle)
        if self._watchdog is not None:
            self._watchdog.forget(handle.pgid)

    def close(self) -> None:
        self.inner.close()
        if self._watchdog is not None:
            self._watchdog.close()


def _package_path() -> str:
    """PYTHONPATH that finds this fgpu first (as the launcher's wrapper gets)."""
    import fgpu

    root = str(Path(fgpu.__file__).resolve().parent.parent)
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([root, rest]) if rest else root


# ----------------------------------------------------------------- the watchdog process
def _start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks), None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X", b"x"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def thaw_cgroups(root: Path) -> int:
    """Thaw every cgroup directly under ``root`` and remove the empty ones; how many were
    thawed."""
    thawed = 0
    try:
        groups = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return 0
    for group in groups:
        try:
            (group / "cgroup.freeze").write_text("0")
            thawed += 1
        except OSError:
            continue
        with contextlib.suppress(OSError):
            group.rmdir()  # fails while processes are in it
    return thawed


def resume_groups(governed: dict[int, tuple[int, int]]) -> int:
    """``SIGCONT`` to each process group whose wrapper is still the same process; how many
    were signalled."""
    resumed = 0
    for pgid, (pid, ticks) in governed.items():
        now = _start_ticks(pid)
        if now is None or (ticks >= 0 and now != ticks):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGCONT)
            resumed += 1
    return resumed


def run(source: IO[bytes], cgroup_root: Path | None) -> None:
    """Read the agent's lines until end-of-file, then thaw what it governed."""
    governed: dict[int, tuple[int, int]] = {}
    for raw in source:
        parts = raw.split()
        try:
            if len(parts) == 4 and parts[0] == b"+":
                governed[int(parts[1])] = (int(parts[2]), int(parts[3]))
            elif len(parts) == 2 and parts[0] == b"-":
                governed.pop(int(parts[1]), None)
        except ValueError:
            continue
    if cgroup_root is not None:
        thaw_cgroups(cgroup_root)
    resume_groups(governed)


def main(argv: list[str] | None = None) -> int:
    """``python -m fgpu.agent.governor.watchdog [--cgroup-root DIR]`` (stdin: the pipe)."""
    parser = argparse.ArgumentParser(prog="fgpu-freeze-watchdog")
    parser.add_argument("--cgroup-root", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the agent
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    run(sys.stdin.buffer, args.cgroup_root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
