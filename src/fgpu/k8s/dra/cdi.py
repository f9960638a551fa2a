"""The CDI spec of a prepared claim: all that a container of the claim's pod gets from fgpu.

CDI (the Container Device Interface, ``github.com/cncf-tags/container-device-interface``,
spec version 0.6.0) lets a container runtime (containerd 1.7+, CRI-O) apply *container
edits* for a device named ``vendor/class=name``: device nodes, mounts, environment. The
kubelet passes the CDI device ids NodePrepareResources returns to the runtime, which reads
the spec files in its CDI folders (``/var/run/cdi`` for transient specs). One spec file per
claim (``gpu.fgpu.io-claim_<claim uid>.json``), one device in it named after the claim's
uid, kind :data:`CDI_KIND`; its edits:

- device nodes: ``/dev/nvidia<N>`` of each allocated GPU (N its device index) and the
  control nodes ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``; no other
  GPU's node, whatever the image's ``NVIDIA_VISIBLE_DEVICES`` says;
- environment: ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` with only the claim's
  GPU (or MIG) uuids, ``FGPU_WORKLOAD_ID`` (``namespace/pod``), ``FGPU_GPU_COMPUTE_MILLI``,
  ``FGPU_GPU_MEMORY_MIB``, ``FGPU_AGENT_SOCKET``, ``LD_PRELOAD=<lib dir>/libfgpu.so`` (the
  interposer enforcing the share, DESIGN.md section 7) and ``FGPU_SEG`` (the claim's
  shared-state segment file);
- mounts (bind, read only unless said): the interposer's folder at the same path, the
  claim's segment file (read-write: the interposer updates it), the hint socket's folder.

The runtime applies CDI edits after the image's own environment, so an image's
``NVIDIA_VISIBLE_DEVICES=all`` does not reach past them; a pod without a claim gets no CDI
device at all.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fgpu.k8s.dra.share import DRIVER, GpuShare

CDI_VERSION = "0.6.0"
CDI_KIND = f"{DRIVER}/claim"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
INTERPOSER = "libfgpu.so"

Obj = dict[str, Any]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


@dataclass(frozen=True, slots=True)
class PreparedGpu:
    """One allocated device as the container gets it.

    Attributes:
        uuid: what ``CUDA_VISIBLE_DEVICES`` names (``GPU-...`` or ``MIG-...``).
        minor: the device node number of the (parent) GPU: ``/dev/nvidia<minor>``.
    """

    uuid: str
    minor: int


@dataclass(frozen=True, slots=True)
class Layout:
    """Host paths the spec refers to (agent flags).

    Attributes:
        cdi_dir: where spec files are written (the runtime's CDI folder).
        lib_dir: the host folder holding the interposer (mounted at the same path).
        hint_dir: the host folder of the agent's hint socket (mounted at the same path).
        agent_socket: the hint socket's path as containers see it.
        dev_root: where device nodes live (``/dev``).
    """

    cdi_dir: Path
    lib_dir: Path = Path("/opt/fgpu/lib")
    hint_dir: Path = Path("/run/fgpu")
    agent_socket: str = "/run/fgpu/agent.sock"
    dev_root: Path = Path("/dev")

    def absolute(self) -> Layout:
        """The same layout with every folder made absolute (a spec names host paths)."""
        return Layout(
            self.cdi_dir.absolute(),
            self.lib_dir.absolute(),
            self.hint_dir.absolute(),
            self.agent_socket,
            self.dev_root,
        )


def device_name(claim_uid: str) -> str:
    """The CDI device name of a claim (its uid).

    Raises:
        ValueError: ``claim_uid`` is not a valid CDI device name.
    """
    if not _NAME.match(claim_uid):
        raise ValueError(f"claim uid {claim_uid!r} is not a valid CDI device name")
    return claim_uid


def device_id(claim_uid: str) -> str:
    """The fully qualified CDI device id the kubelet passes to the runtime."""
    return f"{CDI_KIND}={device_name(claim_uid)}"


def spec_path(layout: Layout, claim_uid: str) -> Path:
    """Where a claim's spec file goes."""
    return layout.cdi_dir / f"{DRIVER}-claim_{device_name(claim_uid)}.json"


def claim_spec(
    layout: Layout,
    claim_uid: str,
    workload_id: str,
    gpus: list[PreparedGpu],
    share: GpuShare,
    segment: Path,
) -> Obj:
    """The CDI spec of one claim (module docstring).

    Args:
        layout: host paths.
        claim_uid: the claim's uid.
        workload_id: ``namespace/pod`` of the pod the claim is reserved for.
        gpus: the allocated devices, in allocation order.
        share: compute milli and memory MiB per GPU.
        segment: the claim's segment file on the host.
    """
    from fgpu.agent.interposer.segment import control_path

    uuids = ",".join(g.uuid for g in gpus)
    nodes = sorted({str(layout.dev_root / f"nvidia{g.minor}") for g in gpus})
    nodes += [str(layout.dev_root / Path(n).name) for n in CONTROL_NODES]
    lib = str(layout.lib_dir)
    hint = str(layout.hint_dir)
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": device_name(claim_uid),
                "containerEdits": {
                    "env": [
                        f"CUDA_VISIBLE_DEVICES={uuids}",
                        f"NVIDIA_VISIBLE_DEVICES={uuids}",
                        f"FGPU_WORKLOAD_ID={workload_id}",
                        f"FGPU_GPU_COMPUTE_MILLI={share.compute_milli}",
                        f"FGPU_GPU_MEMORY_MIB={share.memory_mib}",
                        f"FGPU_AGENT_SOCKET={layout.agent_socket}",
                        f"LD_PRELOAD={lib}/{INTERPOSER}",
                        f"FGPU_SEG={segment}",
                    ],
                    "deviceNodes": [{"path": n} for n in nodes],
                    "mounts": [
                        {
                            "hostPath": lib,
                            "containerPath": lib,
                            "options": ["ro", "nosuid", "nodev", "bind"],
                        },
                        {
                            "hostPath": str(segment),
                            "containerPath": str(segment),
                            "options": ["rw", "nosuid", "nodev", "bind"],
                        },
                        {  # the agent's part: caps and gate, read-only to the containers
                            "hostPath": str(control_path(segment)),
                            "containerPath": str(control_path(segment)),
                            "options": ["ro", "nosuid", "nodev", "bind"],
                        },
                        {
                            "hostPath": hint,
                            "containerPath": hint,
                            "options": ["ro", "nosuid", "nodev", "bind"],
                        },
                    ],
                },
            }
        ],
    }


def write_spec(layout: Layout, claim_uid: str, spec: Obj) -> Path:
    """Write a claim's spec atomically (a temporary file renamed into place, so a runtime
    never reads half a spec).

    Raises:
        OSError: the folder is not writable.
    """
    layout.cdi_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(layout, claim_uid)
    fd, tmp = tempfile.mkstemp(dir=layout.cdi_dir, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_spec(layout: Layout, claim_uid: str) -> bool:
    """Remove a claim's spec; False when there was none."""
    try:
        spec_path(layout, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def read_spec(path: Path) -> Obj:
    """A spec file's content (what a runtime reads)."""
    data: Obj = json.loads(path.read_text())
    return data


def find_device(cdi_dirs: list[Path], qualified: str) -> Obj:
    """The device ``vendor/class=name`` in the spec files of ``cdi_dirs``, as a runtime
    resolves it.

    Raises:
        LookupError: no spec in those folders has it.
    """
    kind, _, name = qualified.partition("=")
    for folder in cdi_dirs:
        for path in sorted(folder.glob("*.json")):
            try:
                spec = read_spec(path)
            except (OSError, ValueError):
                continue
            if spec.get("kind") != kind:
                continue
            for dev in spec.get("devices") or []:
                if dev.get("name") == name:
                    return {"spec": spec, "device": dev, "path": str(path)}
    raise LookupError(f"unresolvable CDI device {qualified}")


__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "CONTROL_NODES",
    "Layout",
    "PreparedGpu",
    "claim_spec",
    "device_id",
    "find_device",
    "read_spec",
    "remove_spec",
    "spec_path",
    "write_spec",
]
