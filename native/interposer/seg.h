/*
 * seg.h - the segment logic shared by libfgpu.so (the interposer) and libfgpu-agent.so.
 *
 * Owns: checking and mapping a segment file, process identity (pid + start time), claiming a
 * procs[] entry, reserving and giving back memory on the shared per-GPU counters, and the
 * sweep that reclaims the entries of dead processes. One copy of this code (seg.c) is
 * compiled into both libraries, so the agent and every interposer follow the same rules.
 *
 * Every function here is async-signal-safe enough for the interposer's needs: no malloc, no
 * stdio (only open/read/close/stat/readlink under /proc), atomics only on shared fields.
 */
#ifndef FGPU_SEG_IMPL_H
#define FGPU_SEG_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fgpu_seg.h"

#define FGPU_HIDDEN __attribute__((visibility("hidden")))

/* Check a mapped workload part of mapped_size bytes. Returns 0, or -1 with a reason in why. */
FGPU_HIDDEN int fgpu_seg_check(const struct fgpu_seg *s, size_t mapped_size, char *why,
                               size_t why_len);

/* Check a mapped control part of mapped_size bytes. Returns 0, or -1 with a reason in why. */
FGPU_HIDDEN int fgpu_seg_ctl_check(const struct fgpu_seg_ctl *c, size_t mapped_size, char *why,
                                   size_t why_len);

/* Map the workload part (the file path) read-write. Returns the mapping, or NULL with a
 * reason in why (which names the path, and the errno text or the field that does not match). */
FGPU_HIDDEN struct fgpu_seg *fgpu_seg_map(const char *path, char *why, size_t why_len);

/* Map the control part of the segment path (path + FGPU_SEG_CTL_SUFFIX): read-only
 * (O_RDONLY, PROT_READ: the interposer) unless writable (the agent). Returns the mapping, or
 * NULL with a reason in why. The interposer's mapping cannot be made writable: the file is
 * not the workload's. */
FGPU_HIDDEN struct fgpu_seg_ctl *fgpu_seg_ctl_map(const char *path, int writable, char *why,
                                                  size_t why_len);

/* The control part's file name of segment path into out (out_len bytes); -1 if too long. */
FGPU_HIDDEN int fgpu_seg_ctl_path(const char *path, char *out, size_t out_len);

/* Unmap a segment mapped by fgpu_seg_map / fgpu_seg_ctl_map (NULL: nothing). */
FGPU_HIDDEN void fgpu_seg_unmap(struct fgpu_seg *s);
FGPU_HIDDEN void fgpu_seg_ctl_unmap(const struct fgpu_seg_ctl *c);

/* A pid namespace: st_dev and st_ino of its nsfs file (/proc/<pid>/ns/pid). Both 0: not
 * known (no procfs, or a kernel without namespace files). */
struct fgpu_pidns {
    uint64_t dev;
    uint64_t ino;
};

/* The inode of the initial (host) pid namespace, PROC_PID_INIT_INO in the kernel's
 * include/linux/proc_ns.h (fixed since Linux 3.8). */
#define FGPU_PIDNS_INIT_INO 0xEFFFFFFCu

/* The calling process's pid namespace (stat of /proc/self/ns/pid); {0, 0} if unreadable. */
FGPU_HIDDEN struct fgpu_pidns fgpu_pidns_self(void);

/* Whether /proc is the procfs of the caller's own pid namespace (/proc/self names getpid()):
 * only then do the numbers under /proc mean what the caller's pids mean. */
FGPU_HIDDEN int fgpu_procfs_is_own(void);

/* Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), 0 if the process
 * does not exist, is a zombie, or the file cannot be read. */
FGPU_HIDDEN uint64_t fgpu_proc_start_ticks(pid_t pid);

/* The caller's own start time, from /proc/self/stat (right even where /proc belongs to
 * another pid namespace); 0 if unreadable. */
FGPU_HIDDEN uint64_t fgpu_proc_self_start_ticks(void);

/* Claim a procs[] entry for the process (pid, start_ticks) of pid namespace ns. An entry
 * that already carries the same three belongs to this process's previous image (exec): its
 * reservations are given back and the entry is reused. Sweeps dead processes once when no
 * entry is free. Returns the entry index, or -1 when the table is full of live processes. */
FGPU_HIDDEN int fgpu_seg_claim(struct fgpu_seg *s, pid_t pid, uint64_t start_ticks,
                               struct fgpu_pidns ns);

/* If an entry carries (pid, start_ticks, ns), give back its reservations (the process's
 * previous image before exec) and keep it for the process. Returns the bytes given back. */
FGPU_HIDDEN uint64_t fgpu_seg_reclaim_own(struct fgpu_seg *s, pid_t pid, uint64_t start_ticks,
                                          struct fgpu_pidns ns);

/* Give back every reservation of entry p and free it (p must be owned by the caller). */
FGPU_HIDDEN uint64_t fgpu_seg_release(struct fgpu_seg *s, int p);

/* Reserve bytes on GPU g for entry p. Returns 0, or -1 when the control part caps memory and
 * memory_reserved + bytes would pass its memory_limit (nothing is changed then). */
FGPU_HIDDEN int fgpu_seg_reserve(struct fgpu_seg *s, const struct fgpu_seg_ctl *c, int p,
                                 uint32_t g, uint64_t bytes);

/* Give back bytes reserved by entry p on GPU g (never below zero). */
FGPU_HIDDEN void fgpu_seg_unreserve(struct fgpu_seg *s, int p, uint32_t g, uint64_t bytes);

/* Reclaim every entry of the caller's own pid namespace whose process is gone (or was
 * replaced by a new one with the same pid). Entries of other pid namespaces are never judged
 * here: their pids mean other processes (fgpu_agent_sweep judges them from the host's
 * namespace). Returns the bytes given back, summed over GPUs. Safe to run concurrently from
 * any number of processes: each dead entry is reclaimed exactly once (CAS pid -> -1). */
FGPU_HIDDEN uint64_t fgpu_seg_sweep(struct fgpu_seg *s);

/* Reclaim entry p if it still names the process (pid, start_ticks, ns) the caller judged
 * dead: CAS pid -> -1, then the start time and namespace are checked again (the entry may
 * have been freed and claimed anew by a process with the same pid in between; then it is
 * put back untouched). Returns the bytes given back (0: not taken). */
FGPU_HIDDEN uint64_t fgpu_seg_reclaim_dead(struct fgpu_seg *s, int p, int32_t pid,
                                           uint64_t start_ticks, struct fgpu_pidns ns);

/* Index of the GPU whose uuid equals uuid, or -1. */
FGPU_HIDDEN int fgpu_seg_find_gpu(const struct fgpu_seg_ctl *c, const char *uuid);

#endif /* FGPU_SEG_IMPL_H */
