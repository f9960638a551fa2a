"""Workload generation and workload files of the dynamic simulator."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fgpu.model.types import Request
from fgpu.sim.workloads import (
    PRIORITY_MIX,
    WORKLOAD_COLUMNS,
    Z_90,
    SimWorkload,
    WorkloadFileError,
    arrival_rate,
    generate,
    load_workloads,
    lognormal_from_quantiles,
    lognormal_mean,
    offered_load,
    write_workloads,
)

PODS = [
    Request(cpu_milli=4000, memory_mib=8192, gpu_count=1, gpu_milli=500),
    Request(cpu_milli=8000, memory_mib=16384, gpu_count=2, gpu_milli=1000),
    Request(cpu_milli=2000, memory_mib=4096),  # CPU-only, as in the trace
    Request(
        cpu_milli=6000,
        memory_mib=8192,
        gpu_count=1,
        gpu_milli=1000,
        gpu_models=frozenset({"T4"}),
    ),
]
CAPACITY = 64_000
HEADER = ",".join(WORKLOAD_COLUMNS)


# ----------------------------------------------------------------------------- log-normal
def test_lognormal_defaults_are_the_trace_lifetimes() -> None:
    mu, sigma = lognormal_from_quantiles()
    assert mu == pytest.approx(math.log(540))
    assert sigma == pytest.approx(math.log(12) / Z_90)
    assert math.exp(mu) == pytest.approx(540)
    assert math.exp(mu + sigma * Z_90) == pytest.approx(6480)
    assert lognormal_mean(mu, sigma) == pytest.approx(540 * math.exp(sigma**2 / 2))


@pytest.mark.parametrize(
    ("median", "p90"),
    [(0, 10), (-1, 10), (10, 10), (10, 5), (math.nan, 10), (10, math.inf)],
    ids=["zero-median", "negative-median", "p90-equal", "p90-below", "nan", "inf"],
)
def test_lognormal_rejects_bad_quantiles(median: float, p90: float) -> None:
    with pytest.raises(ValueError, match=r"median_s|p90_s"):
        lognormal_from_quantiles(median, p90)


# ----------------------------------------------------------------------------- generator
@pytest.fixture(scope="module")
def long_run() -> list[SimWorkload]:
    """About 250,000 workloads: 3000 hours at 0.9 load on 64 GPUs."""
    return generate(PODS, CAPACITY, 3, 0.9, 3000, np.random.default_rng(7))


def test_durations_match_the_trace_quantiles() -> None:
    sample = generate(PODS, CAPACITY, 3, 0.9, 320, np.random.default_rng(3))
    assert len(sample) > 20_000
    durations = np.array([w.duration_s for w in sample])
    assert np.median(durations) == pytest.approx(540, rel=0.04)
    assert np.percentile(durations, 90) == pytest.approx(6480, rel=0.04)
    assert durations.min() > 0


def test_offered_load_matches_the_target_over_a_long_horizon(
    long_run: list[SimWorkload],
) -> None:
    assert offered_load(long_run, CAPACITY, 3000) == pytest.approx(0.9, rel=0.05)


def test_arrivals_are_poisson_at_the_computed_rate(long_run: list[SimWorkload]) -> None:
    mu, sigma = lognormal_from_quantiles()
    # the mix: 90 % training shapes (all pods), 10 % inference (the one fractional pod)
    mean_gpu = 0.9 * (500 + 2000 + 0 + 1000) / 4 + 0.1 * 500
    rate = arrival_rate(PODS, CAPACITY, 0.9, lognormal_mean(mu, sigma), mean_gpu)
    assert rate == pytest.approx(0.9 * CAPACITY / (mean_gpu * lognormal_mean(mu, sigma)))
    expected = rate * 3000 * 3600
    assert abs(len(long_run) - expected) < 4 * math.sqrt(expected)
    gaps = np.diff([w.submit_s for w in long_run])
    assert (gaps >= 0).all()
    # exponential gaps: the coefficient of variation is 1
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)


def test_queues_priorities_and_shapes_are_drawn_as_documented(
    long_run: list[SimWorkload],
) -> None:
    n = len(long_run)
    queues = {q: sum(1 for w in long_run if w.queue == q) / n for q in ("tenant-1", "tenant-2")}
    assert set(w.queue for w in long_run) == {"tenant-1", "tenant-2", "tenant-3"}
    for share in queues.values():
        assert share == pytest.approx(1 / 3, abs=0.01)
    for priority, share in PRIORITY_MIX:
        assert sum(1 for w in long_run if w.priority == priority) / n == pytest.approx(
            share, abs=0.01
        )
    inference = [w for w in long_run if w.priority == 125]
    assert {w.request for w in inference} == {PODS[0]}  # single-GPU fractional shapes only
    assert all(not w.request.gpu_models for w in long_run)  # model constraints dropped
    assert any(w.request.is_cpu_only for w in long_run)  # CPU-only pods kept
    assert len({w.id for w in long_run}) == n


def test_explicit_gpu_memory_for_fractions_within_the_ratio() -> None:
    sample = generate(PODS, CAPACITY, 3, 0.9, 20, np.random.default_rng(5), gpu_memory_mib=81_920)
    fractions = [w.request for w in sample if w.request.gpu_milli == 500]
    assert fractions
    # 0.5 x 80 GiB x r, r in [0.25, 1], rounded up to 256 MiB
    assert all(10_240 <= r.gpu_memory_mib <= 40_960 for r in fractions)  # type: ignore[operator]
    assert len({r.gpu_memory_mib for r in fractions}) > 10
    whole = [w.request for w in sample if w.request.gpu_milli == 1000]
    assert all(r.gpu_memory_mib is None for r in whole)
    with pytest.raises(ValueError, match="memory_ratio"):
        generate(PODS, CAPACITY, 3, 0.9, 1, np.random.default_rng(0), memory_ratio=(0.0, 1.0))


def test_generation_is_deterministic_per_generator_state() -> None:
    a = generate(PODS, CAPACITY, 2, 0.5, 5, np.random.default_rng(11))
    b = generate(PODS, CAPACITY, 2, 0.5, 5, np.random.default_rng(11))
    c = generate(PODS, CAPACITY, 2, 0.5, 5, np.random.default_rng(12))
    assert a == b
    assert a != c
    assert [w.submit_s for w in a] == sorted(w.submit_s for w in a)
    assert all(0 <= w.submit_s < 5 * 3600 for w in a)


@pytest.mark.parametrize(
    ("pods", "tenants", "load", "hours", "message"),
    [
        (PODS, 0, 0.9, 1, "tenants"),
        (PODS, 3, 0.0, 1, "load"),
        (PODS, 3, math.nan, 1, "load"),
        (PODS, 3, 0.9, 0, "hours"),
        ([], 3, 0.9, 1, "empty"),
        ([Request(cpu_milli=1000)], 3, 0.9, 1, "no GPU"),
    ],
    ids=["no-tenant", "zero-load", "nan-load", "zero-hours", "no-pods", "cpu-only-pods"],
)
def test_generate_rejects_bad_arguments(
    pods: list[Request], tenants: int, load: float, hours: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        generate(pods, CAPACITY, tenants, load, hours, np.random.default_rng(0))


# ----------------------------------------------------------------------------- files
def write(tmp_path: Path, text: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_load_workloads_reads_every_kind_of_request(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"{HEADER}\n"
        "b,20,60,team-a,high,2,,8,32GiB\n"
        "a,10.5,30,team-b,40,0.5,,4,16GiB\n"
        "\n"
        "c,10.5,5,team-a,,,5GiB,250m,512MiB\n"
        "d,0,1,team-b,normal,0.25,10GiB,,\n"
        "e,3,2,team-a,critical,0,,1,0\n",
    )
    loaded = load_workloads(path)
    assert [w.id for w in loaded] == ["d", "e", "a", "c", "b"]  # by submit time, stable
    by_id = {w.id: w for w in loaded}
    assert by_id["b"] == SimWorkload(
        "b", "team-a", Request(8000, 32768, 2, 1000, None), 100, 20.0, 60.0
    )
    assert by_id["a"].request == Request(4000, 16384, 1, 500, None)
    assert by_id["a"].priority == 40
    assert by_id["c"].request == Request(250, 512, 1, None, 5120)
    assert by_id["c"].priority == 50
    assert by_id["d"].request == Request(0, 0, 1, 250, 10240)
    assert by_id["e"].request == Request(1000, 0, 0, None, None)
    assert by_id["e"].priority == 125


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("x,1,2,q,50,0.5,,1", "expected 9 fields as in the header, got 8"),
        (",1,2,q,50,0.5,,1,1GiB", "column 'id': empty workload id"),
        ("x,-1,2,q,50,0.5,,1,1GiB", "column 'submit_s': must not be negative (got -1)"),
        ("x,soon,2,q,50,0.5,,1,1GiB", "column 'submit_s': not a number (got 'soon')"),
        ("x,,2,q,50,0.5,,1,1GiB", "column 'submit_s': empty value"),
        ("x,nan,2,q,50,0.5,,1,1GiB", "column 'submit_s': must be finite (got nan)"),
        ("x,1,0,q,50,0.5,,1,1GiB", "column 'duration_s': must be positive (got 0)"),
        ("x,1,2,,50,0.5,,1,1GiB", "column 'queue': empty queue name"),
        (
            "x,1,2,q,urgent,0.5,,1,1GiB",
            "column 'priority': unknown priority 'urgent'; use a number or very-low (25), "
            "low (40), normal (50), high (100), critical (125)",
        ),
        (
            "x,1,2,q,50,1.5,,1,1GiB",
            "column 'gpu': above 1 a GPU request is a whole number of GPUs (got '1.5')",
        ),
        ("x,1,2,q,50,-1,,1,1GiB", "column 'gpu': a GPU request must be positive (got '-1')"),
        (
            "x,1,2,q,50,0.5,5XB,1,1GiB",
            "column 'gpu_memory': unknown unit 'XB'; use MiB, GiB or TiB (M/MB, G/GB and "
            "T/TB mean the same: binary; a bare number is MiB) (got '5XB')",
        ),
        (
            "x,1,2,q,50,2,5GiB,1,1GiB",
            "column 'gpu_memory': not allowed with whole GPUs (gpu 2); a whole GPU comes with "
            "all of its memory",
        ),
        ("x,1,2,q,50,0.5,,lots,1GiB", "column 'cpu': not a plain decimal number (got 'lots')"),
        (
            "x,1,2,q,50,0.5,,1,big",
            "column 'memory': expected a number with an optional unit, e.g. 5GiB (got 'big')",
        ),
    ],
    ids=[
        "field-count",
        "empty-id",
        "negative-submit",
        "submit-not-number",
        "submit-empty",
        "submit-nan",
        "zero-duration",
        "empty-queue",
        "unknown-priority",
        "fractional-count",
        "negative-gpu",
        "bad-gpu-memory-unit",
        "gpu-memory-with-whole-gpus",
        "bad-cpu",
        "bad-memory",
    ],
)
def test_bad_rows_name_the_line_and_the_reason(tmp_path: Path, row: str, reason: str) -> None:
    path = write(tmp_path, f"{HEADER}\nok,0,1,q,50,0.5,,1,1GiB\n\n{row}\n")
    with pytest.raises(WorkloadFileError) as caught:
        load_workloads(path)
    assert caught.value.line == 4
    assert caught.value.reason == reason
    assert str(caught.value) == f"{path}:4: {reason}"


def test_duplicate_id_names_the_first_line(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}\nx,0,1,q,50,0.5,,1,1GiB\nx,0,1,q,50,0.5,,1,1GiB\n")
    with pytest.raises(
        WorkloadFileError, match=r":3: duplicate workload id 'x' \(first on line 2\)"
    ):
        load_workloads(path)


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("", 1, "empty file: no header; expected columns " + ", ".join(WORKLOAD_COLUMNS)),
        (HEADER + "\n", 1, "no data rows after the header"),
        (
            HEADER + ",color\nx,0,1,q,50,0.5,,1,1GiB,red\n",
            1,
            "unknown column(s) 'color'; expected columns " + ", ".join(WORKLOAD_COLUMNS),
        ),
        (
            "id,submit_s,duration_s,queue,priority,gpu,cpu,memory\n",
            1,
            "missing column(s) gpu_memory; expected columns " + ", ".join(WORKLOAD_COLUMNS),
        ),
        (
            "id,submit,duration_s,queue,priority,gpu,gpu_memory,cpu,memory\n",
            1,
            "unknown column(s) 'submit'; missing column(s) submit_s; expected columns "
            + ", ".join(WORKLOAD_COLUMNS),
        ),
        (HEADER + ",id\n", 1, "duplicate column 'id' in the header"),
        ("\n" + HEADER + "\n", 1, "blank line before the header"),
        (HEADER + '\nx,0,1,"q,50\n', 2, "malformed CSV: unexpected end of data"),
    ],
    ids=[
        "empty",
        "header-only",
        "unknown-column",
        "missing-column",
        "misspelt-column",
        "duplicate-column",
        "blank-first",
        "bad-quote",
    ],
)
def test_file_level_problems_are_explained(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(WorkloadFileError) as caught:
        load_workloads(path)
    assert (caught.value.line, caught.value.reason) == (line, reason)


def test_missing_file_is_line_0(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError) as caught:
        load_workloads(tmp_path / "nope.csv")
    assert caught.value.line == 0
    assert caught.value.reason == "file not found"


def test_a_generated_day_reads_back_unchanged(tmp_path: Path) -> None:
    day = generate(PODS, CAPACITY, 3, 0.9, 4, np.random.default_rng(5))
    path = tmp_path / "day.csv"
    write_workloads(path, day)
    assert load_workloads(path) == day


def test_an_optional_user_column_is_read_and_written(tmp_path: Path) -> None:
    # issue 25: inside a queue the user with less allocated goes first; a workload file may
    # say whose each workload is (no column: every workload has the empty user)
    path = write(
        tmp_path,
        f"{HEADER},user\na,0,10,team,,1,,,,alice\nb,1,10,team,,1,,,, bob \nc,2,10,team,,1,,,,\n",
    )
    loaded = load_workloads(path)
    assert [(w.id, w.user) for w in loaded] == [("a", "alice"), ("b", "bob"), ("c", "")]
    again = tmp_path / "again.csv"
    write_workloads(again, loaded)
    assert again.read_text().splitlines()[0] == ",".join((*WORKLOAD_COLUMNS, "user"))
    assert load_workloads(again) == loaded
    # without users the layout is the old one
    plain = [
        SimWorkload(w.id, w.queue, w.request, w.priority, w.submit_s, w.duration_s) for w in loaded
    ]
    write_workloads(again, plain)
    assert again.read_text().splitlines()[0] == ",".join(WORKLOAD_COLUMNS)
    with pytest.raises(WorkloadFileError, match="unknown column"):
        load_workloads(write(tmp_path, f"{HEADER},owner\na,0,10,team,,1,,,,x\n"))
