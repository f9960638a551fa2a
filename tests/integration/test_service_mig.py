"""MIG in the single-machine service (issue #6 part 5): real SQLite store, real processes,
simulated GPUs in MIG mode (``--simulate-gpus 2xA100-80GB:mig``).

Done when: a MIG request runs on an instance whose UUID is in its ``CUDA_VISIBLE_DEVICES``,
and a request that needs a new layout on an idle GPU gets it. Bad input (an unknown profile,
a demand that can never fit) is refused with nothing stored and nothing applied.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from fgpu.log_files import stream_text
from fgpu.mig.device import SimulatedMigDevice
from fgpu.rules.errors import BadRequest
from fgpu.server.service import Service
from fgpu.wire import QueueBody, SubmitRequest
from tests.integration.test_service import ME, crash, make, phases, until

ANNOUNCE = (
    "import os, time\n"
    "print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['NVIDIA_VISIBLE_DEVICES'],\n"
    "      os.environ['FGPU_GPU_MEMORY_MIB'], os.environ['FGPU_GPU_COMPUTE_MILLI'], flush=True)\n"
    "time.sleep(60)\n"
)


def announcing(**kw: object) -> SubmitRequest:
    """A workload that prints what it was given, then sleeps."""
    kw.setdefault("grace_s", 0.5)
    return SubmitRequest(command=[sys.executable, "-c", ANNOUNCE], **kw)  # type: ignore[arg-type]


def sleeping(seconds: float = 60, **kw: object) -> SubmitRequest:
    kw.setdefault("grace_s", 0.5)
    return SubmitRequest(  # type: ignore[arg-type]
        command=[sys.executable, "-c", f"import time; time.sleep({seconds})"], **kw
    )


def printed(tmp_path: Path, workload_id: str) -> list[str]:
    log = tmp_path / "logs" / workload_id / "stdout.log"
    return stream_text(log).split()


def devices(svc: Service) -> list[SimulatedMigDevice]:
    found = [g.mig for g in svc.mig.gpus]
    assert all(isinstance(d, SimulatedMigDevice) for d in found)
    return found  # type: ignore[return-value]


def layout(device: SimulatedMigDevice) -> list[tuple[str, int]]:
    return [(i.profile, i.start) for i in device.instances()]


async def end_all(svc: Service) -> None:
    for w in svc.list_workloads():
        svc.cancel(ME, w.id)
    await until(lambda: not svc.list_workloads())


def test_a_profile_request_gets_a_new_instance_on_an_idle_gpu_and_sees_its_uuid(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB,2xA100-80GB:mig")
        await svc.start()
        try:
            assert all(layout(d) == [] for d in devices(svc))
            run = svc.submit(ME, announcing(mig_profile="3g.40gb"))
            await until(lambda: len(printed(tmp_path, run.id)) == 4)
            view = svc.get_workload(run.id)
            assert view.phase == "running"
            assert view.reason == "placed on a new MIG instance"
            (grant,) = view.gpus
            assert (grant.mig_profile, grant.compute_milli) == ("3g.40gb", 428)
            assert grant.memory_mib == 40192  # 39.25 GiB
            made = [i for d in devices(svc) for i in d.instances()]
            assert [(i.profile, i.uuid) for i in made] == [("3g.40gb", grant.mig_uuid)]
            assert grant.mig_uuid is not None
            assert grant.mig_uuid.startswith("MIG-")
            cuda, nvidia, memory, milli = printed(tmp_path, run.id)
            assert cuda == nvidia == grant.mig_uuid
            assert (memory, milli) == ("40192", "428")
            kinds = [e.kind for e in view.events]
            assert kinds.index("mig-reconfigure") < kinds.index("started")
            # the instance's GPU is not offered to shares: only the shared A100-40GB is
            share = svc.submit(ME, sleeping(gpu="0.5"))
            await until(lambda: phases(svc)[share.id] == "running")
            (shared,) = svc.get_workload(share.id).gpus
            assert (shared.node, shared.index, shared.mig_uuid) == ("vm", 0, None)
            top = {n.name: n for n in svc.nodes()}
            mig_gpus = top["vm/mig"].gpus
            assert [g.index for g in mig_gpus] == [1, 2]
            holders = [(i.profile, i.workload_id) for g in mig_gpus for i in g.mig_instances]
            assert holders == [("3g.40gb", run.id)]
            assert sum(g.allocated_milli for g in mig_gpus) == 428
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_a_free_instance_is_used_without_a_change(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "2xA100-80GB:mig")
        gpu0, gpu1 = devices(svc)
        ready = gpu1.create("1g.10gb", 6)
        await svc.start()
        try:
            run = svc.submit(ME, announcing(mig_profile="1g.10gb"))
            await until(lambda: len(printed(tmp_path, run.id)) == 4)
            assert printed(tmp_path, run.id)[0] == ready.uuid
            view = svc.get_workload(run.id)
            assert view.reason == "placed on a free MIG instance"
            assert "mig-reconfigure" not in [e.kind for e in view.events]
            assert (layout(gpu0), layout(gpu1)) == ([], [("1g.10gb", 6)])
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_isolation_mig_with_memory_gets_the_smallest_fitting_profile(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-80GB:mig")
        await svc.start()
        try:
            run = svc.submit(ME, announcing(isolation="mig", gpu_memory="18GiB"))
            assert (run.request.isolation, run.request.gpu_memory_mib) == ("mig", 18432)
            await until(lambda: len(printed(tmp_path, run.id)) == 4)
            (grant,) = svc.get_workload(run.id).gpus
            # 1g.10gb has 9.5 GiB; 1g.20gb (19.5 GiB) is the smallest with 18 GiB
            assert grant.mig_profile == "1g.20gb"
            assert printed(tmp_path, run.id)[2] == str(grant.memory_mib) == "19968"
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_a_gpu_with_an_instance_in_use_is_never_reconfigured(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-80GB:mig")
        (gpu,) = devices(svc)
        await svc.start()
        try:
            first = svc.submit(ME, sleeping(mig_profile="4g.40gb"))
            await until(lambda: phases(svc)[first.id] == "running")
            assert layout(gpu) == [("4g.40gb", 0)]
            # a 3g instance would fit beside it (slices 4-7), but the GPU is in use
            second = svc.submit(ME, sleeping(mig_profile="3g.40gb"))
            await until(lambda: "not reconfigured" in svc.get_workload(second.id).reason)
            assert phases(svc)[second.id] == "pending"
            assert layout(gpu) == [("4g.40gb", 0)]
            assert len(gpu.log) == 1  # the one create of the 4g instance
            svc.cancel(ME, first.id)
            await until(lambda: phases(svc)[second.id] == "running")
            (grant,) = svc.get_workload(second.id).gpus
            assert (grant.mig_profile, grant.mig_start) == ("3g.40gb", 4)
            assert ("3g.40gb", 4) in layout(gpu)
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_mig_instances_count_against_their_queue(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-80GB,1xA100-80GB:mig")
        await svc.start()
        try:
            svc.create_queue(ME, QueueBody(name="team", quota=1, limit=1))
            whole = svc.submit(ME, sleeping(mig_profile="7g.80gb", queue="team"))
            await until(lambda: phases(svc)[whole.id] == "running")
            assert svc.list_queues()[-1].allocated_milli == 1000
            # the queue's limit is spent on the MIG instance: a share waits, although the
            # shared GPU is free
            share = svc.submit(ME, sleeping(gpu="0.5", queue="team"))
            await until(lambda: "limit" in svc.get_workload(share.id).reason)
            assert phases(svc)[share.id] == "pending"
            # and the other way round: a MIG request waits for the limit too
            svc.cancel(ME, whole.id)
            await until(lambda: phases(svc)[share.id] == "running")
            again = svc.submit(ME, sleeping(mig_profile="4g.40gb", queue="team"))
            await until(lambda: "limit" in svc.get_workload(again.id).reason)
            assert svc.get_workload(again.id).reason == (
                "queue team would exceed its limit (1.071 > 1.0 GPUs)"
            )
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_restart_readopts_a_mig_workload_on_its_instance(tmp_path: Path) -> None:
    async def first() -> tuple[str, str]:
        svc = make(tmp_path, "2xA100-80GB:mig")
        await svc.start()
        run = svc.submit(ME, announcing(mig_profile="2g.20gb"))
        await until(lambda: len(printed(tmp_path, run.id)) == 4)
        (grant,) = svc.get_workload(run.id).gpus
        assert grant.mig_uuid is not None
        crash(svc)
        return run.id, grant.mig_uuid

    run_id, uuid = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "2xA100-80GB:mig")
        # the simulated GPUs kept their instances, as real ones do
        assert [i.uuid for d in devices(svc) for i in d.instances()] == [uuid]
        await svc.start()
        try:
            view = svc.get_workload(run_id)
            assert view.phase == "running"
            assert view.events[-1].kind == "readopted"
            assert view.gpus[0].mig_uuid == uuid
            # the instance stays taken: a second request for its profile gets another one
            other = svc.submit(ME, sleeping(mig_profile="2g.20gb"))
            await until(lambda: phases(svc)[other.id] == "running")
            assert svc.get_workload(other.id).gpus[0].mig_uuid != uuid
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(second())


def test_a_workload_whose_instance_is_gone_after_a_restart_runs_again(tmp_path: Path) -> None:
    async def first() -> tuple[str, str]:
        svc = make(tmp_path, "1xA100-80GB:mig")
        await svc.start()
        run = svc.submit(ME, announcing(mig_profile="3g.40gb"))
        await until(lambda: len(printed(tmp_path, run.id)) == 4)
        uuid = printed(tmp_path, run.id)[0]
        crash(svc)
        return run.id, uuid

    run_id, uuid = asyncio.run(first())
    # what a GPU reset leaves: no instances
    state = tmp_path / "simulated-mig.json"
    saved = json.loads(state.read_text())
    saved["gpus"] = {gpu: [] for gpu in saved["gpus"]}
    state.write_text(json.dumps(saved))

    async def second() -> None:
        svc = make(tmp_path, "1xA100-80GB:mig")
        await svc.start()
        try:
            await until(lambda: svc.get_workload(run_id).restarts == 1)
            events = svc.get_workload(run_id).events
            stopping = [e for e in events if e.kind == "stopping"]
            assert stopping
            assert f"its MIG instance 3g.40gb@4 ({uuid})" in stopping[-1].reason
            # it is placed again, on an instance made in this run (the simulated device
            # names instances by GPU, instance id and placement, so the uuid is the same)
            await until(lambda: phases(svc)[run_id] == "running")
            await until(lambda: len(printed(tmp_path, run_id)) == 8)
            (gpu,) = devices(svc)
            assert gpu.log == [f"create 3g.40gb@4 -> {uuid}"]
            assert printed(tmp_path, run_id)[4] == uuid
            await end_all(svc)
        finally:
            await svc.stop()

    asyncio.run(second())


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (
            dict(mig_profile="3g.41gb"),
            "mig_profile",
            "'3g.41gb': not a MIG profile of A100-80GB; valid here: A100-80GB: 1g.10gb, "
            "1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            dict(mig_profile="7g.141gb"),
            "mig_profile",
            "'7g.141gb': it is a profile of H200-141GB, not of A100-80GB; valid here:",
        ),
        (
            dict(isolation="mig", gpu_memory="90GiB"),
            "gpu_memory",
            "92160 MiB is more than any MIG profile here has (largest: A100-80GB: 7g.80gb "
            "(80896 MiB))",
        ),
        (dict(isolation="mig"), "isolation", "needs --gpu-memory"),
        (dict(isolation="mig", gpu="0.5"), "isolation", "not -g or --gpu-fraction"),
        (dict(isolation="exclusive"), "isolation", "'exclusive' is not one of share, mig"),
        (dict(isolation="share", mig_profile="3g.40gb"), "isolation", "use --isolation mig"),
        (dict(mig_profile="3g.40gb", cpu="2"), "cpu", "does not reserve host CPU"),
        (dict(mig_profile="3g.40gb", gpu_model=["A100-80GB"]), "gpu_model", "cannot name"),
        (dict(mig_profile=" "), "mig_profile", "empty profile name"),
        (dict(gpu="1"), "gpu", "every GPU of this machine is in MIG mode"),
    ],
    ids=[
        "unknown-profile",
        "other-models-profile",
        "never-fits",
        "isolation-without-memory",
        "isolation-with-fraction",
        "unknown-isolation",
        "share-with-profile",
        "with-cpu",
        "with-model",
        "empty-profile",
        "share-on-mig-only",
    ],
)
def test_bad_mig_submissions_are_refused_and_nothing_is_stored_or_applied(
    tmp_path: Path, body: dict[str, object], field: str, reason: str
) -> None:
    svc = make(tmp_path, "1xA100-80GB:mig")
    with pytest.raises(BadRequest) as caught:
        svc.submit(ME, sleeping(1, **body))
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert svc.list_workloads(include_done=True) == []
    assert [d.log for d in devices(svc)] == [[]]
    svc.store.close()


def test_mig_requests_on_a_machine_without_mig_gpus_are_refused(tmp_path: Path) -> None:
    svc = make(tmp_path, "1xA100-80GB")
    with pytest.raises(BadRequest) as caught:
        svc.submit(ME, sleeping(1, mig_profile="3g.40gb"))
    assert caught.value.field == "mig_profile"
    assert caught.value.reason.startswith("no GPU of this machine is in MIG mode")
    assert svc.list_workloads(include_done=True) == []
    svc.store.close()
