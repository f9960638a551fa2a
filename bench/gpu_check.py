"""GPU check of the interposer: one script for a machine with a real NVIDIA GPU (H200).

Run from the repository root on the GPU machine (it builds the native code with the system C
compiler into a temporary folder; needs PyTorch with CUDA, numpy, psutil and the fgpu source
tree on ``PYTHONPATH``)::

    PYTHONPATH=src python3 bench/gpu_check.py --out bench/results/gpu-check-h200.json

It finishes in about 6 minutes and writes one JSON object with:

- ``memory_cap``: PyTorch allocating 1 GiB tensors against a 20 GiB cap, with the default
  caching allocator and with the ``cudaMallocAsync`` backend: what it got, and the error it
  saw (expected: ``torch.OutOfMemoryError``, "CUDA out of memory"), and
  ``torch.cuda.mem_get_info`` inside the capped process (expected total: the cap);
- ``strict_30_70``: two PyTorch training loops (matrix products) at 300/700 strict for 60 s
  through the real governor holding them at launch: device time each (the interposer's
  event-measured count), iterations per second each and alone, achieved against asked;
- ``inference_pause``: an inference loop's latency p50/p99 alone, then beside a training
  neighbour of lower priority under ``pause``, 20 s each;
- ``launch_overhead``: time per small PyTorch kernel launch (``torch.add`` on a small tensor,
  synchronised every 1000) with and without the interposer;
- ``runtime_paths``: a CUDA runtime program (``native/tests/runtime_paths.cu``, built here with
  the toolkit's ``nvcc``) under a 4 GiB cap: ``totalGlobalMem`` and ``cudaMemGetInfo``,
  ``cudaMalloc`` until refused, a graph with a memory-allocation node past the cap and one of
  half the cap, a captured ``cudaMallocAsync`` past the cap, the malloc heap limit past the
  cap, ``cudaDeviceReset`` then allocate again; ``expected`` says for each whether it went as
  the interposer's README says;
- ``checkpoint_training`` (issue 28; :mod:`checkpoint_check` beside this file): a small
  PyTorch training process suspended to host memory through the CUDA checkpoint API and
  restored (copy times both ways, GPU memory freed and back through NVML, no step while
  checkpointed, the loss continuing from where it was and going down, a ballast tensor
  intact); ``{"skipped": reason}`` without a GPU, PyTorch with CUDA, or a driver with the
  checkpoint API (r570 / CUDA 12.8 and later);
- the driver version, GPU name, torch version.

Without a GPU (NVML not loadable, or no device) it writes ``{"skipped": reason}`` for every
step. ``--only NAME`` (repeatable) runs only the named steps.

Nothing here is a pass/fail test; it reports what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "native"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import build as native_build  # noqa: E402  (native/build.py)

import checkpoint_check  # noqa: E402  (bench/checkpoint_check.py)
from fgpu.agent.governor.freezer import SignalFreezer  # noqa: E402
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, PriorityPolicy  # noqa: E402
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig  # noqa: E402
from fgpu.agent.interposer.preload import SegmentDir, preload_env  # noqa: E402
from fgpu.agent.interposer.segment import Segment  # noqa: E402
from fgpu.agent.launcher import Launcher, LaunchSpec  # noqa: E402
from fgpu.log_files import stream_text  # noqa: E402

GIB = 1 << 30

ALLOC = textwrap.dedent(
    """
    import json, torch
    free, total = torch.cuda.mem_get_info()
    got, error = 0, None
    keep = []
    try:
        while got < 200 * 2**30:
            keep.append(torch.empty(2**30, dtype=torch.uint8, device="cuda"))
            got += 2**30
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    print(json.dumps({"allocated": got, "error": error, "mem_get_info": [free, total]}))
    """
)

TRAIN = textwrap.dedent(
    """
    import json, sys, time, torch
    seconds = float(sys.argv[1])
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            c = a @ b
        torch.cuda.synchronize()
        n += 10
    print(json.dumps({"iterations": n, "seconds": time.monotonic() - t0}))
    """
)

INFER = textwrap.dedent(
    """
    import json, sys, time, torch
    seconds = float(sys.argv[1])
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    lat, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        s = time.perf_counter()
        for _ in range(20):
            y = x @ w
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - s) * 1000)
        time.sleep(0.01)
    lat.sort()
    print(json.dumps({"requests": len(lat), "p50_ms": lat[len(lat) // 2],
                      "p99_ms": lat[int(len(lat) * 0.99)]}))
    """
)

LAUNCH = textwrap.dedent(
    """
    import json, time, torch
    x = torch.zeros(16, device="cuda")
    for _ in range(2000):
        x.add_(1)
    torch.cuda.synchronize()
    n, t0 = 100_000, time.perf_counter()
    for i in range(n):
        x.add_(1)
        if i % 1000 == 999:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(json.dumps({"us_per_launch": (time.perf_counter() - t0) / n * 1e6}))
    """
)


RUNTIME_SOURCE = ROOT / "native" / "tests" / "runtime_paths.cu"
RUNTIME_CAP = 4 * GIB
RUNTIME_CHUNK = 256 << 20  # runtime_paths.cu's cudaMalloc step


def find_nvcc() -> str:
    """``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH.

    Raises:
        FileNotFoundError: neither exists.
    """
    home = os.environ.get("CUDA_HOME")
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        if nvcc.exists():
            return str(nvcc)
        raise FileNotFoundError(f"CUDA_HOME={home} has no bin/nvcc")
    found = shutil.which("nvcc")
    if found is None:
        raise FileNotFoundError("nvcc is not on PATH and CUDA_HOME is not set")
    return found


def build_runtime_program(out_dir: Path, nvcc: str | None = None) -> Path:
    """Compile ``native/tests/runtime_paths.cu`` with nvcc (the CUDA runtime linked
    statically, as nvcc does by default) into ``out_dir/runtime_paths``; returns its path.

    Raises:
        FileNotFoundError: no nvcc (see :func:`find_nvcc`).
        RuntimeError: nvcc failed (its standard error in the message).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / "runtime_paths"
    done = subprocess.run(
        [nvcc or find_nvcc(), "-O2", "-o", str(exe), str(RUNTIME_SOURCE)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"nvcc failed on {RUNTIME_SOURCE} (exit {done.returncode}): {done.stderr}"
        )
    return exe


def runtime_expectations(out: dict[str, Any], cap: int) -> dict[str, bool]:
    """Whether each step of runtime_paths.cu's output went as the interposer's README says
    under a cap of ``cap`` bytes (True: it did). A missing step counts as not."""

    def get(step: str, key: str) -> Any:
        part = out.get(step)
        return part.get(key) if isinstance(part, dict) else None

    count = get("malloc", "count")
    return {
        "total_global_mem_is_the_cap": get("props", "total_global_mem") == cap,
        "mem_get_info_total_is_the_cap": get("props", "meminfo_total") == cap,
        "malloc_stops_at_the_cap": isinstance(count, int)
        and 0 < count * RUNTIME_CHUNK <= cap
        and get("malloc", "error") == "cudaErrorMemoryAllocation",
        "graph_past_the_cap_refused": get("graph", "over_error") == "cudaErrorMemoryAllocation",
        "graph_within_the_cap_runs": get("graph", "half_error") == "cudaSuccess",
        "captured_malloc_async_past_the_cap_refused": get("capture", "alloc_error") == "cudaSuccess"
        and get("capture", "instantiate_error") == "cudaErrorMemoryAllocation",
        "heap_limit_past_the_cap_refused": get("heap", "over_error") not in (None, "cudaSuccess"),
        "allocate_again_after_device_reset": get("reset", "first_error") == "cudaSuccess"
        and get("reset", "again_error") == "cudaSuccess",
    }


class Check:
    def __init__(self, root: Path, lib: Path, uuid: str) -> None:
        self.root = root
        self.lib = lib
        self.uuid = uuid
        self.segments = SegmentDir(root / "segs")
        self.launcher = Launcher()
        self._n = 0

    def segment(self, memory_mib: int, max_inflight: int = 0) -> Segment:
        self._n += 1
        return self.segments.create(
            f"g{self._n}", [self.uuid], [memory_mib], max_inflight=max_inflight, uid=None, gid=None
        )

    def env(self, segment: Segment | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.uuid, **(extra or {})}
        if segment is not None:
            env.update(preload_env(self.lib, segment.path, env))
        return env

    def python(self, code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"exit": done.returncode, "stderr": done.stderr[-2000:]}
        return dict(json.loads(lines[-1]))

    def start(self, wid: str, code: str, args: list[str], segment: Segment) -> Any:
        script = self.root / f"{wid}.py"
        script.write_text(code)
        return self.launcher.launch(
            LaunchSpec(
                workload_id=wid,
                argv=[sys.executable, str(script), *args],
                log_dir=self.root / "logs",
                env=self.env(segment),
                gpu_uuids=[self.uuid],
            )
        )

    def result(self, handle: Any, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while self.launcher.poll(handle).running and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = stream_text(handle.stdout_path).strip().splitlines()
        if not lines:
            return {"stderr": stream_text(handle.stderr_path)[-2000:]}
        return dict(json.loads(lines[-1]))


def memory_cap(c: Check) -> dict[str, Any]:
    out = {}
    for name, extra in (
        ("caching_allocator", {}),
        ("cuda_malloc_async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ):
        seg = c.segment(20 * 1024)
        got = c.python(ALLOC, [], c.env(seg, extra))
        st = seg.stats()
        got["segment_oom_count"] = st.gpus[0].oom_count
        got["segment_peak_bytes"] = st.gpus[0].memory_peak
        out[name] = got
    out["cap_bytes"] = 20 * GIB
    return out


def strict_30_70(c: Check, seconds: float) -> dict[str, Any]:
    alone = c.python(TRAIN, ["10"], c.env(None))
    gov = Governor(
        [c.uuid],
        config=GovernorConfig(gpu_policy=GpuPolicy(mode=ComputeMode.STRICT)),
        freezer=SignalFreezer(),
    )
    segs = [c.segment(60 * 1024, 2), c.segment(60 * 1024, 2)]
    handles = [c.start(f"t{i}", TRAIN, [str(seconds)], s) for i, s in enumerate(segs)]
    gov.update(
        [
            GovernedWorkload(
                workload_id=f"t{i}", handle=h, gpu_uuids=(c.uuid,), compute_milli=(m,), segment=s
            )
            for i, (h, s, m) in enumerate(zip(handles, segs, (300, 700), strict=True))
        ]
    )
    gov.start()
    try:
        results = [c.result(h, seconds + 120) for h in handles]
    finally:
        gov.close()
    device = [s.stats().gpus[0].gpu_time_ns for s in segs]
    total = sum(device) or 1
    rate_alone = alone.get("iterations", 0) / max(alone.get("seconds", 1), 1e-9)
    return {
        "asked": [0.3, 0.7],
        "achieved_by_device_time": [d / total for d in device],
        "device_time_s": [d / 1e9 for d in device],
        "runs": results,
        "alone": alone,
        "rate_of_alone": [
            (r.get("iterations", 0) / max(r.get("seconds", 1), 1e-9)) / rate_alone
            if rate_alone
            else None
            for r in results
        ],
    }


def inference_pause(c: Check, seconds: float) -> dict[str, Any]:
    alone = c.python(INFER, [str(seconds)], c.env(None))
    gov = Governor(
        [c.uuid],
        config=GovernorConfig(
            gpu_policy=GpuPolicy(mode=ComputeMode.FAIR, priority_policy=PriorityPolicy.PAUSE)
        ),
        freezer=SignalFreezer(),
    )
    seg_train, seg_infer = c.segment(60 * 1024, 2), c.segment(20 * 1024, 2)
    train = c.start("train", TRAIN, [str(seconds + 10)], seg_train)
    infer = c.start("infer", INFER, [str(seconds)], seg_infer)
    gov.update(
        [
            GovernedWorkload(
                workload_id="train",
                handle=train,
                gpu_uuids=(c.uuid,),
                compute_milli=(500,),
                priority=40,
                segment=seg_train,
            ),
            GovernedWorkload(
                workload_id="infer",
                handle=infer,
                gpu_uuids=(c.uuid,),
                compute_milli=(500,),
                priority=125,
                segment=seg_infer,
            ),
        ]
    )
    gov.start()
    try:
        beside = c.result(infer, seconds + 120)
        training = c.result(train, seconds + 120)
    finally:
        gov.close()
    return {"alone": alone, "beside_training_under_pause": beside, "training": training}


def runtime_paths(c: Check) -> dict[str, Any]:
    exe = build_runtime_program(c.root / "runtime")
    seg = c.segment(RUNTIME_CAP >> 20)
    done = subprocess.run(
        [str(exe), str(RUNTIME_CAP)],
        env=c.env(seg),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"exit": done.returncode, "stderr": done.stderr[-2000:]}
    out: dict[str, Any] = json.loads(lines[-1])
    st = seg.stats()
    out["segment_oom_count"] = st.gpus[0].oom_count
    out["segment_peak_bytes"] = st.gpus[0].memory_peak
    out["expected"] = runtime_expectations(out, RUNTIME_CAP)
    return out


def launch_overhead(c: Check) -> dict[str, Any]:
    return {
        "without": c.python(LAUNCH, [], c.env(None)),
        "with": c.python(LAUNCH, [], c.env(c.segment(60 * 1024, 0))),
        "with_bounded_2": c.python(LAUNCH, [], c.env(c.segment(60 * 1024, 2))),
    }


STEPS = (
    "launch_overhead",
    "memory_cap",
    "runtime_paths",
    "strict_30_70",
    "inference_pause",
    "checkpoint_training",
)


def find_gpu() -> tuple[dict[str, Any], str | None, str | None]:
    """``(facts, uuid, error)``: GPU 0's name, driver and torch version through NVML, its
    UUID; ``error`` says why there is no GPU to check (NVML missing, no device)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return {"gpu": None, "driver": None}, None, "NVML sees no GPU"
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # no library, no driver loaded, no device: say which
        return {"gpu": None, "driver": None}, None, f"NVML: {type(exc).__name__}: {exc}"

    def text(v: Any) -> str:
        return str(v.decode() if isinstance(v, bytes) else v)

    return {"gpu": text(name), "driver": text(driver)}, text(uuid), None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu-check-h200.json"))
    parser.add_argument("--seconds", type=float, default=60.0, help="the 30/70 run's length")
    parser.add_argument(
        "--only", action="append", choices=STEPS, help="run only this step (repeatable)"
    )
    args = parser.parse_args(argv)
    chosen = tuple(args.only or STEPS)
    facts, uuid, gpu_error = find_gpu()
    result: dict[str, Any] = {"bench": "gpu-check", **facts}
    started = time.monotonic()
    if gpu_error is not None:
        result["skipped"] = f"no GPU: {gpu_error}"
        for key in chosen:
            result[key] = {"skipped": f"no GPU: {gpu_error}"}
    else:
        assert uuid is not None
        result["torch"] = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.__version__)"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        with tempfile.TemporaryDirectory(prefix="fgpu-gpu-check-") as tmp:
            lib = Path(tmp) / "native"
            if set(chosen) - {"checkpoint_training"}:
                native_build.build(lib)
            c = Check(Path(tmp), lib, uuid)
            steps: dict[str, Any] = {
                "launch_overhead": lambda: launch_overhead(c),
                "memory_cap": lambda: memory_cap(c),
                "runtime_paths": lambda: runtime_paths(c),
                "strict_30_70": lambda: strict_30_70(c, args.seconds),
                "inference_pause": lambda: inference_pause(c, 20.0),
                "checkpoint_training": lambda: checkpoint_check.step(
                    Path(tmp), uuid, None, facts["driver"]
                ),
            }
            for key in chosen:
                t0 = time.monotonic()
                try:
                    result[key] = steps[key]()
                except Exception as exc:  # report and go on: one broken part must not hide the rest
                    result[key] = {"error": f"{type(exc).__name__}: {exc}"}
                result[key + "_seconds"] = round(time.monotonic() - t0, 1)
    result["total_seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
