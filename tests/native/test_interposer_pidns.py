"""libfgpu across pid namespaces: containers of one pod that share a claim share its segment.

Each container has its own pid namespace, so an entry's pid means the owner's process only
inside the owner's namespace. Here each "container" is a real ``unshare --pid --fork
--mount-proc`` (util-linux) around real processes on the fake driver (a stand-in for
``libcuda.so.1``; each container gets its own fake-driver state, as each process's real
driver memory would be its own), with libfgpu.so preloaded and one segment shared by all.

Pinned: an interposer never reclaims a live process of another namespace (before the
namespace was recorded, a process whose own pid 1 differs from the other container's pid 1
swept that container's reservation and went past the cap); dead processes of its own
namespace are still swept; the agent, from the host's namespace, keeps the live ones of
every namespace and gives back those of a namespace whose processes are all gone, but judges
no other namespace when it may not examine every process (not root).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tests.native.interposer_support import (
    MIB,
    WORKER,
    AgentLib,
    fake_env,
    in_new_pid_namespace,
    unshare_pid,
)

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
DEADLINE_S = 60.0
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
HOST_PIDNS_INO = 0xEFFFFFFC  # the initial pid namespace (PROC_PID_INIT_INO, linux/proc_ns.h)

# the agent's sweep, by libfgpu-agent.so alone, as a program any user can run (argv: the
# library, the segment); prints the bytes given back
AGENT_SWEEP_C = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    void *(*open_seg)(const char *, char *, size_t) =
        (void *(*)(const char *, char *, size_t))dlsym(lib, "fgpu_agent_open");
    uint64_t (*sweep)(void *) = (uint64_t (*)(void *))dlsym(lib, "fgpu_agent_sweep");
    char why[256] = "";
    void *seg = open_seg(argv[2], why, sizeof why);
    if (seg == NULL) { fprintf(stderr, "%s\n", why); return 2; }
    printf("%llu\n", (unsigned long long)sweep(seg));
    return 0;
}
"""

# run inside one new pid namespace: a holder killed with -9, then a process that needs its
# memory (so it must sweep the dead holder of its own namespace); prints the last one's JSON
KILLED_THEN_ALLOC = r"""
import json, signal, subprocess, sys
worker, hold, need = sys.argv[1:4]
holder = subprocess.Popen([sys.executable, worker, "hold", hold], stdout=subprocess.PIPE, text=True)
assert holder.stdout is not None and json.loads(holder.stdout.readline()) == {"ready": 0}
holder.send_signal(signal.SIGKILL)
holder.wait()
sys.exit(subprocess.run([sys.executable, worker, "alloc", need]).returncode)
"""


@pytest.fixture(scope="module")
def unshare() -> str:
    return unshare_pid()


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


def make_segment(native: Path, path: Path, cap: int) -> AgentLib:
    agent = AgentLib(native)
    agent.create(path, [UUID], [cap])
    return agent


def container_env(native: Path, tmp_path: Path, seg: Path, name: str) -> dict[str, str]:
    env = fake_env(native, tmp_path / f"fakegpu-{name}", GPUS, seg=seg)
    env["FGPU_TEST_NATIVE"] = str(native)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path])
    return env


def in_container(unshare: str, *argv: str) -> list[str]:
    """argv as pid 1 of a new pid namespace (with its own /proc), killed with unshare."""
    return [*in_new_pid_namespace(unshare), *argv]


def start_holder(unshare: str, env: dict[str, str], nbytes: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        in_container(unshare, sys.executable, str(WORKER), "hold", str(nbytes)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr is not None else "no output"
    assert json.loads(line) == {"ready": 0}
    return proc


def run_in_container(unshare: str, env: dict[str, str], *argv: str) -> dict[str, int]:
    proc = subprocess.run(
        in_container(unshare, sys.executable, *argv),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_a_live_process_of_another_pid_namespace_is_never_swept(
    unshare: str, native: Path, tmp_path: Path
) -> None:
    seg = tmp_path / "seg"
    agent = make_segment(native, seg, 512 * MIB)
    holder = start_holder(unshare, container_env(native, tmp_path, seg, "b"), 300 * MIB)
    try:
        assert agent.snapshot().gpus[0].memory_reserved == 300 * MIB
        # container A's pid 1 is not container B's pid 1: its sweep (over the cap) must not
        # take B's reservation, so 300 + 300 MiB is refused
        env_a = container_env(native, tmp_path, seg, "a")
        out = run_in_container(unshare, env_a, str(WORKER), "alloc", str(300 * MIB))
        assert out["rc"] == OOM, "the other container's live reservation was swept"
        assert out["reserved"] == 300 * MIB
        # the agent, from the host's namespace, sees B alive too
        assert agent.sweep() == 0
        snap = agent.snapshot()
        assert (snap.gpus[0].memory_reserved, snap.live_processes) == (300 * MIB, 1)
        assert snap.gpus[0].oom_count == 1
    finally:
        holder.kill()  # --kill-child: B's pid 1 dies with unshare, and its namespace
        holder.wait()

    # B's namespace has no process left: no interposer of another namespace judges it...
    out = run_in_container(unshare, env_a, str(WORKER), "alloc", str(300 * MIB))
    assert out["rc"] == OOM
    if os.stat("/proc/self/ns/pid").st_ino != HOST_PIDNS_INO:
        # an agent outside the host's namespace cannot tell a gone namespace from one it
        # does not see: it leaves the entry alone
        assert agent.sweep() == 0
        assert agent.snapshot().gpus[0].memory_reserved == 300 * MIB
        agent.close()
        return
    # ...the agent in the host's namespace gives it back, exactly once
    swept = 0
    deadline = time.monotonic() + DEADLINE_S
    while swept < 300 * MIB:
        assert time.monotonic() < deadline, "the agent never gave back the dead container's entry"
        swept += agent.sweep()
        time.sleep(0.02)
    assert swept == 300 * MIB
    assert agent.sweep() == 0
    snap = agent.snapshot()
    assert (snap.gpus[0].memory_reserved, snap.live_processes) == (0, 0)
    agent.close()


def test_dead_processes_of_ones_own_namespace_are_still_swept(
    unshare: str, native: Path, tmp_path: Path
) -> None:
    seg = tmp_path / "seg"
    agent = make_segment(native, seg, 600 * MIB)
    holder = start_holder(unshare, container_env(native, tmp_path, seg, "b"), 300 * MIB)
    try:
        # in container A: C holds 200 MiB and is killed with -9; D then needs 250 MiB, which
        # fits (300 + 250 <= 600) only once D's sweep gave C's 200 MiB back, and B's stays
        out = run_in_container(
            unshare,
            container_env(native, tmp_path, seg, "a"),
            "-c",
            KILLED_THEN_ALLOC,
            str(WORKER),
            str(200 * MIB),
            str(250 * MIB),
        )
        assert out["rc"] == 0, "the dead process of D's own namespace was not swept"
        assert out["reserved"] == 550 * MIB, "B's live 300 MiB must still be counted"
        snap = agent.snapshot()
        assert (snap.gpus[0].memory_reserved, snap.live_processes) == (300 * MIB, 1)
        assert snap.processes == 3
    finally:
        holder.kill()
        holder.wait()
    agent.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the sweep as another user")
@pytest.mark.skipif(
    os.stat("/proc/self/ns/pid").st_ino != HOST_PIDNS_INO,
    reason="the agent judges other pid namespaces only from the host's",
)
def test_an_agent_that_cannot_examine_every_namespace_judges_none_of_them(
    unshare: str, native: Path
) -> None:
    try:
        user = pwd.getpwnam("fgpu-test-alice")
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "fgpu-test-alice"], check=True)
        user = pwd.getpwnam("fgpu-test-alice")
    base = Path(tempfile.mkdtemp(prefix="fgpu-test-", dir="/dev/shm"))
    base.chmod(0o755)
    seg = base / "seg"
    agent = make_segment(native, seg, 1024 * MIB)
    os.chown(seg, user.pw_uid, user.pw_gid)  # the workload's user may map it
    (base / "sweep.c").write_text(AGENT_SWEEP_C)
    cc = os.environ.get("CC", "cc")
    compile_flags = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
    build = [cc, *compile_flags, "-o", str(base / "sweep"), str(base / "sweep.c"), "-ldl"]
    subprocess.run(build, check=True)
    shutil.copy(native / "libfgpu-agent.so", base)  # where the user can read it
    gone = start_holder(unshare, container_env(native, base, seg, "gone"), 300 * MIB)
    gone.kill()  # its namespace goes with it
    gone.wait()
    live = start_holder(unshare, container_env(native, base, seg, "live"), 100 * MIB)
    try:
        # the user may not look at root's container (/proc/<pid>/ns/pid: EACCES), which could
        # own the gone container's entry: nothing of another namespace is judged
        as_user = subprocess.run(
            [str(base / "sweep"), str(base / "libfgpu-agent.so"), str(seg)],
            user=user.pw_uid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert as_user.returncode == 0, as_user.stderr
        assert int(as_user.stdout) == 0
        assert agent.snapshot().gpus[0].memory_reserved == 400 * MIB
        # root sees every process: the gone container's 300 MiB come back, the live 100 stay
        swept = 0
        deadline = time.monotonic() + DEADLINE_S
        while swept < 300 * MIB:
            assert time.monotonic() < deadline, "root's sweep never gave the gone entry back"
            swept += agent.sweep()
            time.sleep(0.02)
        assert swept == 300 * MIB
        snap = agent.snapshot()
        assert (snap.gpus[0].memory_reserved, snap.live_processes) == (100 * MIB, 1)
    finally:
        live.kill()
        live.wait()
        agent.close()
        shutil.rmtree(base)


def test_the_dra_driver_gives_back_a_gone_containers_claim_reservation(
    unshare: str, native: Path, tmp_path: Path
) -> None:
    """On Kubernetes the node agent's DRA driver (hostPID) sweeps the claims' segments: a
    container killed with -9 does not keep its reservation counted until the pod is gone."""
    if os.stat("/proc/self/ns/pid").st_ino != HOST_PIDNS_INO:
        pytest.skip("the driver judges other namespaces only from the host's pid namespace")
    from fgpu.k8s.dra.driver import DraDriver, sweep_claim_segments

    segments = tmp_path / "segments"
    segments.mkdir()
    seg = segments / "claim-0000.seg"
    agent = make_segment(native, seg, 512 * MIB)
    (segments / "claim-broken.seg").write_bytes(b"not a segment")  # skipped, not fatal
    holder = start_holder(unshare, container_env(native, tmp_path, seg, "b"), 300 * MIB)
    assert sweep_claim_segments(segments) == 0  # alive
    holder.kill()
    holder.wait()
    # the driver's own thread does it, every sweep interval once started
    folder = Path(tempfile.mkdtemp(prefix="fgpu-dra-"))  # short: Unix socket paths
    try:
        driver = DraDriver(
            None,  # type: ignore[arg-type]  # the sweep reads no API
            "node-1",
            lambda: None,  # type: ignore[arg-type,return-value]
            None,  # type: ignore[arg-type]
            registry_dir=folder / "reg",
            plugin_dir=folder / "plug",
            segment_dir=segments,
        )
        driver.start(sweep_interval_s=0.05)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while agent.snapshot().gpus[0].memory_reserved != 0:
                assert time.monotonic() < deadline, "the driver never swept the gone container"
                time.sleep(0.05)
        finally:
            driver.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert agent.snapshot().live_processes == 0
    assert sweep_claim_segments(segments) == 0
    agent.close()
