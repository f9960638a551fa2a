"""Trace loaders: the openb node and pod CSVs, good and bad."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from fgpu.model.catalog import GPU_CATALOG
from fgpu.model.types import MAX_CPU_MILLI, MAX_GPUS, MAX_MEMORY_MIB, Node, Request
from fgpu.sim.experiment import find_trace_dir
from fgpu.sim.trace import PodTrace, TraceFormatError, load_nodes, load_pods

TRACE_DIR = find_trace_dir() or Path("shared-traces-not-found")
KNOWN_MODELS = (
    ", ".join(sorted(GPU_CATALOG)) + " (aliases: A100, H100, H200, V100, V100M16, V100M32)"
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
NODE_COLUMNS = "sn, cpu_milli, memory_mib, gpu, model"
POD_COLUMNS = "name, cpu_milli, memory_mib, num_gpu, gpu_milli"


def write(tmp_path: Path, text: str | bytes, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


# --------------------------------------------------------------------------- nodes, good


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            "n1,96000,393216,8,G2",
            Node("n1", 96000, 393216, 8, "G2", 32 * 1024),
        ),
        (
            "n1,64000,262144,4,V100M16",
            Node("n1", 64000, 262144, 4, "V100-16GB", 16 * 1024),
        ),
        (
            "n1,96000,786432,8,V100M32",
            Node("n1", 96000, 786432, 8, "V100-32GB", 32 * 1024),
        ),
        (
            "n1,128000,1048576,1,A10",
            Node("n1", 128000, 1048576, 1, "A10", 24 * 1024),
        ),
        (
            "n1,32000,262144,0,",
            Node("n1", 32000, 262144, 0, None, 0),
        ),
        (
            "n1,32000,262144,0,T4",
            Node("n1", 32000, 262144, 0, None, 0),
        ),
        (
            "n1,104000,524288,2,t4",
            Node("n1", 104000, 524288, 2, "T4", 16 * 1024),
        ),
    ],
    ids=[
        "g2-eight",
        "v100m16-alias",
        "v100m32-alias",
        "a10",
        "cpu-only",
        "cpu-only-model-ignored",
        "model-case-insensitive",
    ],
)
def test_load_nodes_row(tmp_path: Path, row: str, expected: Node) -> None:
    assert load_nodes(write(tmp_path, NODE_HEADER + row + "\n")) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "sn,cpu_milli,memory_mib,gpu,model,rack\nn1,8000,61440,2,P100,r7\n",
            [Node("n1", 8000, 61440, 2, "P100", 16 * 1024)],
        ),
        (
            "model,gpu,memory_mib,cpu_milli,sn\nT4,2,524288,104000,n1\n",
            [Node("n1", 104000, 524288, 2, "T4", 16 * 1024)],
        ),
        (
            "sn,cpu_milli,memory_mib,gpu,model\r\nn1,8000,61440,1,P100\r\nn2,8000,61440,0,\r\n",
            [
                Node("n1", 8000, 61440, 1, "P100", 16 * 1024),
                Node("n2", 8000, 61440, 0, None, 0),
            ],
        ),
        (
            "\ufeffsn,cpu_milli,memory_mib,gpu,model\nn1,8000,61440,1,P100\n\n",
            [Node("n1", 8000, 61440, 1, "P100", 16 * 1024)],
        ),
        (
            'sn,cpu_milli,memory_mib,gpu,model\n"n1",8000,61440,1,"G3"\n',
            [Node("n1", 8000, 61440, 1, "G3", 80 * 1024)],
        ),
    ],
    ids=["extra-column", "reordered-columns", "crlf", "bom-and-trailing-blank", "quoted"],
)
def test_load_nodes_layouts(tmp_path: Path, text: str, expected: list[Node]) -> None:
    assert load_nodes(write(tmp_path, text)) == expected


def test_largest_supported_values_load(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, NODE_HEADER + f"n1,{10**9},{2**40},64,T4\n", "n.csv"))
    assert nodes == [Node("n1", MAX_CPU_MILLI, MAX_MEMORY_MIB, MAX_GPUS, "T4", 16 * 1024)]
    pods = load_pods(write(tmp_path, POD_HEADER + f"p,{10**9},{2**40},64,1000,,LS\n", "p.csv"))
    assert pods.requests == (Request(MAX_CPU_MILLI, MAX_MEMORY_MIB, MAX_GPUS, 1000),)


def test_load_nodes_keeps_file_order(tmp_path: Path) -> None:
    text = NODE_HEADER + "b,1000,1024,1,T4\na,1000,1024,0,\nc,1000,1024,2,G3\n"
    assert [n.name for n in load_nodes(write(tmp_path, text))] == ["b", "a", "c"]


# --------------------------------------------------------------------------- pods, good


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p,4000,8192,0,0,,BE", Request(4000, 8192, 0, None, None, frozenset())),
        ("p,6000,12288,1,460,,LS", Request(6000, 12288, 1, 460, None, frozenset())),
        ("p,12000,16384,1,1000,,LS", Request(12000, 16384, 1, 1000, None, frozenset())),
        ("p,64000,262144,8,1000,,LS", Request(64000, 262144, 8, 1000, None, frozenset())),
        ("p,14000,0,1,1000,,Burstable", Request(14000, 0, 1, 1000, None, frozenset())),
        ("p,8000,30517,1,50,G2,LS", Request(8000, 30517, 1, 50, None, frozenset({"G2"}))),
        (
            "p,8000,30517,2,1000,V100M16|V100M32|V100M32,LS",
            Request(8000, 30517, 2, 1000, None, frozenset({"V100-16GB", "V100-32GB"})),
        ),
        (
            "p,8000,30517,1,810,A10|G2|P100|T4,LS",
            Request(8000, 30517, 1, 810, None, frozenset({"A10", "G2", "P100", "T4"})),
        ),
        ("p,8000,30517,1,810,t4,LS", Request(8000, 30517, 1, 810, None, frozenset({"T4"}))),
    ],
    ids=[
        "cpu-only",
        "fraction",
        "one-whole",
        "eight-whole",
        "zero-host-memory",
        "spec-one",
        "spec-aliases-repeated",
        "spec-four",
        "spec-case-insensitive",
    ],
)
def test_load_pods_row(tmp_path: Path, row: str, expected: Request) -> None:
    trace = load_pods(write(tmp_path, POD_HEADER + row + "\n"))
    assert trace == PodTrace(names=("p",), requests=(expected,))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,6000,12288,1,460\n",
            Request(6000, 12288, 1, 460),
        ),
        (
            "gpu_milli,num_gpu,name,memory_mib,cpu_milli,gpu_spec\n320,1,p1,1024,2000,G3\n",
            Request(2000, 1024, 1, 320, None, frozenset({"G3"})),
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time\n"
            "p1,6000,12288,1,460,,LS,Pending,427061,12902960,\n",
            Request(6000, 12288, 1, 460),
        ),
    ],
    ids=["multigpu-layout-no-spec", "reordered-columns", "full-layout-empty-time"],
)
def test_load_pods_layouts(tmp_path: Path, text: str, expected: Request) -> None:
    assert load_pods(write(tmp_path, text)) == PodTrace(("p1",), (expected,))


def test_load_pods_keeps_file_order(tmp_path: Path) -> None:
    text = POD_HEADER + "z,1000,1,0,0,,BE\na,2000,2,1,500,,LS\nm,3000,3,2,1000,,LS\n"
    trace = load_pods(write(tmp_path, text))
    assert trace.names == ("z", "a", "m")
    assert [r.cpu_milli for r in trace.requests] == [1000, 2000, 3000]
    assert len(trace) == 3


def test_pod_trace_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="PodTrace: 2 names but 1 requests"):
        PodTrace(("a", "b"), (Request(),))


# --------------------------------------------------------------------------- errors


def test_trace_format_error_text_and_attributes() -> None:
    err = TraceFormatError("nodes.csv", 7, "column 'gpu': must not be negative (got -1)")
    assert (err.path, err.line, err.reason) == (
        "nodes.csv",
        7,
        "column 'gpu': must not be negative (got -1)",
    )
    assert str(err) == "nodes.csv:7: column 'gpu': must not be negative (got -1)"
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.line, again.reason) == (err.path, err.line, err.reason)


BAD_NODES: list[tuple[str, str | bytes, int, str]] = [
    (
        "missing-column",
        "sn,cpu_milli,memory_mib,gpu\nn1,1000,1024,1\n",
        1,
        f"missing required column(s) model; expected a node list with columns {NODE_COLUMNS}; "
        "found 'sn', 'cpu_milli', 'memory_mib', 'gpu'",
    ),
    (
        "missing-two-columns",
        "sn,cpu,memory_mib,model\nn1,1000,1024,T4\n",
        1,
        "missing required column(s) cpu_milli, gpu; expected a node list",
    ),
    (
        "pod-file-as-node-file",
        POD_HEADER + "p,4000,8192,0,0,,BE\n",
        1,
        f"wrong column layout: this looks like a pod list; expected a node list with columns "
        f"{NODE_COLUMNS}",
    ),
    (
        "unknown-layout",
        "a,b,c\n1,2,3\n",
        1,
        f"unknown column layout ('a', 'b', 'c'); expected a node list with columns {NODE_COLUMNS}",
    ),
    (
        "duplicate-column",
        "sn,cpu_milli,memory_mib,gpu,model,gpu\nn1,1000,1024,1,T4,1\n",
        1,
        "duplicate column 'gpu' in the header",
    ),
    (
        "empty-file",
        "",
        1,
        f"empty file: no header; expected a node list with columns {NODE_COLUMNS}",
    ),
    ("blank-lines-only", "\n\n", 1, "empty file: no header"),
    ("header-only", NODE_HEADER, 1, "no data rows after the header: the node list is empty"),
    ("blank-before-header", "\n" + NODE_HEADER + "n1,1,1,0,\n", 1, "blank line before the header"),
    (
        "too-few-fields",
        NODE_HEADER + "n1,1000,1024,1,T4\nn2,1000,1024,1\n",
        3,
        "expected 5 fields as in the header, got 4",
    ),
    (
        "too-many-fields",
        NODE_HEADER + "n1,1000,1024,1,T4,extra\n",
        2,
        "expected 5 fields as in the header, got 6",
    ),
    (
        "empty-number",
        NODE_HEADER + "n1,,1024,1,T4\n",
        2,
        "column 'cpu_milli': empty value, expected an integer",
    ),
    (
        "decimal-number",
        NODE_HEADER + "n1,1000,1.5,1,T4\n",
        2,
        "column 'memory_mib': not an integer (got '1.5')",
    ),
    (
        "word-for-number",
        NODE_HEADER + "n1,1000,1024,eight,T4\n",
        2,
        "column 'gpu': not an integer (got 'eight')",
    ),
    (
        "padded-number",
        NODE_HEADER + "n1, 1000,1024,1,T4\n",
        2,
        "column 'cpu_milli': not an integer (got ' 1000')",
    ),
    (
        "negative-number",
        NODE_HEADER + "n1,1000,1024,-1,T4\n",
        2,
        "column 'gpu': must not be negative (got -1)",
    ),
    (
        "unknown-model",
        NODE_HEADER + "n1,1000,1024,1,T4\nn2,1000,1024,1,X100\n",
        3,
        f"column 'model': unknown GPU model 'X100'; known models: {KNOWN_MODELS}",
    ),
    (
        "unknown-model-on-cpu-node",
        NODE_HEADER + "n1,1000,1024,0,X100\n",
        2,
        "column 'model': unknown GPU model 'X100'",
    ),
    (
        "gpus-without-model",
        NODE_HEADER + "n1,1000,1024,2,\n",
        2,
        "column 'model': empty, but the node has 2 GPU(s)",
    ),
    ("empty-name", NODE_HEADER + ",1000,1024,1,T4\n", 2, "column 'sn': empty node name"),
    (
        "duplicate-name",
        NODE_HEADER + "n1,1000,1024,1,T4\nn2,1000,1024,1,T4\nn1,1000,1024,1,T4\n",
        4,
        "duplicate node name 'n1' (first on line 2)",
    ),
    (
        "blank-lines-count",
        NODE_HEADER + "\n\nn1,1000,1024,-2,T4\n",
        4,
        "column 'gpu': must not be negative (got -2)",
    ),
    (
        "unterminated-quote",
        NODE_HEADER + 'n1,1000,1024,1,T4\nn2,1000,1024,1,"T4\n',
        3,
        "malformed CSV: unexpected end of data",
    ),
    (
        "not-utf8",
        (NODE_HEADER + "n1,1000,1024,1,T4\nn\xe9,1000,1024,1,T4\n").encode("latin-1"),
        3,
        "not UTF-8 text (byte 0xe9)",
    ),
    (
        "cpu-above-bound",
        NODE_HEADER + f"n1,{10**27},1024,1,T4\n",
        2,
        "column 'cpu_milli': 1000000000000000000000000000 is above the largest supported "
        "value 1000000000",
    ),
    (
        "memory-above-bound",
        NODE_HEADER + f"n1,1000,{2**40 + 1},1,T4\n",
        2,
        f"column 'memory_mib': {2**40 + 1} is above the largest supported value {2**40}",
    ),
    (
        "gpus-above-bound",
        NODE_HEADER + "n1,1000,1024,100000000000,T4\n",
        2,
        "column 'gpu': 100000000000 is above the largest supported value 64",
    ),
    (
        "number-too-long-for-int",
        NODE_HEADER + "n1," + "9" * 5000 + ",1024,1,T4\n",
        2,
        "column 'cpu_milli': 999999999999... (5000 digits) is above the largest supported "
        "value 1000000000",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [case[1:] for case in BAD_NODES],
    ids=[case[0] for case in BAD_NODES],
)
def test_load_nodes_rejects(tmp_path: Path, text: str | bytes, line: int, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceFormatError) as caught:
        load_nodes(path)
    assert caught.value.path == str(path)
    assert caught.value.line == line
    assert reason in caught.value.reason
    assert str(caught.value) == f"{path}:{line}: {caught.value.reason}"


BAD_PODS: list[tuple[str, str, int, str]] = [
    (
        "cpu-above-bound",
        POD_HEADER + f"p,{10**9 + 1},1024,1,500,,LS\n",
        2,
        "column 'cpu_milli': 1000000001 is above the largest supported value 1000000000",
    ),
    (
        "memory-above-bound",
        POD_HEADER + f"p,1000,{10**20},1,500,,LS\n",
        2,
        f"column 'memory_mib': {10**20} is above the largest supported value {2**40}",
    ),
    (
        "num-gpu-above-bound",
        POD_HEADER + "p,1000,1024,99999999999999999999,1000,,LS\n",
        2,
        "column 'num_gpu': 99999999999999999999 is above the largest supported value 64",
    ),
    (
        "missing-column",
        "name,cpu_milli,memory_mib,num_gpu\np,1000,1024,1\n",
        1,
        f"missing required column(s) gpu_milli; expected a pod list with columns {POD_COLUMNS}; "
        "found 'name', 'cpu_milli', 'memory_mib', 'num_gpu'",
    ),
    (
        "missing-two-columns",
        "name,cpu_milli,memory_mib,gpu,gpu_spec\np,1000,1024,1,\n",
        1,
        "missing required column(s) num_gpu, gpu_milli; expected a pod list",
    ),
    (
        "node-file-as-pod-file",
        NODE_HEADER + "n1,1000,1024,1,T4\n",
        1,
        f"wrong column layout: this looks like a node list; expected a pod list with columns "
        f"{POD_COLUMNS}",
    ),
    (
        "unknown-layout",
        "id,start,end\n1,2,3\n",
        1,
        f"unknown column layout ('id', 'start', 'end'); expected a pod list with columns "
        f"{POD_COLUMNS}",
    ),
    ("empty-file", "", 1, f"empty file: no header; expected a pod list with columns {POD_COLUMNS}"),
    ("header-only", POD_HEADER, 1, "no data rows after the header: the pod list is empty"),
    (
        "too-few-fields",
        POD_HEADER + "p,1000,1024,1,500,\n",
        2,
        "expected 7 fields as in the header, got 6",
    ),
    (
        "empty-number",
        POD_HEADER + "p,1000,1024,1,,,LS\n",
        2,
        "column 'gpu_milli': empty value, expected an integer",
    ),
    (
        "fraction-as-decimal",
        POD_HEADER + "p,1000,1024,0.5,500,,LS\n",
        2,
        "column 'num_gpu': not an integer (got '0.5')",
    ),
    (
        "negative-cpu",
        POD_HEADER + "p,-1000,1024,1,500,,LS\n",
        2,
        "column 'cpu_milli': must not be negative (got -1000)",
    ),
    (
        "milli-above-1000",
        POD_HEADER + "p,1000,1024,1,1001,,LS\n",
        2,
        "column 'gpu_milli': 1001 is above the largest supported value 1000",
    ),
    (
        "zero-milli-with-gpus",
        POD_HEADER + "p,1000,1024,1,0,,LS\n",
        2,
        "gpu_milli is 0 but num_gpu is 1 (a GPU pod needs 1..1000)",
    ),
    (
        "milli-without-gpus",
        POD_HEADER + "p,1000,1024,0,500,,LS\n",
        2,
        "gpu_milli is 500 but num_gpu is 0 (a CPU-only pod has 0)",
    ),
    (
        "fraction-on-two-gpus",
        POD_HEADER + "p,1000,1024,2,500,,LS\n",
        2,
        "gpu_milli is 500 with num_gpu 2: a fraction of a GPU is allowed only when num_gpu is 1",
    ),
    (
        "unknown-spec-model",
        POD_HEADER + "p1,1000,1024,1,500,T4,LS\np2,1000,1024,1,500,T4|X9,LS\n",
        3,
        f"column 'gpu_spec': unknown GPU model 'X9'; known models: {KNOWN_MODELS}",
    ),
    (
        "empty-spec-part",
        POD_HEADER + "p,1000,1024,1,500,T4|,LS\n",
        2,
        "column 'gpu_spec': empty model name in 'T4|'",
    ),
    ("empty-name", POD_HEADER + ",1000,1024,1,500,,LS\n", 2, "column 'name': empty pod name"),
    (
        "duplicate-name",
        POD_HEADER + "a,1000,1024,1,500,,LS\nb,1000,1024,0,0,,LS\na,1000,1024,0,0,,LS\n",
        4,
        "duplicate pod name 'a' (first on line 2)",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [case[1:] for case in BAD_PODS],
    ids=[case[0] for case in BAD_PODS],
)
def test_load_pods_rejects(tmp_path: Path, text: str, line: int, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceFormatError) as caught:
        load_pods(path)
    assert caught.value.path == str(path)
    assert caught.value.line == line
    assert reason in caught.value.reason
    assert str(caught.value) == f"{path}:{line}: {caught.value.reason}"


@pytest.mark.parametrize("loader", [load_nodes, load_pods], ids=["nodes", "pods"])
def test_missing_file(tmp_path: Path, loader: Callable[[Path], object]) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(TraceFormatError) as caught:
        loader(path)
    assert (caught.value.line, caught.value.reason) == (0, "file not found")
    assert str(caught.value) == f"{path}: file not found"  # the whole file: no line number


@pytest.mark.parametrize("loader", [load_nodes, load_pods], ids=["nodes", "pods"])
def test_directory_is_not_a_file(tmp_path: Path, loader: Callable[[Path], object]) -> None:
    with pytest.raises(TraceFormatError) as caught:
        loader(tmp_path)
    assert (caught.value.line, caught.value.reason) == (0, "is a directory, not a file")


# --------------------------------------------------------------------------- real trace

needs_trace = pytest.mark.skipif(
    not TRACE_DIR.is_dir(),
    reason=f"Alibaba trace not found: {TRACE_DIR} is not a folder",
)


@needs_trace
def test_real_gpu_nodes() -> None:
    nodes = load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    gpus_per_model: Counter[str | None] = Counter()
    for node in nodes:
        gpus_per_model[node.gpu_model] += node.gpu_count
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    assert dict(gpus_per_model) == {
        "G2": 4392,
        "T4": 842,
        "G3": 312,
        "P100": 265,
        "V100-32GB": 204,
        "V100-16GB": 195,
        "A10": 2,
    }
    assert Counter(n.gpu_count for n in nodes) == {8: 617, 4: 54, 2: 518, 1: 24}
    assert sum(n.cpu_milli for n in nodes) == 107_018_000
    assert sum(n.memory_mib for n in nodes) == 503_828_480
    assert nodes[0] == Node("openb-node-0000", 64000, 262144, 2, "P100", 16 * 1024)


@needs_trace
def test_real_all_nodes() -> None:
    nodes = load_nodes(TRACE_DIR / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523
    assert sum(n.gpu_count == 0 for n in nodes) == 310
    assert all(n.gpu_model is None and n.gpu_memory_mib == 0 for n in nodes if n.gpu_count == 0)
    assert sum(n.gpu_count for n in nodes) == 6212


@needs_trace
def test_real_default_pods() -> None:
    trace = load_pods(TRACE_DIR / "openb_pod_list_default.csv")
    requests = trace.requests
    assert len(trace) == 8152
    assert len(set(trace.names)) == 8152
    assert sum(r.is_cpu_only for r in requests) == 1088
    assert sum(r.gpu_count == 1 and (r.gpu_milli or 0) < 1000 for r in requests) == 3078
    assert Counter(r.gpu_count for r in requests) == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
    assert sum(r.total_gpu_milli for r in requests) == 6_086_800
    assert all(r.gpu_models == frozenset() for r in requests)
    assert trace.names[:2] == ("openb-pod-0000", "openb-pod-0001")
    assert requests[:2] == (Request(12000, 16384, 1, 1000), Request(6000, 12288, 1, 460))


@needs_trace
def test_real_multigpu_pods_have_only_required_columns() -> None:
    trace = load_pods(TRACE_DIR / "openb_pod_list_multigpu20.csv")
    assert len(trace) == 8324
    assert sum(r.total_gpu_milli for r in trace.requests) == 7_086_800


@needs_trace
def test_real_gpuspec_pods_map_aliases() -> None:
    trace = load_pods(TRACE_DIR / "openb_pod_list_gpuspec33.csv")
    specs = Counter(r.gpu_models for r in trace.requests)
    assert len(trace) == 8152
    assert specs[frozenset()] == 5764
    assert specs[frozenset({"T4"})] == 1291
    # "V100M16|V100M32" (141 pods) and "V100M16|V100M32|V100M32" (22) are the same set.
    assert specs[frozenset({"V100-16GB", "V100-32GB"})] == 163
