"""``fgpu k8s scheduler|webhook|node-agent|standin``: the Kubernetes components
(issue #7). The work is in :mod:`fgpu.k8s`; this module parses options and starts it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Annotated

import typer

from fgpu.k8s import wire

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from fgpu.metrics.http import Probe

k8s_app = typer.Typer(
    rich_markup_mode=None,
    help="Kubernetes: scheduler, admission webhook, node agent.",
    no_args_is_help=True,
)

KubeconfigOption = Annotated[
    str | None,
    typer.Option(
        help="kubeconfig file (default: in-cluster service account, else "
        "$KUBECONFIG or ~/.kube/config)."
    ),
]
ServerOption = Annotated[
    str | None,
    typer.Option(help="API server URL without credentials (the test stand-in only)."),
]
MetricsOption = Annotated[
    str | None,
    typer.Option(
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (:PORT: every address), "
        "and the kubelet probes at /healthz (liveness) and /readyz (readiness).",
        show_default=False,
    ),
]


def _metrics_address(text: str | None) -> tuple[str, int] | None:
    from fgpu.metrics.http import parse_address

    if text is None:
        return None
    try:
        return parse_address(text)
    except ValueError as exc:
        raise _fail(f"--metrics-listen: {exc}") from None


def _serve_metrics(
    render: Callable[[], bytes],
    address: tuple[str, int] | None,
    probes: Mapping[str, Probe] | None = None,
) -> None:
    from fgpu.metrics.http import serve_metrics

    if address is None:
        return
    try:
        serve_metrics(render, address, probes)
    except OSError as exc:
        raise _fail(
            f"--metrics-listen: cannot listen on {address[0]}:{address[1]}: {exc}"
        ) from None


def _logging() -> None:
    logging.basicConfig(
        level=os.environ.get("FGPU_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def _on_signal() -> threading.Event:
    """An event set by SIGINT or SIGTERM (handlers installed now)."""
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    return done


def _wait_for_signal(done: threading.Event | None = None) -> None:
    done = done or _on_signal()
    while not done.wait(1.0):
        pass


@k8s_app.command("scheduler")
def scheduler(
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    # fgpu.plugins.DEFAULT_POLICY, spelled out: this module does not load the placement core
    policy: Annotated[str, typer.Option(help="Placement policy.")] = "fgd-pattern",
    lease_namespace: Annotated[
        str, typer.Option(envvar="POD_NAMESPACE", help="Namespace of the leader Lease.")
    ] = "fgpu-system",
    lease_name: Annotated[str, typer.Option(help="Name of the leader Lease.")] = "fgpu-scheduler",
    identity: Annotated[
        str | None, typer.Option(envvar="POD_NAME", help="This replica's name (default: host).")
    ] = None,
    lease_s: Annotated[float, typer.Option(help="Lease duration, seconds.")] = 15.0,
    min_runtime_s: Annotated[
        float, typer.Option(help="Seconds a pod runs before it can be a victim.")
    ] = 0.0,
    preempt_delay: Annotated[
        str,
        typer.Option(
            "--preempt-delay",
            metavar="DURATION",
            help="Wait before evict: a preemptor below priority high (100) waits this long "
            "for GPUs to free by themselves before it evicts lower-priority pods (seconds, "
            "or 300s, 5m, 1h; 0: at once).",
        ),
    ] = "5m",
    env_without_isolation: Annotated[
        bool,
        typer.Option(
            "--env-without-isolation",
            help="Hand GPUs out by a per-pod environment ConfigMap instead of "
            "ResourceClaims (clusters before Kubernetes 1.34). DOES NOT ISOLATE: any pod on "
            "the node can name any GPU. Trusted single-tenant clusters only; give the "
            "webhook the same flag.",
        ),
    ] = False,
    metrics_listen: MetricsOption = None,
) -> None:
    """Run the fgpu secondary scheduler (pods with schedulerName: fgpu)."""
    from fgpu.k8s.kube import KubeApi, KubeError, api_client
    from fgpu.k8s.leader import LeaseElector
    from fgpu.k8s.scheduler import K8sScheduler, connections_needed
    from fgpu.model.units import UnitError, parse_duration_s
    from fgpu.plugins import UnknownPolicyError
    from fgpu.sched.decide import SchedulerConfig

    try:
        preempt_delay_s = parse_duration_s(preempt_delay, "--preempt-delay")
    except UnitError as exc:
        raise _fail(f"--preempt-delay {preempt_delay!r}: {exc.reason}") from None
    _logging()
    metrics_address = _metrics_address(metrics_listen)
    workers = 8
    try:
        api = KubeApi(api_client(kubeconfig, server, pool_size=connections_needed(workers)))
        me = f"{identity or socket.gethostname()}_{uuid.uuid4().hex[:6]}"
        elector = LeaseElector(
            api,
            lease_namespace,
            lease_name,
            me,
            lease_s=lease_s,
            renew_deadline_s=lease_s * 2 / 3,
        )
        sched = K8sScheduler(
            api,
            policy=policy,
            config=SchedulerConfig(min_runtime_s=min_runtime_s, preempt_delay_s=preempt_delay_s),
            elector=elector,
            env_without_isolation=env_without_isolation,
            workers=workers,
        )
    except (KubeError, UnknownPolicyError, ValueError) as exc:
        raise _fail(str(exc)) from None
    done = _on_signal()
    # probes first: not ready (and still live) while the first list is retried
    _serve_metrics(
        sched.metrics.exposition,
        metrics_address,
        {"/healthz": sched.live, "/readyz": sched.ready},
    )
    if sched.sync_until_done(done):
        try:
            sched.start()
        except KubeError as exc:
            raise _fail(str(exc)) from None
        _wait_for_signal(done)
    try:
        sched.stop()
    except Exception as exc:  # e.g. the API server went first: the lease just runs out
        logging.getLogger("fgpu.k8s.scheduler").warning(
            "stopped without giving the lease up (it expires after %.0f s): %s",
            lease_s,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )


@k8s_app.command("webhook")
def webhook(
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port.")] = 8443,
    tls_cert_file: Annotated[str | None, typer.Option(help="TLS certificate (PEM).")] = None,
    tls_key_file: Annotated[str | None, typer.Option(help="TLS key (PEM).")] = None,
    agent_socket_volume: Annotated[
        bool,
        typer.Option(
            "--agent-socket-volume/--no-agent-socket-volume",
            help="Mount the host's /run/fgpu (the node agent's hint socket) read only into "
            "fgpu pods; off where pods may not use hostPath (they then send no hints).",
        ),
    ] = True,
    scheduler_user: Annotated[
        str,
        typer.Option(
            help="The user the fgpu scheduler's API calls come as: the only one that may "
            "change the annotations fgpu writes on pods (fgpu.io/assignment, "
            "fgpu.io/gpu-uuids, fgpu.io/hold, fgpu.io/env-configmap).",
        ),
    ] = wire.SCHEDULER_USER,
    env_without_isolation: Annotated[
        bool,
        typer.Option(
            "--env-without-isolation",
            help="Give fgpu pods an environment ConfigMap (and the hint socket by hostPath) "
            "instead of a ResourceClaim, for clusters before Kubernetes 1.34. DOES NOT "
            "ISOLATE: trusted single-tenant clusters only; give the scheduler the same flag.",
        ),
    ] = False,
) -> None:
    """Run the admission webhooks (POST /mutate and /validate). It reads Namespaces (their
    default queue) and Queues (who may use them) from the API."""
    from fgpu.k8s.kube import KubeApi, KubeError, api_client
    from fgpu.k8s.webhook_app import KubeLookup, serve

    _logging()
    if not scheduler_user:
        raise _fail("--scheduler-user: give the scheduler's user name")
    try:
        lookup = KubeLookup(KubeApi(api_client(kubeconfig, server), timeout_s=3.0))
    except KubeError as exc:
        raise _fail(f"--kubeconfig/--server: {exc}") from None
    try:
        serve(
            host,
            port,
            tls_cert_file,
            tls_key_file,
            agent_socket_volume=agent_socket_volume,
            scheduler_user=scheduler_user,
            env_without_isolation=env_without_isolation,
            lookup=lookup,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None


@k8s_app.command("node-agent")
def node_agent(
    node: Annotated[str, typer.Option(envvar="NODE_NAME", help="This node's name.")],
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    simulate_gpus: Annotated[
        str | None,
        typer.Option(
            help="Simulated GPUs instead of NVML, e.g. 8xA100-80GB; 2xA100-80GB:mig puts "
            "two in MIG mode (their instances live in the agent's memory)."
        ),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option(help="GPU indices fgpu owns, e.g. 0-3 (default: all).")
    ] = None,
    interval_s: Annotated[float, typer.Option(help="Seconds between usage reports.")] = 10.0,
    enforce: Annotated[
        bool | None,
        typer.Option(
            "--enforce/--no-enforce",
            help="Run the governor and memory guard over the pods (default: when cgroup v2 "
            "is usable; --enforce fails where it is not).",
        ),
    ] = None,
    cgroup_root: Annotated[
        str | None,
        typer.Option(help="cgroup v2 directory holding kubepods (default: the v2 mount)."),
    ] = None,
    compute_mode: Annotated[
        str, typer.Option(help="fair (shares are minimums) or strict (shares are caps).")
    ] = "fair",
    priority_policy: Annotated[
        str, typer.Option(help="pause or compress lower priorities while a higher is busy.")
    ] = "pause",
    memory_policy: Annotated[
        str, typer.Option(help="warn (log) or kill (evict) a pod over its memory quota.")
    ] = "warn",
    agent_socket: Annotated[
        str,
        typer.Option(
            help="Where to receive the pods' activity hints (fgpu.sdk) while enforcing; pods "
            "reach the host's /run/fgpu/agent.sock through the webhook's mount. '' for none."
        ),
    ] = wire.AGENT_SOCKET,
    cdi_dir: Annotated[
        str, typer.Option(help="Where the DRA driver writes claims' CDI specs.")
    ] = "/var/run/cdi",
    interposer_dir: Annotated[
        str,
        typer.Option(help="Host folder of the interposer (libfgpu.so), mounted into pods."),
    ] = "/opt/fgpu/lib",
    segment_dir: Annotated[
        str, typer.Option(help="Host folder of the claims' shared-state segments.")
    ] = "/run/fgpu/segments",
    plugin_registry_dir: Annotated[
        str, typer.Option(help="The kubelet's plugin registration folder.")
    ] = "/var/lib/kubelet/plugins_registry",
    plugin_dir: Annotated[
        str, typer.Option(help="This DRA driver's socket folder.")
    ] = "/var/lib/kubelet/plugins/gpu.fgpu.io",
    env_without_isolation: Annotated[
        bool,
        typer.Option(
            "--env-without-isolation",
            help="No DRA driver: publish the inventory only, for the scheduler's and "
            "webhook's --env-without-isolation (DOES NOT ISOLATE; clusters before 1.34).",
        ),
    ] = False,
    suspend_host_memory: Annotated[
        str,
        typer.Option(
            help="Host memory for pods suspended to host memory (CUDA checkpoint API, "
            "driver r570+): 25% (of RAM), 64GiB, or 0 (off: victims are evicted).",
        ),
    ] = "25%",
    metrics_listen: MetricsOption = None,
) -> None:
    """Run the node agent: publish this node's GPUs, report usage, govern the pods. By
    default it is the DRA driver gpu.fgpu.io (ResourceSlice, kubelet plugin, CDI specs);
    without NVML it publishes nothing and says why on its Node, unless --simulate-gpus."""
    from pathlib import Path

    from fgpu.agent.backend import detect_backend
    from fgpu.agent.governor.plan import ComputeMode, PriorityPolicy
    from fgpu.agent.memguard import MemoryPolicy
    from fgpu.k8s.agent import NodeAgent
    from fgpu.k8s.dra import cdi
    from fgpu.k8s.dra.driver import DraDriver
    from fgpu.k8s.dra.node import publish_nothing, real_backend
    from fgpu.k8s.dra.slices import SlicePublisher
    from fgpu.k8s.enforce import GovernorEnforcer, pod_freezer
    from fgpu.k8s.kube import KubeApi, KubeError, api_client
    from fgpu.k8s.resourceapi import ResourceApi

    _logging()
    log = logging.getLogger("fgpu.k8s.agent")
    metrics_address = _metrics_address(metrics_listen)
    try:
        mode = ComputeMode(compute_mode)
        ppolicy = PriorityPolicy(priority_policy)
        mpolicy = MemoryPolicy(memory_policy)
    except ValueError:
        raise _fail(
            "--compute-mode is fair or strict, --priority-policy pause or compress, "
            "--memory-policy warn or kill"
        ) from None
    import psutil

    from fgpu.server.suspending import suspend_budget_mib

    try:
        suspend_mib = suspend_budget_mib(
            suspend_host_memory, psutil.virtual_memory().total // 2**20
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    governing: GovernorEnforcer | None = None
    driver: DraDriver | None = None
    try:
        # two watches (its Node, its pods), the report loop, the DRA driver's calls, the
        # enforcer's evictions, the ResourceSlice writes
        api = KubeApi(api_client(kubeconfig, server, pool_size=8))
        if env_without_isolation:
            backend = detect_backend(simulate_gpus, log, host=node)
            agent = NodeAgent(api, node, backend, gpus)
        else:
            slices = SlicePublisher(ResourceApi(api), node)
            chosen = real_backend(simulate_gpus, node)
            if isinstance(chosen, str):
                publish_nothing(api, slices, node, chosen)
                # nothing to publish is this node's steady state: live and ready, saying why
                said = (True, f"no GPUs published: {chosen}")
                _serve_metrics(
                    lambda: b"",
                    metrics_address,
                    {"/healthz": lambda: said, "/readyz": lambda: said},
                )
                _wait_for_signal()
                return
            backend = chosen
            agent = NodeAgent(api, node, backend, gpus, on_publish=slices.publish)
            hint_dir = os.path.dirname(agent_socket) if agent_socket else "/run/fgpu"
            layout = cdi.Layout(
                cdi_dir=Path(cdi_dir),
                lib_dir=Path(interposer_dir),
                hint_dir=Path(hint_dir),
                agent_socket=agent_socket or wire.AGENT_SOCKET,
            ).absolute()
            driver = DraDriver(
                ResourceApi(api),
                node,
                agent.inventory,
                layout,
                minors={d.uuid: d.index for d in agent.devices},
                registry_dir=Path(plugin_registry_dir),
                plugin_dir=Path(plugin_dir),
                segment_dir=Path(segment_dir),
            )
            driver.start()
        if enforce is not False:
            try:
                freezer = pod_freezer(Path(cgroup_root) if cgroup_root else None)
            except OSError as exc:
                if enforce:
                    raise _fail(f"--enforce: cgroup v2 not usable: {exc}") from None
                log.warning("not enforcing (log only): cgroup v2 not usable: %s", exc)
            else:
                governing = GovernorEnforcer(
                    backend,
                    [d.uuid for d in agent.devices],
                    freezer,
                    api=api,
                    compute_mode=mode,
                    priority_policy=ppolicy,
                    memory_policy=mpolicy,
                    agent_socket=Path(agent_socket) if agent_socket else None,
                )
                governing.start()
                agent.enforcer = governing
                if not suspend_mib:
                    agent.suspend_note = "off (--suspend-host-memory 0)"
                elif backend.kind == "nvml":  # pods asked to be suspended (fgpu.io/suspend)
                    from fgpu.agent.checkpoint import probe
                    from fgpu.k8s.podcgroup import PodCgroupFreezer
                    from fgpu.k8s.suspend import PodSuspender, Suspensions

                    checkpoint, why = probe("libcuda.so.1")
                    if checkpoint is None:
                        log.info("pod suspend off: %s", why)
                        agent.suspend_note = why
                    else:
                        pods = PodSuspender(checkpoint, PodCgroupFreezer(freezer.root))
                        agent.suspensions = Suspensions(pods, api)
                        agent.suspend_host_memory_mib = suspend_mib
                        log.info("pod suspend on: %d MiB of host memory", suspend_mib)
                else:
                    agent.suspend_note = "simulated GPUs have no CUDA driver"
                log.info(
                    "enforcing through pod cgroups under %s (compute %s, priority %s, memory %s)",
                    freezer.root,
                    mode,
                    ppolicy,
                    mpolicy,
                )
        else:
            log.info("not enforcing (--no-enforce): log only")
    except typer.Exit:  # said already (a RuntimeError too: not to be said again below)
        raise
    except (KubeError, ValueError, RuntimeError, OSError) as exc:
        raise _fail(str(exc)) from None
    from fgpu.k8s.metrics import AgentMetrics

    views = pids_of = None
    if governing is not None:
        from fgpu.k8s.podcgroup import pod_handle

        enforcing = governing
        views = lambda: enforcing.governor.snapshot().workloads  # noqa: E731
        pids_of = lambda pod: enforcing.freezer.pids(pod_handle(pod))  # noqa: E731
    metrics = AgentMetrics(agent, views, pids_of)
    if governing is not None:
        governing.events.subscribe(metrics.agent_event)
    _serve_metrics(
        metrics.exposition, metrics_address, {"/healthz": agent.live, "/readyz": agent.ready}
    )
    thread = threading.Thread(target=agent.run, args=(interval_s,), daemon=True)
    thread.start()
    _wait_for_signal()
    agent.stop()
    if driver is not None:
        driver.stop()
    if governing is not None:
        thread.join(timeout=30)  # no sync after the governor closes
        governing.close()


@k8s_app.command("kubelet")
def kubelet_standin(
    node: Annotated[str, typer.Option(help="The node this kubelet stand-in serves.")],
    server: ServerOption = None,
    kubeconfig: KubeconfigOption = None,
    plugin_registry_dir: Annotated[
        str, typer.Option(help="Where DRA drivers register (the node agent's flag of that name).")
    ] = "/var/lib/kubelet/plugins_registry",
    cdi_dir: Annotated[
        str, typer.Option(help="Where the CDI specs are read (the node agent's --cdi-dir).")
    ] = "/var/run/cdi",
    interval_s: Annotated[float, typer.Option(help="Seconds between passes.")] = 0.5,
) -> None:
    """Run a KUBELET TEST STAND-IN for one node (demos and tests only): registers DRA
    drivers, prepares the claims of bound pods over gRPC, reads their CDI specs, marks the
    pods Running; nothing runs."""
    from pathlib import Path

    from fgpu.k8s.kube import KubeApi, KubeError, api_client
    from fgpu_standin.kubelet import KubeletStandIn

    _logging()
    log = logging.getLogger("fgpu_standin.kubelet")
    if interval_s <= 0:
        raise _fail(f"--interval-s: {interval_s} is not a positive number of seconds")
    api = KubeApi(api_client(kubeconfig, server))
    kubelet = KubeletStandIn(api, node, Path(plugin_registry_dir), [Path(cdi_dir)])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    said: dict[str, str] = {}
    while not stop.wait(interval_s):
        try:
            kubelet.sync()
        except (KubeError, OSError) as exc:
            log.warning("pass failed: %s", exc)
            continue
        for key, box in kubelet.containers.items():
            for name, c in box.items():
                text = f"{c.env.get('CUDA_VISIBLE_DEVICES', '')} {c.device_nodes}"
                if said.get(f"{key}/{name}") != text:
                    said[f"{key}/{name}"] = text
                    log.info("started %s container %s: GPUs %s", key, name, text)
        for key, why in kubelet.waiting.items():
            if said.get(key) != why:
                said[key] = why
                log.info("%s waits: %s", key, why)


@k8s_app.command("standin")
def standin(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8001,
    kubelet: Annotated[bool, typer.Option(help="Pretend to be every node's kubelet.")] = True,
    admission: Annotated[
        list[str] | None,
        typer.Option(
            help="YAML file of admission configurations (Mutating/ValidatingWebhook"
            "Configuration, ValidatingAdmissionPolicy and bindings; other documents are "
            "skipped), honoured as the API server does, e.g. deploy/base/webhook.yaml "
            "(repeat for several).",
        ),
    ] = None,
    webhook_service: Annotated[
        list[str] | None,
        typer.Option(
            help="NAMESPACE/NAME=URL: call the webhooks whose clientConfig names that "
            "Service at URL (plus its path), e.g. "
            "fgpu-system/fgpu-webhook=http://127.0.0.1:8443 (repeat for several).",
        ),
    ] = None,
    webhook_ca: Annotated[
        str | None, typer.Option(help="CA bundle (PEM) that signed https webhooks.")
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option(
            help="Register a Ready node of this name (128 CPUs, 1Ti memory), as its kubelet "
            "would (repeat for several).",
        ),
    ] = None,
    latency_ms: Annotated[
        float,
        typer.Option(
            help="Milliseconds each request waits before it is served, to try fgpu at a "
            "real API server's latencies (0: none)."
        ),
    ] = 0.0,
) -> None:
    """Serve the Kubernetes API TEST STAND-IN on 127.0.0.1 (demos and tests only)."""
    from urllib.parse import urlsplit

    from fgpu_standin import Options, StandIn
    from fgpu_standin.admission import load, point_services

    if not 0 <= latency_ms <= 60_000:
        raise _fail(f"--latency-ms: {latency_ms} is not between 0 and 60000 milliseconds")
    services: dict[str, str] = {}
    for entry in webhook_service or []:
        key, _, url = entry.partition("=")
        parts = urlsplit(url)
        if key.count("/") != 1 or parts.scheme not in ("http", "https") or not parts.netloc:
            raise _fail(
                f"--webhook-service: {entry!r} is not NAMESPACE/NAME=URL with an http:// or "
                "https:// URL"
            )
        services[key] = url
    configurations = []
    for path in admission or []:
        if not os.path.isfile(path):
            raise _fail(f"--admission: no file {path}")
        try:
            found = load([path])
        except ValueError as exc:
            raise _fail(f"--admission: {exc}") from None
        if not found:
            raise _fail(f"--admission: {path} holds no webhook configuration or admission policy")
        configurations.extend(found)
    configurations = point_services(configurations, services)
    if webhook_ca is not None:
        if not configurations:
            raise _fail("--webhook-ca: give an --admission file too")
        if not os.path.isfile(webhook_ca):
            raise _fail(f"--webhook-ca: no file {webhook_ca}")
    try:
        server = StandIn(
            Options(
                kubelet=kubelet,
                admission=configurations,
                webhook_ca=webhook_ca,
                latency_s=latency_ms / 1000,
            ),
            port=port,
        ).start()
    except RuntimeError as exc:
        raise _fail(f"{exc} (is port {port} free?)") from None
    try:
        for name in node or []:
            _register_node(server.url, name)
    except ValueError as exc:
        server.stop()
        raise _fail(str(exc)) from None
    typer.echo(f"TEST STAND-IN (not Kubernetes) serving on {server.url}", err=True)
    for config in configurations:
        for hook in config.get("webhooks") or []:
            where = (hook.get("clientConfig") or {}).get("url") or "(no URL: not reachable)"
            typer.echo(f"admission webhook {hook.get('name', '')}: {where}", err=True)
        if config.get("kind") == "ValidatingAdmissionPolicy":
            typer.echo(f"admission policy: {config['metadata']['name']}", err=True)
    for name in node or []:
        typer.echo(f"node: {name} (Ready)", err=True)
    try:
        _wait_for_signal()
    finally:
        server.stop()
        time.sleep(0)


def _register_node(url: str, name: str) -> None:
    """Create Node ``name`` on the stand-in at ``url`` with the capacity and Ready condition
    a kubelet registers.

    Raises:
        ValueError: the stand-in refused it (the message says why, e.g. a bad name or one
            given twice).
    """
    import httpx

    resources = {"cpu": "128", "memory": "1Ti", "pods": "110"}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0-fgpu-standin"},
        },
    }
    reply = httpx.post(f"{url}/api/v1/nodes", json=body, timeout=10)
    if reply.status_code != 201:
        raise ValueError(f"--node {name}: {reply.json().get('message', reply.text)}")


def register(app: typer.Typer) -> None:
    """Add ``fgpu k8s`` to the ``fgpu`` app."""
    app.add_typer(k8s_app, name="k8s")
