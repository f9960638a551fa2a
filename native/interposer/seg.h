/*
 * seg.h - the segment logic shared by libfgpu.so (the interposer) and libfgpu-agent.so.
 *
 * Owns: checking and mapping a segment file, process identity (pid + start time), claiming a
 * procs[] entry, reserving and giving back memory on the shared per-GPU counters, and the
 * sweep that reclaims the entries of dead processes. One copy of this code (seg.c) is
 * compiled into both libraries, so the agent and every interposer follow the same rules.
 *
 * Every function here is async-signal-safe enough for the interposer's needs: no malloc, no
 * stdio (only open/read/close of /proc/<pid>/stat), atomics only on shared fields.
 */
#ifndef FGPU_SEG_IMPL_H
#define FGPU_SEG_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fgpu_seg.h"

#define FGPU_HIDDEN __attribute__((visibility("hidden")))

/* Check a mapped segment of mapped_size bytes. Returns 0, or -1 with a reason in why. */
FGPU_HIDDEN int fgpu_seg_check(const struct fgpu_seg *s, size_t mapped_size, char *why,
                               size_t why_len);

/* Map a segment file read-write. Returns the mapping, or NULL with a reason in why
 * (which names the path, and the errno text or the field that does not match). */
FGPU_HIDDEN struct fgpu_seg *fgpu_seg_map(const char *path, char *why, size_t why_len);

/* Unmap a segment mapped by fgpu_seg_map. */
FGPU_HIDDEN void fgpu_seg_unmap(struct fgpu_seg *s);

/* Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), 0 if the process
 * does not exist, is a zombie, or the file cannot be read. */
FGPU_HIDDEN uint64_t fgpu_proc_start_ticks(pid_t pid);

/* Claim a procs[] entry for (pid, start_ticks). An entry that already carries the same pid
 * and start time belongs to this process's previous image (exec): its reservations are
 * given back and the entry is reused. Sweeps dead processes once when no entry is free.
 * Returns the entry index, or -1 when the table is full of live processes. */
FGPU_HIDDEN int fgpu_seg_claim(struct fgpu_seg *s, pid_t pid, uint64_t start_ticks);

/* If an entry carries (pid, start_ticks), give back its reservations (the process's previous
 * image before exec) and keep it for the process. Returns the bytes given back. */
FGPU_HIDDEN uint64_t fgpu_seg_reclaim_own(struct fgpu_seg *s, pid_t pid, uint64_t start_ticks);

/* Give back every reservation of entry p and free it (p must be owned by the caller). */
FGPU_HIDDEN uint64_t fgpu_seg_release(struct fgpu_seg *s, int p);

/* Reserve bytes on GPU g for entry p. Returns 0, or -1 when the segment caps memory and
 * memory_reserved + bytes would pass memory_limit (nothing is changed then). */
FGPU_HIDDEN int fgpu_seg_reserve(struct fgpu_seg *s, int p, uint32_t g, uint64_t bytes);

/* Give back bytes reserved by entry p on GPU g (never below zero). */
FGPU_HIDDEN void fgpu_seg_unreserve(struct fgpu_seg *s, int p, uint32_t g, uint64_t bytes);

/* Reclaim every entry whose process is gone (or was replaced by a new one with the same
 * pid). Returns the bytes given back, summed over GPUs. Safe to run concurrently from any
 * number of processes: each dead entry is reclaimed exactly once (CAS pid -> -1). */
FGPU_HIDDEN uint64_t fgpu_seg_sweep(struct fgpu_seg *s);

/* Index of the GPU whose uuid equals uuid, or -1. */
FGPU_HIDDEN int fgpu_seg_find_gpu(const struct fgpu_seg *s, const char *uuid);

#endif /* FGPU_SEG_IMPL_H */
