"""Benchmark: the governor on a real GPU, with PyTorch matmul loops as workloads.

Needs PyTorch with CUDA and NVML (nvidia-ml-py); otherwise prints a JSON error and exits 2.
Runs in under 5 minutes (a deadline skips what is left and says so). Each workload is a real
process launched like an fgpu workload (its own process group, ``CUDA_VISIBLE_DEVICES`` set
to the GPU), counting matmul iterations (``torch.cuda.synchronize`` after each, so that
little work is queued on the GPU when it is frozen). The governor runs in this process with
the default freeze mechanism and NVML as its backend.

Prints one JSON object (also written to ``bench/results/governor-gpu.json``):

- ``alone``: iterations per second of one training loop alone (before and after);
- ``strict_700_300``, ``fair_500_300_200``, ``fair_one_idle``: achieved share per workload
  (its iteration rate over the rate alone) and the largest error in percentage points;
- ``overhead``: summed rate of the ``fair_500_300_200`` sharers over the rate alone;
- ``inference``: p50/p99 latency of an inference loop (a request every 20 ms) alone, with a
  training co-tenant under the GPU's native time slicing (no governor), and with the
  co-tenant under fgpu priority ``pause`` (inference priority 125, marking each request busy
  with :func:`fgpu.sdk.busy`).

Usage: ``python bench/governor_gpu.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fgpu
from fgpu.agent.governor.activity import HintListener
from fgpu.agent.governor.freezer import detect_freezer
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, PriorityPolicy
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig
from fgpu.agent.launcher import Launcher, LaunchSpec, ProcessHandle
from fgpu.log_files import stream_text

SRC = str(Path(fgpu.__file__).resolve().parent.parent)
DEADLINE_S = 280.0

WORKER = r"""
import mmap, os, struct, sys, time
import torch
kind, out = sys.argv[1], sys.argv[2]
dev = torch.device("cuda", 0)
if kind == "train":
    n = int(sys.argv[3])
    a = torch.randn(n, n, device=dev, dtype=torch.float16)
    b = torch.randn(n, n, device=dev, dtype=torch.float16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    with open(out, "r+b") as f:
        m = mmap.mmap(f.fileno(), 16)
    struct.pack_into("q", m, 8, 1)  # ready
    count = 0
    while True:
        a @ b
        torch.cuda.synchronize()
        count += 1
        struct.pack_into("q", m, 0, count)
import fgpu.sdk
from fgpu.log_files import stream_text
if kind == "idle":
    torch.zeros(1, device=dev)
    fgpu.sdk.mark_idle()
    with open(out, "r+b") as f:
        m = mmap.mmap(f.fileno(), 16)
    struct.pack_into("q", m, 8, 1)
    time.sleep(10**6)
# infer: a request every period_ms, each a few layers of matmul; latencies to a text file
period_ms, seconds, hinted = float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
layers = [torch.randn(2048, 2048, device=dev, dtype=torch.float16) for _ in range(8)]
x = torch.randn(64, 2048, device=dev, dtype=torch.float16)
for _ in range(10):
    y = x
    for w in layers:
        y = y @ w
torch.cuda.synchronize()
if hinted:
    fgpu.sdk.mark_idle()
time.sleep(1.0)
lat = []
start = time.monotonic()
next_at = start
while time.monotonic() - start < seconds:
    next_at += period_ms / 1000
    t0 = time.perf_counter_ns()
    ctx = fgpu.sdk.busy() if hinted else None
    if ctx:
        ctx.__enter__()
    y = x
    for w in layers:
        y = y @ w
    torch.cuda.synchronize()
    lat.append((time.perf_counter_ns() - t0) / 1e6)
    if ctx:
        ctx.__exit__(None, None, None)
    time.sleep(max(0.0, next_at - time.monotonic()))
with open(out, "w") as f:
    f.write(" ".join(f"{v:.4f}" for v in lat) + "\n")
time.sleep(10**6)
"""


def fail(message: str, code: int = 2) -> None:
    print(json.dumps({"bench": "governor-gpu", "error": message}))
    sys.exit(code)


class Worker:
    def __init__(self, name: str, handle: ProcessHandle, out: Path) -> None:
        self.name, self.handle, self.out = name, handle, out

    def _read(self, offset: int) -> int:
        with open(self.out, "rb") as f:
            data = f.read(16)
        return int(struct.unpack_from("q", data, offset)[0]) if len(data) == 16 else 0

    def iterations(self) -> int:
        return self._read(0)

    def ready(self) -> bool:
        return self._read(8) == 1


class GpuBench:
    def __init__(self, folder: Path, gpu: str, size: int) -> None:
        self.folder, self.gpu, self.size = folder, gpu, size
        self.launcher = Launcher()
        self.count = 0
        self.started = time.monotonic()

    def left_s(self) -> float:
        return DEADLINE_S - (time.monotonic() - self.started)

    def launch(self, name: str, kind: str, *args: str) -> Worker:
        self.count += 1
        out = self.folder / f"{name}-{self.count}.out"
        out.write_bytes(b"\0" * 16)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH", "HOME")}
        env["PYTHONPATH"] = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
        spec = LaunchSpec(
            workload_id=f"{name}-{self.count}",
            argv=[sys.executable, "-c", WORKER, kind, str(out), *args],
            log_dir=self.folder / "logs",
            env=env,
            gpu_uuids=[self.gpu],
            agent_socket=str(self.folder / "agent.sock"),
        )
        return Worker(name, self.launcher.launch(spec), out)

    def wait_ready(self, workers: Sequence[Worker], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(w.ready() for w in workers):
            if time.monotonic() > deadline:
                errors = [stream_text(w.handle.stderr_path)[-500:] for w in workers]
                raise RuntimeError(f"workers did not start: {errors}")
            time.sleep(0.1)

    @contextlib.contextmanager
    def governor(self, mode: ComputeMode, workers: list[Worker]) -> Iterator[Governor]:
        """A governor for the block; ``workers`` are stopped before it closes."""
        from fgpu.agent.nvml import NvmlBackend

        config = GovernorConfig(
            gpu_policy=GpuPolicy(mode=mode, priority_policy=PriorityPolicy.PAUSE),
            realtime_priority=10 if os.geteuid() == 0 else None,
        )
        gov = Governor(
            [self.gpu],
            config=config,
            freezer=detect_freezer(),
            listener=HintListener(self.folder / "agent.sock"),
            backend=NvmlBackend(),
        )
        try:
            yield gov
        finally:
            self.stop(workers)
            gov.close()

    def stop(self, workers: Sequence[Worker]) -> None:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.handle.pgid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.handle.pgid, signal.SIGCONT)
        for w in workers:
            self.launcher.terminate(w.handle, grace_s=0.0)


def rate(workers: Sequence[Worker], seconds: float) -> list[float]:
    t0 = time.monotonic()
    i0 = [w.iterations() for w in workers]
    time.sleep(seconds)
    t1 = time.monotonic()
    return [(w.iterations() - a) / (t1 - t0) for w, a in zip(workers, i0, strict=True)]


def alone_rate(bench: GpuBench, seconds: float) -> float:
    worker = bench.launch("alone", "train", str(bench.size))
    try:
        bench.wait_ready([worker])
        return rate([worker], seconds)[0]
    finally:
        bench.stop([worker])


def sharing(
    bench: GpuBench,
    mode: ComputeMode,
    asked: dict[str, int],
    idle: Sequence[str],
    expected: dict[str, float],
    seconds: float,
    alone: float,
) -> dict[str, Any]:
    workers: list[Worker] = []
    try:
        with bench.governor(mode, workers) as gov:
            for name in asked:
                kind = "idle" if name in idle else "train"
                workers.append(bench.launch(name, kind, str(bench.size)))
            bench.wait_ready(workers)
            gov.update(
                [
                    GovernedWorkload(
                        workload_id=w.handle.workload_id,
                        handle=w.handle,
                        gpu_uuids=(bench.gpu,),
                        compute_milli=(asked[w.name],),
                    )
                    for w in workers
                ],
            )
            gov.start()
            time.sleep(1.0)
            training = [w for w in workers if w.name not in idle]
            rates = rate(training, seconds)
    finally:
        bench.stop(workers)
    per = {
        w.name: {"asked": expected[w.name], "achieved": round(r / alone, 4), "per_s": round(r, 1)}
        for w, r in zip(training, rates, strict=True)
    }
    error = max(abs(v["achieved"] - v["asked"]) * 100 for v in per.values())
    return {
        "seconds": seconds,
        "workloads": per,
        "error_pts": round(error, 2),
        "total_per_s": round(sum(rates), 1),
    }


def latency_stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
    }


def inference(bench: GpuBench, case: str, seconds: float) -> dict[str, Any]:
    hinted = case == "fgpu_pause"
    workers: list[Worker] = []
    with contextlib.ExitStack() as stack:
        gov = stack.enter_context(bench.governor(ComputeMode.FAIR, workers)) if hinted else None
        try:
            cotenant = None
            if case != "alone":  # the co-tenant is up before the first request
                cotenant = bench.launch("cotenant", "train", str(bench.size))
                workers.append(cotenant)
                bench.wait_ready([cotenant])
            infer = bench.launch("infer", "infer", "20", str(seconds), "1" if hinted else "0")
            workers.append(infer)
            if gov is not None and cotenant is not None:
                gov.update(
                    [
                        GovernedWorkload(
                            workload_id=infer.handle.workload_id,
                            handle=infer.handle,
                            gpu_uuids=(bench.gpu,),
                            compute_milli=(500,),
                            priority=125,
                        ),
                        GovernedWorkload(
                            workload_id=cotenant.handle.workload_id,
                            handle=cotenant.handle,
                            gpu_uuids=(bench.gpu,),
                            compute_milli=(500,),
                            priority=50,
                        ),
                    ],
                )
                gov.start()
            deadline = time.monotonic() + seconds + 60
            while time.monotonic() < deadline:
                text = infer.out.read_bytes()
                if text.endswith(b"\n") and not text.startswith(b"\0"):
                    break
                time.sleep(0.2)
            values = [float(v) for v in infer.out.read_text().split()]
        finally:
            bench.stop(workers)
    return {"case": case, **latency_stats(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs")
    parser.add_argument("--size", type=int, default=8192, help="matmul size (n x n, fp16)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "governor-gpu.json"
    )
    args = parser.parse_args()
    try:
        import torch
    except ImportError as exc:
        fail(f"PyTorch is not installed: {exc}")
    if not torch.cuda.is_available():
        fail("no CUDA GPU is available to PyTorch")
    try:
        from fgpu.agent.nvml import NvmlBackend

        nvml = NvmlBackend()
        gpus = nvml.gpus()
        nvml.close()
    except Exception as exc:
        fail(f"NVML is not usable: {exc}")
    if not gpus:
        fail("NVML reports no GPU")
    gpu = gpus[0]
    seconds = 5.0 if args.quick else 20.0
    infer_s = 5.0 if args.quick else 15.0
    result: dict[str, Any] = {
        "bench": "governor-gpu",
        "gpu": {"model": gpu.model, "uuid": gpu.uuid, "memory_mib": gpu.memory_mib},
        "torch": torch.__version__,
        "matmul_size": args.size,
        "seconds_per_scenario": seconds,
        "skipped": [],
    }
    with tempfile.TemporaryDirectory(prefix="fgpu-bench-gpu-") as tmp:
        bench = GpuBench(Path(tmp), gpu.uuid, args.size)
        before = alone_rate(bench, seconds / 2)
        steps: list[tuple[str, Any]] = [
            (
                "strict_700_300",
                (ComputeMode.STRICT, {"a": 700, "b": 300}, (), {"a": 0.7, "b": 0.3}),
            ),
            (
                "fair_500_300_200",
                (
                    ComputeMode.FAIR,
                    {"a": 500, "b": 300, "c": 200},
                    (),
                    {"a": 0.5, "b": 0.3, "c": 0.2},
                ),
            ),
            (
                "fair_one_idle",
                (
                    ComputeMode.FAIR,
                    {"a": 500, "b": 300, "c": 200},
                    ("c",),
                    {"a": 0.625, "b": 0.375},
                ),
            ),
        ]
        for name, (mode, asked, idle, expected) in steps:
            if bench.left_s() < seconds + 30:
                result["skipped"].append(name)
                continue
            result[name] = sharing(bench, mode, asked, idle, expected, seconds, before)
        after = alone_rate(bench, seconds / 2) if bench.left_s() > seconds else before
        alone = (before + after) / 2
        result["alone"] = {"per_s": [round(before, 1), round(after, 1)]}
        if "fair_500_300_200" in result:
            result["overhead"] = {
                "ratio": round(result["fair_500_300_200"]["total_per_s"] / alone, 4),
                "scenario": "fair_500_300_200",
            }
        result["inference"] = {}
        for case in ("alone", "native_time_slicing", "fgpu_pause"):
            if bench.left_s() < infer_s + 30:
                result["skipped"].append(f"inference/{case}")
                continue
            result["inference"][case] = inference(bench, case, infer_s)
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
