"""Wire models of the REST API (``/v1``), shared by the server and the client.

Pydantic models only: no fgpu internals (the constants live in :mod:`fgpu.wire_basics`), so
the client depends on nothing else. Units on
the wire follow DESIGN.md section 3: compute in milli-GPU, memory in MiB, CPU in
milli-cores, times in seconds since the epoch. Requests accept the human forms the CLI
takes (``"0.5"``, ``"5GiB"``); the server validates them with :mod:`fgpu.model.units` and
answers 422 with ``{"detail": {"field": ..., "reason": ...}}`` when they are wrong.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from pydantic.config import JsonDict

# the API's constants, kept where the client reads them without pydantic
from fgpu.wire_basics import API_PREFIX as API_PREFIX
from fgpu.wire_basics import LOG_OFFSET_HEADER as LOG_OFFSET_HEADER
from fgpu.wire_basics import NEXT_CURSOR_HEADER as NEXT_CURSOR_HEADER
from fgpu.wire_basics import SKIPPED_ROWS_HEADER as SKIPPED_ROWS_HEADER
from fgpu.wire_basics import TERMINAL_PHASES as TERMINAL_PHASES
from fgpu.wire_limits import (
    ENV_NAME_PATTERN,
    MAX_AMOUNT,
    MAX_ARGUMENT_BYTES,
    MAX_CWD_CHARS,
    MAX_GRACE_S,
    MAX_MEMBERS,
    MAX_PRIORITY,
    MAX_QUOTA_GPUS,
    MEMBER_PATTERN,
    MIN_OUTPUT_BYTES,
    MIN_STORED_BYTES,
    NAME_LENGTH,
    QUEUE_NAME_PATTERN,
    TEXT_PATTERN,
    anchored,
    workload_name_schema,
)

_ARGUMENT_CHARS = MAX_ARGUMENT_BYTES - 1
"""Most characters of one argument (its bytes with the NUL at most MAX_ARGUMENT_BYTES; an
ASCII argument reaches this, others less)."""
_QUEUE_NAME: JsonDict = {
    "minLength": 1,
    "maxLength": NAME_LENGTH,
    "pattern": anchored(QUEUE_NAME_PATTERN),
}


class _Strict(BaseModel):
    """A request body: unknown fields are refused. Limits the server checks itself (with
    its own field and reason) are declared for the OpenAPI document in
    ``json_schema_extra``, so that the document lists them without pydantic answering
    first. Their values come from :mod:`fgpu.wire_limits`, as the server's checks' do."""

    # strict: JSON types as the document says (no false for a number, no 1 for true)
    model_config = ConfigDict(extra="forbid", strict=True)


class SubmitRequest(_Strict):
    """``POST /v1/workloads``."""

    command: list[str] = Field(
        description="argv; with shell=true one shell command line. Each argument (and each "
        "env NAME=value) at most 131072 bytes in UTF-8 with its NUL, command and env together "
        "at most 1048576 bytes; no NUL characters",
        json_schema_extra={
            "minItems": 1,
            "items": {
                "type": "string",
                "minLength": 1,
                "maxLength": _ARGUMENT_CHARS,
                "pattern": anchored(TEXT_PATTERN),
            },
        },
    )
    shell: bool = False
    name: str | None = Field(
        default=None,
        description="display name: not empty or only spaces, no leading '-', no '/', not "
        "'.' or '..', no control, format (Cf) or line/paragraph separator characters",
        json_schema_extra=workload_name_schema,
    )
    gpu: str | None = Field(None, description="-g: a fraction '0.5' or a count '2'")
    gpu_fraction: str | None = Field(None, description="share on each of several GPUs")
    gpu_memory: str | None = Field(None, description="memory quota per GPU, e.g. '5GiB'")
    gpu_model: list[str] = Field(default_factory=list)
    mig_profile: str | None = Field(None, description="a MIG instance of this profile (3g.40gb)")
    isolation: str | None = Field(
        None,
        description="'share' (default: a share of a GPU) or 'mig' (a MIG instance: with "
        "gpu_memory, the smallest profile that has that much; mig_profile implies it)",
    )
    cpu: str | None = Field(None, description="CPU cores, e.g. '2' or '500m'")
    memory: str | None = Field(None, description="host memory, e.g. '8GiB'")
    priority: str = Field(
        default="normal",
        description="a class (very-low, low, normal, high, critical) or a number 0..1000",
    )
    queue: str | None = Field(
        default=None,
        description="the queue; null: the caller's default queue (the queue whose "
        "default_for names the caller or one of the caller's groups), else 'default'",
        json_schema_extra=_QUEUE_NAME,
    )
    preemptible: StrictBool | None = None
    grace_s: float = Field(
        default=30.0,
        description="SIGTERM to SIGKILL, seconds",
        json_schema_extra={"minimum": 0, "maximum": MAX_GRACE_S},
    )
    cwd: str = Field(
        default="/",
        description="an absolute path",
        json_schema_extra={"pattern": anchored("/" + TEXT_PATTERN), "maxLength": MAX_CWD_CHARS},
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={
            "propertyNames": {"pattern": anchored(ENV_NAME_PATTERN)},
            "additionalProperties": {
                "type": "string",
                # NAME=value with its NUL: a one-character name leaves this much for the
                # value (a longer name less, which a schema cannot tie to the name)
                "maxLength": MAX_ARGUMENT_BYTES - 3,
                "pattern": anchored(TEXT_PATTERN),
            },
        },
    )
    time: str | None = Field(
        default=None,
        description="time limit of a run, as Slurm writes it: minutes (90), MM:SS, "
        "HH:MM:SS (1:30:00), D-HH, D-HH:MM, D-HH:MM:SS (2-00:00:00); 0 or UNLIMITED for "
        "none; default: the queue's default time",
        json_schema_extra={"maxLength": 64},
    )
    dependency: str | None = Field(
        default=None,
        description="afterok:ID[:ID...], afterany:..., afternotok:..., several joined by ','; "
        "an ID is a workload id, id prefix or name, or an array's id or name; at most 1000 "
        "conditions",
    )
    array: str | None = Field(
        default=None,
        description="one task per index: 0-99, 1,3,5, 0-15:4, then %N for at most N running "
        "at once; each task gets FGPU_ARRAY_INDEX (and SLURM_ARRAY_TASK_ID); at most 1000 "
        "tasks, indices up to 999999, 4096 characters",
    )


class ArrayTaskView(BaseModel):
    """The array a workload is a task of (``--array``)."""

    id: str = Field(description="the array's id (none of its tasks' ids)")
    name: str = Field(description="the array's name; its tasks are named NAME_INDEX")
    index: int = Field(description="this task's index (FGPU_ARRAY_INDEX)")
    size: int = Field(description="how many tasks the array has")
    throttle: int | None = Field(
        default=None, description="at most this many of its tasks run at once (%N)"
    )


class ResourceRequest(BaseModel):
    """A workload's request in integer units. A MIG request has ``isolation`` ``"mig"``, one
    GPU, and ``mig_profile`` (asked by name) or ``gpu_memory_mib`` (the smallest profile with
    that much)."""

    gpu_count: int
    gpu_milli: int | None
    gpu_memory_mib: int | None
    gpu_models: list[str]
    cpu_milli: int
    memory_mib: int
    isolation: str = "share"
    mig_profile: str | None = None


class GpuGrant(BaseModel):
    """One GPU a workload holds (on a MIG instance: the instance's GPU, with the instance's
    compute slices as milli-GPU and its memory)."""

    node: str
    index: int
    uuid: str
    compute_milli: int
    memory_mib: int
    mig_profile: str | None = None
    mig_start: int | None = Field(
        default=None, description="first memory slice of the MIG instance"
    )
    mig_uuid: str | None = Field(
        default=None, description="the MIG instance (CUDA_VISIBLE_DEVICES)"
    )


class WorkloadView(BaseModel):
    """A workload as listed (``fgpu ls --json``)."""

    id: str
    name: str
    owner_uid: int
    phase: str
    queue: str
    priority: int
    preemptible: bool
    request: ResourceRequest
    gpus: list[GpuGrant] = Field(
        description="the GPU shares it holds; for a finished workload, where it last ran"
    )
    command: list[str]
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    reason: str
    restarts: int
    stopping: bool = Field(
        default=False,
        description="running or paused, and being stopped (cancel or preemption: SIGTERM "
        "sent, SIGKILL after the grace period)",
    )
    squeezed: bool = Field(
        default=False,
        description="running with its memory, but its compute was lent to higher-priority "
        "work of its queue (squeeze before evict): paused while that work is busy",
    )
    squeezed_by: list[str] = Field(
        default_factory=list, description="ids of the workloads that squeezed it"
    )
    gpu_state: str | None = Field(
        default=None,
        description="while it runs on a governed GPU, what the governor does with it, in "
        "the words of 'state': running, paused-by-priority or waiting-for-share; None "
        "elsewhere",
    )
    suspended_host_mib: int | None = Field(
        default=None,
        description="while pending and suspended to host memory (its GPU memory copied out "
        "through the CUDA checkpoint API, its processes frozen; restored when its GPU has "
        "room): the host memory it holds, MiB; None when not suspended",
    )
    time_limit_s: float | None = Field(
        default=None,
        description="the longest a run may last, seconds, counted from its latest start "
        "(pending time does not count); then it is cancelled, reason 'time limit'",
    )
    dependency: list[str] = Field(
        default_factory=list,
        description="conditions before it may start, TYPE:ID each (afterok, afterany, afternotok)",
    )
    array: ArrayTaskView | None = Field(
        default=None, description="the array it is a task of; None for a plain workload"
    )
    cancelled_tasks: list[str] = Field(
        default_factory=list,
        description="in the answer to a cancel of an array (by its id or name): the ids of "
        "every task that request cancelled or began to stop",
    )
    state: str | None = Field(
        default=None,
        description="what happens to it beyond its phase, one word of the states table "
        "(docs/states.md): stopping, squeezed, suspended, paused-by-priority, "
        "waiting-for-share, preempted, reclaimed; None: nothing",
    )
    state_text: str = Field(
        default="",
        description="the state as fgpu ls and the dashboard write it: the word, then its "
        "details ('preempted by NAME (restart n)')",
    )
    preempted_by: str | None = Field(
        default=None,
        description="pending again after preemption or reclaim, until it runs again: the "
        "id of the workload that took its place (None: not known, or not preempted)",
    )


class EventView(BaseModel):
    """Something that happened, with its reason."""

    id: int
    workload_id: str | None
    time: float
    kind: str
    reason: str
    message: str
    count: int = Field(
        default=1,
        description="how many like events (same workload and kind, close together) this one "
        "stands for: repeats within the service's coalescing interval add to it",
    )
    last_time: float | None = Field(
        default=None, description="when the last of them happened (seconds since the epoch)"
    )


class WorkloadDetail(WorkloadView):
    """``GET /v1/workloads/{id}``: the workload plus its events."""

    events: list[EventView]
    enforcement: list[str] = Field(
        default_factory=list,
        description="while it runs: how its grant is enforced now, one line per mechanism "
        "(interposer with its memory figures per GPU, governor state)",
    )


class QueueBody(_Strict):
    """``POST /v1/queues`` and ``PUT /v1/queues/{name}``: GPU amounts in GPUs (fractions
    allowed), like ``fgpu queue create team-a --quota 2``."""

    name: str = Field(
        description="an ASCII letter or digit, then letters, digits, '.', '_' or '-'",
        json_schema_extra=_QUEUE_NAME,
    )
    parent: str | None = Field(
        default=None, json_schema_extra={"minLength": 1, "maxLength": NAME_LENGTH}
    )
    quota: float = Field(
        default=0.0,
        description="GPUs",
        json_schema_extra={"minimum": 0, "maximum": MAX_QUOTA_GPUS},
    )
    limit: float | None = Field(
        default=None,
        description="GPUs (none: no limit), at least the quota",
        json_schema_extra={"minimum": 0, "maximum": MAX_QUOTA_GPUS},
    )
    over_quota_weight: float = Field(default=1.0, json_schema_extra={"minimum": 0})
    priority: int = Field(default=0, json_schema_extra={"minimum": 0, "maximum": MAX_AMOUNT})
    members: list[str] = Field(
        default_factory=list,
        max_length=MAX_MEMBERS,
        description="who may submit besides admins: user names or uids, '@group' (name or "
        "gid), '*' for everyone; empty: admins only",
        json_schema_extra={
            "uniqueItems": True,
            "items": {"type": "string", "pattern": anchored(MEMBER_PATTERN)},
        },
    )
    max_priority: int | str = Field(
        default="normal",
        description="highest workload priority non-admin members may use (number or class)",
        json_schema_extra={"minimum": 0, "maximum": MAX_PRIORITY},
    )
    nonpreemptible: StrictBool = Field(
        default=False, description="non-admin members may submit non-preemptible work"
    )
    squeeze: StrictBool | None = Field(
        default=None,
        description="squeeze before evict for preemption inside the queue: true, false "
        "(evict), or null (the service's setting, fgpu serve --squeeze/--no-squeeze)",
    )
    default_time: str | None = Field(
        default=None,
        description="time limit of its workloads submitted without one (Slurm forms, as "
        "SubmitRequest.time); null or 0: none",
        json_schema_extra={"maxLength": 64},
    )
    max_time: str | None = Field(
        default=None,
        description="the longest time limit its workloads may ask for (a longer one is "
        "refused at submission); null or 0: no maximum",
        json_schema_extra={"maxLength": 64},
    )
    default_for: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="whose default queue it is (submissions without a queue): user names or "
        "uids and '@group' entries; each at most one queue's default",
    )
    max_active_per_user: int | None = Field(
        default=None,
        description="most active (pending, running, paused) workloads one user may have in "
        "this queue; null: only the machine's limit (fgpu serve --max-active-per-user)",
        json_schema_extra={"minimum": 1, "maximum": MAX_AMOUNT},
    )
    max_running_per_user: int | None = Field(
        default=None,
        description="most workloads one user may have running at once in this queue (more "
        "wait pending); null: only the machine's limit (fgpu serve --max-running-per-user)",
        json_schema_extra={"minimum": 1, "maximum": MAX_AMOUNT},
    )
    max_stored_bytes: int | None = Field(
        default=None,
        description="most bytes of commands and environments one user's workloads of this "
        "queue may store (active and finished ones not yet pruned); null: only the "
        "machine's limit (fgpu serve --max-stored-bytes)",
        json_schema_extra={"minimum": MIN_STORED_BYTES, "maximum": MAX_AMOUNT},
    )
    max_output_bytes: int | None = Field(
        default=None,
        description="most bytes of output (logs) one user's workloads of this queue may keep "
        "(active and finished ones not yet pruned); past it their output is dropped, and "
        "their logs say so; null: only the machine's limit (fgpu serve --max-output-bytes)",
        json_schema_extra={"minimum": MIN_OUTPUT_BYTES, "maximum": MAX_AMOUNT},
    )
    preempt_delay_s: float | None = Field(
        default=None,
        description="wait before evict: seconds a preemptor below priority 100 waits for "
        "capacity to free by itself before it suspends or evicts work (0: at once), or null "
        "(the service's setting, fgpu serve --preempt-delay, 300 s unless set)",
        json_schema_extra={"minimum": 0, "maximum": 1e9},
    )


class QueueView(BaseModel):
    """A queue with its fair share and use (milli-GPU)."""

    name: str
    parent: str | None
    quota_milli: int
    limit_milli: int | None
    over_quota_weight: float
    priority: int
    allocated_milli: int
    fair_share_milli: int
    pending: int
    running: int
    members: list[str] = Field(default_factory=list)
    max_priority: int = 50
    nonpreemptible: bool = False
    squeeze: bool | None = None
    default_time_s: float | None = Field(
        default=None, description="time limit of its workloads without --time, seconds"
    )
    max_time_s: float | None = Field(
        default=None, description="the longest --time its workloads may ask for, seconds"
    )
    default_for: list[str] = Field(default_factory=list)
    max_active_per_user: int | None = None
    max_running_per_user: int | None = None
    max_stored_bytes: int | None = None
    max_output_bytes: int | None = None
    preempt_delay_s: float | None = Field(
        default=None, description="the queue's own wait before evict, seconds; null: the service's"
    )
    effective_preempt_delay_s: float | None = Field(
        default=None,
        description="the wait before evict that applies to the queue's preemptors below "
        "priority 100, seconds (its own, else the service's)",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="after a change: what is odd about the queue configuration as a whole "
        "(quotas above capacity, children's quotas above their parent's)",
    )
    hints: list[str] = Field(
        default_factory=list,
        description="after a change: what to do next (the default queue still holding every "
        "GPU for everyone beside the new queue)",
    )


class GpuHolder(BaseModel):
    """A workload's share of one GPU, and what the governor does with it (None where the
    GPU is not governed)."""

    workload_id: str
    name: str
    compute_milli: int
    memory_mib: int
    mode: str | None = Field(default=None, description="strict or fair")
    state: str | None = Field(
        default=None,
        description="the governor's state in the words of the states table: running, "
        "paused-by-priority or waiting-for-share",
    )
    owner_uid: int | None = Field(default=None, description="who submitted the workload")
    busy: bool | None = Field(default=None, description="counts as busy now")
    achieved_milli: int | None = Field(
        default=None,
        description="run time received while busy over the last minute, per mille",
    )
    enforcement: str | None = Field(
        default=None,
        description="how it is held: interposer (at kernel launch) or the freezer's kind",
    )
    used_memory_mib: int | None = Field(
        default=None,
        description="GPU memory its processes hold on this GPU (None: not measured)",
    )
    squeezed_by: list[str] | None = Field(
        default=None,
        description="ids of the workloads that squeezed it (its compute is theirs while they "
        "are busy); None: not squeezed",
    )


class MigInstanceView(BaseModel):
    """One MIG instance of a GPU and the workload on it (none when free)."""

    profile: str
    start: int
    uuid: str
    compute_milli: int
    memory_mib: int
    workload_id: str | None = None
    name: str | None = None
    in_use_outside: bool = Field(
        default=False, description="processes fgpu did not start run on it (the device says so)"
    )


class EnforcementLayer(BaseModel):
    """One enforcement mechanism of a GPU, whether it is active there, and why."""

    name: str = Field(
        description="interposer, mps-limits, freezer, memory-guard or mig; for a node's "
        "host_limits cpu-limit or memory-limit"
    )
    active: bool
    why: str


class GpuView(BaseModel):
    """One GPU, what it holds, and live figures when the backend has them. A GPU in MIG mode
    lists its instances in ``mig_instances``."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated_milli: int
    allocated_memory_mib: int
    holders: list[GpuHolder]
    used_memory_mib: int | None = None
    utilization_pct: int | None = None
    mig_enabled: bool = False
    mig_instances: list[MigInstanceView] = Field(default_factory=list)
    enforcement: list[EnforcementLayer] = Field(
        default_factory=list, description="strongest first (DESIGN.md section 7)"
    )


class NodeView(BaseModel):
    """``GET /v1/nodes``."""

    name: str
    backend: str
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuView]
    host_limits: list[EnforcementLayer] = Field(
        default_factory=list,
        description="whether a workload's cpu and memory are limits on this node "
        "(cpu-limit, memory-limit: cgroups), and why not where they cannot be enforced",
    )


class ErrorDetail(BaseModel):
    """The body of a 4xx answer: which field and why."""

    field: str
    reason: str


class ErrorResponse(BaseModel):
    """Every refusal: ``{"detail": {"field": ..., "reason": ...}}``."""

    detail: ErrorDetail


class Health(BaseModel):
    """``GET /v1/healthz``: the server answers, and who it thinks the caller is."""

    status: str = "ok"
    version: str
    server_uid: int
    caller_uid: int | None = Field(
        None, description="the caller's uid from peer credentials (Unix socket only)"
    )
    caller_admin: bool | None = Field(
        None, description="whether that caller is an admin (Unix socket only)"
    )
