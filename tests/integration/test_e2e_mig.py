"""MIG end to end, as a user would: the real ``fgpu serve`` with simulated GPUs in MIG mode
(``--simulate-gpus 1xA100-40GB,2xA100-80GB:mig``), driven through the real command line
(``fgpu submit --mig-profile``, ``--isolation mig --gpu-memory``, ``ls``, ``describe``,
``logs``, ``top``), with a SIGKILL and restart of the server in between.

Issue #6 part 5, "Done when": a MIG request runs on an instance whose UUID is in its
``CUDA_VISIBLE_DEVICES``, and a request that needs a new layout on an idle GPU gets it; bad
input (an unknown profile, a demand that can never fit) is refused with nothing stored.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.integration.test_e2e_service import alive
from tests.serverproc import ServerProcess, started_server, wait_for

SPEC = "1xA100-40GB,2xA100-80GB:mig"
SHOW_GPU = [
    sys.executable,
    "-c",
    "import os, time\n"
    "print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['FGPU_GPU_MEMORY_MIB'], flush=True)\n"
    "time.sleep(120)\n",
]


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-e2e-mig-", SPEC) as proc:
        yield proc


def printed(server: ServerProcess, workload_id: str) -> list[str]:
    return server.cli("logs", "--stdout", workload_id).stdout.split()


def test_mig_requests_run_on_their_instances_and_survive_a_restart(
    server: ServerProcess,
) -> None:
    # 1. a profile request: no instance exists yet, so an idle GPU is given a new layout
    big = server.submit("--mig-profile", "3g.40gb", "--grace", "1", command=SHOW_GPU)
    server.wait_phase(big, "running")
    wait_for(lambda: len(printed(server, big)) == 2, "the workload's output")
    (grant,) = server.workloads()[big]["gpus"]
    assert grant["mig_profile"] == "3g.40gb"
    assert grant["mig_uuid"].startswith("MIG-")
    assert printed(server, big) == [grant["mig_uuid"], "40192"]
    events = [e["kind"] for e in server.describe(big)["events"]]
    assert events.index("mig-reconfigure") < events.index("started")

    # 2. a memory request with --isolation mig: the smallest profile with 18 GiB
    small = server.submit(
        "--isolation", "mig", "--gpu-memory", "18GiB", "--grace", "1", command=SHOW_GPU
    )
    server.wait_phase(small, "running")
    wait_for(lambda: len(printed(server, small)) == 2, "the second workload's output")
    (small_grant,) = server.workloads()[small]["gpus"]
    assert small_grant["mig_profile"] == "1g.20gb"
    assert printed(server, small)[0] == small_grant["mig_uuid"] != grant["mig_uuid"]

    # fgpu top shows the MIG GPUs with their instances and who holds them
    rows = {(r["node"], r["index"]): r for r in server.json("top")}
    mig_rows = [r for r in rows.values() if r["mig_enabled"]]
    assert sorted(r["index"] for r in mig_rows) == [1, 2]
    holders = {i["workload_id"] for r in mig_rows for i in r["mig_instances"]}
    assert holders == {big, small}
    shown = server.cli("top").stdout
    assert f"3g.40gb@{grant['mig_start']}" in shown
    listed = server.cli("ls").stdout
    assert "MIG 3g.40gb@" in listed

    # 3. SIGKILL the server; the next one re-adopts both, on the same instances
    handle = server.handle(big)
    server.kill()
    assert alive(handle)
    server.start()
    after = server.workloads()
    assert after[big]["phase"] == after[small]["phase"] == "running"
    assert after[big]["gpus"][0]["mig_uuid"] == grant["mig_uuid"]
    assert server.describe(big)["events"][-1]["kind"] == "readopted"
    server.cli("cancel", big, small)
    server.wait_phase(big, "cancelled")
    server.wait_phase(small, "cancelled")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--mig-profile", "3g.41gb"],
            "--mig-profile: '3g.41gb': not a MIG profile of A100-80GB; valid here: A100-80GB: "
            "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            ["--isolation", "mig", "--gpu-memory", "96GiB"],
            "--gpu-memory '96GiB': 98304 MiB is more than any MIG profile here has",
        ),
    ],
    ids=["unknown-profile", "never-fits"],
)
def test_bad_mig_requests_are_refused_by_the_cli_and_nothing_is_stored(
    server: ServerProcess, options: list[str], message: str
) -> None:
    result = server.cli("submit", *options, "--", "true", check=False)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split())
    assert server.workloads() == {}
    instances = [i for r in server.json("top") for i in r["mig_instances"]]
    assert instances == []
