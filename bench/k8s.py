"""Benchmark: the Kubernetes scheduler against the API stand-in at 1,000 nodes x 8 GPUs.

The stand-in (``fgpu k8s standin``, a TEST STAND-IN for the API server) runs in its own
process on loopback, so the figures include the scheduler's real HTTP calls through the
official client, and the memory figure is the scheduler's process alone.

Prints one JSON object and writes it to ``--out`` (a path that must not exist yet: a stored
result is never written over), by default to a new file
``bench/results/k8s-<path>-<UTC time>.json``; ``--out -`` only prints. Each target's line
in ``targets`` says whether it was met (also printed on stderr):

- ``bind``: ``--pods`` pending fgpu pods (shapes 0.25, 0.5, 1 and 2 GPUs, in that mix
  4:3:2:1) created before the scheduler starts, each with its ResourceClaim (made by the
  stand-in's claim controller from fgpu's ResourceClaimTemplate, as the webhook asks);
  rounds run until every pod is bound; pods bound per second over the rounds' wall time
  (decide, the claim's allocation, Binding and event calls included) against the 100
  pods/s target. With ``--env-without-isolation`` the old path instead (a ConfigMap per
  pod, no claims);
- ``decision``: then ``--steady`` rounds that each see ``--batch`` new pods while the rest
  run; per round the time from snapshot to decision (building the core's inputs and
  ``decide``), p50, p99 (against the 50 ms target) and the worst; before them the
  scheduler settles its memory as its loop does after the first sync and every minute
  (``settle_ms``: the pause of one ``gc.collect`` + ``gc.freeze``,
  :meth:`K8sScheduler.settle_memory`);
- ``memory``: the scheduler process's resident memory after all of it (MiB).

Usage: ``python bench/k8s.py [--nodes 1000] [--pods 4000] [--steady 100] [--batch 10]
[--env-without-isolation] [--out FILE|-] [--profile N]``. It also runs on older source trees
(put one first on ``PYTHONPATH``; ``bench/k8s_compare.py`` does that for several commits
side by side);
``FGPU_BENCH_STANDIN_PATH`` set: the ``PYTHONPATH`` of the stand-in's process instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from fgpu.k8s import claims, wire
from fgpu.k8s.kube import MERGE_PATCH, KubeApi, api_client
from fgpu.k8s.resourceapi import ResourceApi
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.webhook import mutate

try:
    from fgpu_standin.patch import json_patch
except ImportError:  # a source tree from before the stand-in became its own package
    from fgpu.k8s.standin.patch import json_patch  # type: ignore[no-redef]

SHAPES = ["0.25"] * 4 + ["0.5"] * 3 + ["1"] * 2 + ["2"]


def connections(workers: int) -> int | None:
    """The client's pool as the CLI sizes it (None: the client's default, on source trees
    from before :func:`fgpu.k8s.scheduler.connections_needed`)."""
    try:
        from fgpu.k8s.scheduler import connections_needed
    except ImportError:
        return None
    return connections_needed(workers)


def out_path(arg: str | None, path: str) -> Path | None:
    """Where the result goes: ``arg`` (None for ``-``), or a new file in bench/results.

    Raises:
        SystemExit: ``arg`` names a file that exists (a stored result is never replaced).
    """
    if arg == "-":
        return None
    if arg is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return Path(__file__).parent / "results" / f"k8s-{path}-{stamp}.json"
    out = Path(arg)
    if out.exists():
        raise SystemExit(f"--out {arg}: the file exists; give a new path (results are kept)")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_node(api: KubeApi, i: int) -> None:
    name = f"node-{i:04d}"
    inv = wire.Inventory(
        tuple(wire.InventoryGpu(g, f"GPU-{i:04d}-{g}", "A100-80GB", 81920) for g in range(8)),
        "simulated",
    )
    api.core.create_node(
        {"metadata": {"name": name, "annotations": {wire.INVENTORY: inv.to_json()}}}
    )
    api.core.patch_node_status(
        name,
        {
            "status": {
                "allocatable": {"cpu": "128", "memory": "1024Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
        _content_type=MERGE_PATCH,
    )


def make_pod(api: KubeApi, name: str, gpu: str, env: bool) -> None:
    body: dict[str, Any] = {
        "metadata": {"name": name, "annotations": {wire.GPU: gpu}},
        "spec": {
            "schedulerName": wire.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                }
            ],
        },
    }
    api._call(
        api.core.create_namespaced_pod,
        "default",
        json_patch(body, mutate(body, env_without_isolation=env)),
    )


def ready(scheduler: K8sScheduler, env: bool) -> set[str]:
    """The pods the scheduler's cache holds with their claims (all of them when ``env``)."""
    snap = scheduler.cache.snapshot()
    if env:
        return {wire.pod_key(p) for p in snap.pods}
    held = snap.claims or {}
    return {wire.pod_key(p) for p in snap.pods if claims.pod_claim(p, held)[0] is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--steady", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument(
        "--out", default=None, help="a new file for the JSON ('-': print only; default: new)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile the steady rounds' plan() (cProfile); print the N costliest on stderr",
    )
    parser.add_argument(
        "--env-without-isolation",
        action="store_true",
        help="the ConfigMap path (no ResourceClaims), for comparison",
    )
    args = parser.parse_args()
    env = bool(args.env_without_isolation)
    out = out_path(args.out, "env-without-isolation" if env else "claims")
    port = free_port()
    standin_env = dict(os.environ)
    if "FGPU_BENCH_STANDIN_PATH" in os.environ:  # the same stand-in for every tree compared
        standin_env["PYTHONPATH"] = os.environ["FGPU_BENCH_STANDIN_PATH"]
    standin = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "fgpu"),
            "k8s",
            "standin",
            "--port",
            str(port),
            "--no-kubelet",
        ],
        stderr=subprocess.DEVNULL,
        env=standin_env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        pool = connections(8)
        client = api_client(host=url) if pool is None else api_client(host=url, pool_size=pool)
        api = KubeApi(client)  # as the CLI
        deadline = time.monotonic() + 30
        while True:
            try:
                api.list_nodes()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        started = time.perf_counter()
        if not env:  # as the scheduler makes it for the first fgpu pod of a namespace
            ResourceApi(api).create_claim_template("default", claims.template_body())
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: make_node(api, i), range(args.nodes)))
            list(
                pool.map(
                    lambda i: make_pod(api, f"p-{i}", SHAPES[i % len(SHAPES)], env),
                    range(args.pods),
                )
            )
        if not env:  # the claim controller makes the claims a moment after the pods
            deadline = time.monotonic() + 120
            while True:
                listed = api.list_pods(namespace="default").items
                if all((p.get("status") or {}).get("resourceClaimStatuses") for p in listed):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the stand-in's claim controller did not make the claims")
                time.sleep(0.2)
        setup_s = time.perf_counter() - started

        scheduler = K8sScheduler(api, env_without_isolation=env)
        started = time.perf_counter()
        scheduler.sync()
        sync_s = time.perf_counter() - started
        scheduler.cache.start()  # watches keep the cache current from here on
        rounds: list[float] = []
        started = time.perf_counter()
        before = -1
        while scheduler.bound < args.pods and scheduler.bound != before:
            before = scheduler.bound
            t0 = time.perf_counter()
            scheduler.run_once()
            rounds.append(time.perf_counter() - t0)
        bind_s = time.perf_counter() - started
        bound = scheduler.bound
        # what the scheduler's loop does after its first sync and every minute
        settle_s = scheduler.settle_memory()

        latencies: list[float] = []
        profiler = cProfile.Profile() if args.profile else None
        for r in range(args.steady):
            names = [f"s-{r}-{j}" for j in range(args.batch)]
            for n in names:
                make_pod(api, n, "0.25", env)
            want = {f"default/{n}" for n in names}
            wait_until = time.monotonic() + 10
            while not want <= ready(scheduler, env):
                assert time.monotonic() < wait_until, "watch did not deliver the new pods"
                time.sleep(0.002)
            if profiler is not None:
                profiler.enable()
            t0 = time.perf_counter()
            scheduler.plan()
            latencies.append(time.perf_counter() - t0)
            if profiler is not None:
                profiler.disable()
            scheduler.run_once()
            for n in names[: args.batch // 2]:  # half of them finish: steady state
                api.delete_pod("default", n, grace_s=0)
        scheduler.cache.stop()
        rss = psutil.Process().memory_info().rss / 2**20
        latencies.sort()
        p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
        result = {
            "benchmark": "k8s",
            "path": "env-without-isolation" if env else "resource-claims",
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "load_average_1m_end": round(os.getloadavg()[0], 2),  # other work competing
            },
            "cluster": {
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "pods": args.pods,
                "setup_s": round(setup_s, 1),
            },
            "bind": {
                "bound": bound,
                "rounds": len(rounds),
                "wall_s": round(bind_s, 2),
                "pods_per_s": round(bound / bind_s, 1) if bind_s else None,
                "target_pods_per_s": 100,
                "list_s": round(sync_s, 2),
                "round_s_max": round(max(rounds), 2) if rounds else None,
            },
            "decision": {
                "rounds": len(latencies),
                "pending_per_round": args.batch,
                "running": len(scheduler.build(scheduler.cache.snapshot()).workloads),
                "p50_ms": round(statistics.median(latencies) * 1000, 1),
                "p99_ms": round(p99 * 1000, 1),
                "target_p99_ms": 50,
                "max_ms": round(latencies[-1] * 1000, 1),
                "settle_ms": round(settle_s * 1000, 1),
            },
            "memory": {"scheduler_rss_mib": round(rss, 1)},
        }
        result["targets"] = {
            "bind_pods_per_s": {
                "target_min": 100,
                "measured": result["bind"]["pods_per_s"],
                "met": bool(result["bind"]["pods_per_s"] and result["bind"]["pods_per_s"] >= 100),
            },
            "decision_p99_ms": {
                "target_max": 50,
                "measured": result["decision"]["p99_ms"],
                "met": result["decision"]["p99_ms"] < 50,
            },
        }
        text = json.dumps(result, indent=2)
        print(text)
        if profiler is not None:  # the latencies above include the profiler's own cost
            stats = pstats.Stats(profiler, stream=sys.stderr)
            stats.sort_stats("cumulative").print_stats(args.profile)
            stats.sort_stats("tottime").print_stats(args.profile)
        for name, t in result["targets"].items():
            print(f"target {name}: {'met' if t['met'] else 'NOT met'}", file=sys.stderr)
        if out is not None:
            with out.open("x") as f:  # never over a stored result
                f.write(text + "\n")
    finally:
        standin.terminate()
        try:
            standin.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a loaded machine: do not leave it behind
            standin.kill()
            standin.wait()


if __name__ == "__main__":
    main()
