/*
 * fgpu_seg.h - the shared-memory segment between the fgpu agent and the interposer.
 *
 * One segment per workload, in two files (normally under /run/fgpu), named to the
 * workload's processes by FGPU_SEG=<path>:
 *
 *   <path>      struct fgpu_seg: the workload's own counters. Owner: the workload's user,
 *               mode 0600 (one user cannot touch another's). Mapped read-write by every
 *               process of the workload and by the agent.
 *   <path>.ctl  struct fgpu_seg_ctl: the agent's decisions (flags, caps, gate, bound on
 *               launches in flight, heartbeat). Owner: the agent's user (root or the
 *               service's), mode 0644: the workload opens it O_RDONLY and maps it
 *               PROT_READ; opening it for writing, or mprotect to PROT_WRITE of that
 *               mapping, fails for lack of permission on the file, whatever the workload
 *               does in its own address space (issue 27: a workload rewrote its gate,
 *               heartbeat and memory limit when both halves were one file it owned).
 *
 * The agent creates both before launch and maps them for as long as the workload runs;
 * every process of the workload maps both when the interposer first needs them.
 *
 * Who writes what:
 *   agent       : all of fgpu_seg_ctl; the header of fgpu_seg at creation; reclaims procs[]
 *                 of dead processes (fgpu_agent_sweep: its own pid namespace, and every
 *                 other one when it runs in the host's).
 *   interposers : procs[] (claim an entry, reserve/give back bytes, inflight, waiting),
 *                 gpus[].memory_reserved, gpu_time_ns, oom_*, last_launch_ns, launches.
 *
 * What the workload writes is its own account and is not trusted by the agent: a process
 * that lowers memory_reserved or gpu_time_ns, or stops using the interposer, is caught by
 * what the driver says of it (the memory guard reads per-process memory, the governor
 * per-process GPU time while the gate is closed; NVML on real GPUs).
 *
 * Layout rules: fixed-size, naturally aligned fields, C11 atomics (lock-free on every
 * supported target: 32- and 64-bit; only plain loads on the read-only control page). Bump
 * FGPU_SEG_VERSION on any change; both sides refuse a segment whose magic, version or size
 * differ from theirs. The Python mirror of the constants is fgpu/agent/interposer/segment.py.
 */
#ifndef FGPU_SEG_H
#define FGPU_SEG_H

#include <stdatomic.h>
#include <stdint.h>

#define FGPU_SEG_MAGIC 0x55504746u /* "FGPU" read as little-endian bytes */
#define FGPU_SEG_VERSION 3u /* 2: procs[].pidns_dev / pidns_ino; 3: agent part in .ctl */
#define FGPU_SEG_CTL_MAGIC 0x4c544346u /* "FCTL" */
#define FGPU_SEG_CTL_SUFFIX ".ctl"
#define FGPU_SEG_MAX_GPUS 16
#define FGPU_SEG_MAX_PROCS 128
#define FGPU_SEG_ID_LEN 64
#define FGPU_SEG_UUID_LEN 96

/* 1.5 s: the agent beats every few ms, and a workload held at the gate must resume within
 * 2 s of the agent's death (issue 27): staleness, plus up to one 100 ms wait on the gate
 * word, plus the beat interval, leaves about 0.4 s of margin. */
#define FGPU_SEG_STALE_NS 1500000000ull

/* gate values */
#define FGPU_GATE_OPEN 0u
#define FGPU_GATE_CLOSED 1u

/* flags (set by the agent at creation) */
#define FGPU_SEG_MEMORY_CAP 0x1u /* refuse allocations over gpus[].memory_limit */
#define FGPU_SEG_GATING 0x2u     /* hold launches while the gate is closed */

/* One GPU of the workload, in CUDA_VISIBLE_DEVICES order: the agent's part (read-only to
 * the workload). */
struct fgpu_seg_ctl_gpu {
    char uuid[FGPU_SEG_UUID_LEN];      /* "GPU-..." or "MIG-...", NUL-terminated */
    _Atomic uint64_t memory_limit;     /* bytes; 0 = no cap on this GPU */
};

/* One GPU of the workload, same order: the workload's counters. */
struct fgpu_seg_gpu {
    _Atomic uint64_t memory_reserved;  /* bytes reserved now by all processes */
    _Atomic uint64_t memory_peak;      /* highest memory_reserved seen */
    _Atomic uint64_t gpu_time_ns;      /* device time of completed gated work */
    _Atomic uint64_t oom_count;        /* allocations refused by the cap */
    _Atomic uint64_t oom_last_bytes;   /* size of the last refused allocation */
};

/* One process of the workload that has used the driver through the interposer.
 * A process is named by (pid, start_ticks, pidns): the pid is a number in the owner's pid
 * namespace (containers of one pod sharing a claim each have their own), so only a process
 * of the same namespace may judge it by that pid. */
struct fgpu_seg_proc {
    _Atomic int32_t pid;          /* 0: free; > 0: owner; -1: being claimed or reclaimed */
    uint32_t pad0;
    _Atomic uint64_t start_ticks; /* field 22 of /proc/<pid>/stat: guards against pid reuse */
    _Atomic uint64_t pidns_dev;   /* st_dev and st_ino of the owner's /proc/self/ns/pid */
    _Atomic uint64_t pidns_ino;   /* (both 0: the owner could not name its namespace) */
    _Atomic uint64_t reserved[FGPU_SEG_MAX_GPUS]; /* bytes this process holds, per GPU */
    _Atomic uint32_t inflight;    /* gated operations issued and not yet seen complete */
    _Atomic uint32_t waiting;     /* threads of this process held at the gate now */
};

/* The agent's part (<path>.ctl): written only by the agent, mapped read-only by workloads. */
struct fgpu_seg_ctl {
    uint32_t magic;                  /* FGPU_SEG_CTL_MAGIC */
    uint32_t version;                /* FGPU_SEG_VERSION */
    uint32_t size;                   /* sizeof(struct fgpu_seg_ctl) */
    uint32_t ngpus;                  /* entries used in gpus[] */
    uint32_t flags;                  /* FGPU_SEG_MEMORY_CAP | FGPU_SEG_GATING */
    uint32_t pad0;
    char workload_id[FGPU_SEG_ID_LEN];
    _Atomic uint32_t gate;           /* FGPU_GATE_OPEN / CLOSED; a futex word */
    _Atomic uint32_t max_inflight;   /* per process; 0 = unbounded */
    _Atomic uint64_t agent_beat_ns;  /* CLOCK_MONOTONIC ns of the agent's last heartbeat;
                                        a gate closed by an agent silent for more than
                                        FGPU_SEG_STALE_NS counts as open (a dead agent
                                        never leaves a workload held) */
    struct fgpu_seg_ctl_gpu gpus[FGPU_SEG_MAX_GPUS];
};

/* The workload's part (<path>): its processes' reservations and counters. */
struct fgpu_seg {
    uint32_t magic;                  /* FGPU_SEG_MAGIC */
    uint32_t version;                /* FGPU_SEG_VERSION */
    uint32_t size;                   /* sizeof(struct fgpu_seg) */
    uint32_t ngpus;                  /* a copy of the control page's (never trusted) */
    _Atomic uint64_t last_launch_ns; /* CLOCK_MONOTONIC ns of the latest gated call */
    _Atomic uint64_t launches;       /* gated calls that went to the driver */
    _Atomic uint64_t gate_waits;     /* gated calls that had to wait at the gate */
    _Atomic uint64_t processes;      /* processes that ever claimed an entry */
    struct fgpu_seg_gpu gpus[FGPU_SEG_MAX_GPUS];
    struct fgpu_seg_proc procs[FGPU_SEG_MAX_PROCS];
};

#endif /* FGPU_SEG_H */
