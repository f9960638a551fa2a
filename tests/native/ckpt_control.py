"""A checkpoint controller for the tests: fgpu.agent.checkpoint.CheckpointDriver in a process of
its own (the fake driver keeps the first state file it opens for the life of a process). Not a
test module.

    python ckpt_control.py      then, on stdin, one command a line:
    lock PID [TIMEOUT_MS] | checkpoint PID | restore PID [OLD>NEW ...] | unlock PID
    | state PID | tid PID | restore-reserved PID (restore args with a nonzero reserved byte)
    | raw NAME PID (the call with NULL args) | remap (can_remap, driver version)
    | pod-suspend CGROUP_ROOT NAMESPACE/NAME UID | pod-restore CGROUP_ROOT NAMESPACE/NAME UID
      (fgpu.k8s.suspend.PodSuspender on that pod cgroup: {"ok", "pids", "copy_s"})

Each answers one JSON line: {"ok": true, "state": ..., "t": monotonic time when the call
returned} or {"ok": false, "code": CUresult, "t": ...}.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

from fgpu.agent.checkpoint import CheckpointDriver, CheckpointError


def main() -> int:
    driver = CheckpointDriver()
    lib = ctypes.CDLL("libcuda.so.1")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        out: dict[str, object] = {"ok": True}
        try:
            if cmd[0] in ("pod-suspend", "pod-restore"):
                from pathlib import Path

                from fgpu.k8s.podcgroup import PodCgroupFreezer
                from fgpu.k8s.suspend import PodSuspender

                pods = PodSuspender(driver, PodCgroupFreezer(Path(cmd[1])))
                step = pods.suspend if cmd[0] == "pod-suspend" else pods.restore
                report = step(cmd[2], cmd[3])
                out = {"ok": True, "pids": list(report.pids), "copy_s": report.copy_s}
            elif cmd[0] == "raw":
                rc = getattr(lib, cmd[1])(ctypes.c_int(int(cmd[2])), None)
                out = {"ok": rc == 0, "code": rc}
            elif cmd[0] == "tid":
                tid = ctypes.c_int(0)
                rc = lib.cuCheckpointProcessGetRestoreThreadId(int(cmd[1]), ctypes.byref(tid))
                out = {"ok": rc == 0, "code": rc, "tid": tid.value}
            elif cmd[0] == "state":
                out["state"] = driver.state(int(cmd[1]))
            elif cmd[0] == "restore" and len(cmd) > 2:
                pairs = [(p.split(">")[0], p.split(">")[1]) for p in cmd[2:]]
                driver.restore(int(cmd[1]), pairs)
            elif cmd[0] == "restore-reserved":
                from fgpu.agent.checkpoint import _RestoreArgs

                args = _RestoreArgs()
                args.reserved = b"\x01"
                rc = lib.cuCheckpointProcessRestore(ctypes.c_int(int(cmd[1])), ctypes.byref(args))
                out = {"ok": rc == 0, "code": rc}
            elif cmd[0] == "remap":
                out["can_remap"] = driver.can_remap
                out["version"] = driver.driver_version
            elif cmd[0] == "lock":
                driver.lock(int(cmd[1]), int(cmd[2]) if len(cmd) > 2 else 0)
            else:
                getattr(driver, cmd[0])(int(cmd[1]))
        except CheckpointError as exc:
            out = {"ok": False, "code": exc.code}
        out["t"] = time.monotonic()
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
