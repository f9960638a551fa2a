/*
 * devlock.c - fake driver (a STAND-IN for tests, see fake.h): the cross-process device lock
 * (one kernel, copy or memset at a time per device across processes, in arrival order; a
 * holder or waiter killed with -9 is detected by pid and start time and moved aside; one
 * stopped or frozen by a freezer is passed over, as a real GPU runs a frozen process's kernel
 * to its end and goes on with the others' - its own thread cannot, here) and
 * the busy-time counters and samples that device time and NVML utilization are read from.
 * Compiled into both fake libraries.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

/* ------------------------------------------------------------------ the device lock */

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

static void wake_all(struct fk_gpu *d)
{
    atomic_fetch_add_explicit(&d->wake, 1, memory_order_release);
    futex(&d->wake, FUTEX_WAKE, INT32_MAX, NULL);
}

/* The earliest arrival among the waiters (-1 if none). */
static int first_waiter(struct fk_gpu *d)
{
    int best = -1;
    uint64_t best_seq = UINT64_MAX;
    for (int i = 0; i < FK_MAX_WAITERS; i++) {
        uint64_t seq = atomic_load_explicit(&d->waiters[i].seq, memory_order_acquire);
        if (seq != 0 && seq < best_seq) {
            best = i;
            best_seq = seq;
        }
    }
    return best;
}

static void drop_waiter(struct fk_gpu *d, int i)
{
    atomic_store_explicit(&d->waiters[i].seq, 0, memory_order_release);
    atomic_store_explicit(&d->waiters[i].pid, 0, memory_order_release);
}

/* After a wait that saw no progress (1 ms; idle such waits in a row): a dead holder or dead
 * first waiter is moved aside. A stopped holder loses the lock (its slot stays claimed until
 * its own unlock; the operation ends when it sees the lock gone, charging nothing more), a
 * stopped first waiter is parked: behind every waiter that is not (FK_PARKED), until its own
 * thread runs again and queues anew at the back (fk_dev_lock). A real GPU goes on with the
 * others' work while a process is frozen; a stopped waiter sent only to the back would be
 * ahead of every later arrival again, and each of them would wait for this check (1 ms per
 * operation per stopped waiter). Stopped by a signal is seen at once; in a frozen cgroup,
 * every 5 ms (it takes two more file reads). */
static void clear_dead(struct fk_gpu *d, unsigned idle)
{
    int cgroup = idle % 5 == 0;
    uint32_t h = atomic_load(&d->holder);
    if (h != 0) {
        struct fk_waiter *w = &d->waiters[h - 1];
        int32_t pid = atomic_load(&w->pid);
        if (!fk_alive(pid, atomic_load(&w->start))) {
            if (atomic_compare_exchange_strong(&d->holder, &h, 0)) {
                fk_debug("device %s: holder %d died, lock taken back", d->uuid, (int)pid);
                drop_waiter(d, (int)h - 1);
                wake_all(d);
            }
        } else if (fk_stopped(pid, cgroup) && atomic_compare_exchange_strong(&d->holder, &h, 0)) {
            fk_debug("device %s: holder %d is stopped, lock passed on", d->uuid, (int)pid);
            atomic_store_explicit(&w->seq, 0, memory_order_release);
            wake_all(d);
        }
        return;
    }
    int first = first_waiter(d);
    if (first >= 0) {
        struct fk_waiter *w = &d->waiters[first];
        int32_t pid = atomic_load(&w->pid);
        if (!fk_alive(pid, atomic_load(&w->start))) {
            drop_waiter(d, first);
            wake_all(d);
        } else if (fk_stopped(pid, cgroup)) {
            uint64_t seq = FK_PARKED + atomic_fetch_add(&d->arrivals, 1) + 1;
            atomic_store_explicit(&w->seq, seq, memory_order_release);
            wake_all(d);
        }
    }
}

int fk_dev_held(int gpu, int waiter)
{
    return atomic_load(&fk_sh->gpus[gpu].holder) == (uint32_t)waiter + 1;
}

void fk_dev_lock(int gpu, int *waiter_out)
{
    gpu = fk_phys(gpu);
    struct fk_gpu *d = &fk_sh->gpus[gpu];
    int32_t me = (int32_t)getpid();
    int mine = -1;
    while (mine < 0) {
        for (int i = 0; i < FK_MAX_WAITERS && mine < 0; i++) {
            int32_t expect = 0;
            if (atomic_compare_exchange_strong(&d->waiters[i].pid, &expect, me))
                mine = i;
        }
        if (mine < 0) { /* every slot taken: wait for one to free */
            fk_sweep();
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    struct fk_waiter *w = &d->waiters[mine];
    atomic_store(&w->start, fk_self_start());
    uint64_t seq = atomic_fetch_add(&d->arrivals, 1) + 1;
    atomic_store_explicit(&w->seq, seq, memory_order_release);
    unsigned idle = 0;
    for (;;) {
        uint32_t wake = atomic_load_explicit(&d->wake, memory_order_acquire);
        if (atomic_load(&d->holder) == 0 && first_waiter(d) == mine) {
            uint32_t expect = 0;
            if (atomic_compare_exchange_strong(&d->holder, &expect, (uint32_t)mine + 1))
                break;
            continue;
        }
        struct timespec ts = {0, 1000000}; /* 1 ms, then look for a dead or stopped holder */
        long rc = futex(&d->wake, FUTEX_WAIT, wake, &ts);
        if (rc != 0 && errno == ETIMEDOUT)
            clear_dead(d, ++idle);
        else
            idle = 0;
        /* parked while this process was stopped: running again, it queues at the back */
        if (atomic_load_explicit(&w->seq, memory_order_acquire) > FK_PARKED) {
            seq = atomic_fetch_add(&d->arrivals, 1) + 1;
            atomic_store_explicit(&w->seq, seq, memory_order_release);
        }
    }
    *waiter_out = mine;
}

void fk_dev_unlock(int gpu, int waiter)
{
    gpu = fk_phys(gpu);
    struct fk_gpu *d = &fk_sh->gpus[gpu];
    atomic_store_explicit(&d->waiters[waiter].seq, 0, memory_order_release);
    uint32_t expect = (uint32_t)waiter + 1;
    atomic_compare_exchange_strong(&d->holder, &expect, 0);
    atomic_store_explicit(&d->waiters[waiter].pid, 0, memory_order_release);
    wake_all(d);
}

/* ------------------------------------------------------------------ busy time */

static void ring_note(struct fk_ring *r, uint64_t now, uint64_t busy_before, uint64_t busy_after)
{
    uint32_t n = atomic_load_explicit(&r->count, memory_order_relaxed);
    if (n == 0) { /* the first sample marks when activity began */
        atomic_store(&r->s[0].t_ns, now);
        atomic_store(&r->s[0].busy_ns, busy_before);
        atomic_store_explicit(&r->count, 1, memory_order_release);
        return;
    }
    uint64_t last = atomic_load(&r->s[(n - 1) % FK_RING].t_ns);
    if (now - last < FK_RING_STEP_NS)
        return;
    struct fk_sample *s = &r->s[n % FK_RING];
    atomic_store(&s->t_ns, now);
    atomic_store(&s->busy_ns, busy_after);
    atomic_store_explicit(&r->count, n + 1, memory_order_release);
}

void fk_dev_busy(int gpu, int slot, uint64_t ns)
{
    gpu = fk_phys(gpu);
    uint64_t now = fk_now_ns();
    struct fk_gpu *d = &fk_sh->gpus[gpu];
    uint64_t before = atomic_fetch_add(&d->busy_ns, ns);
    ring_note(&d->ring, now - ns, before, before);
    ring_note(&d->ring, now, before, before + ns);
    if (slot >= 0) {
        struct fk_proc *p = &fk_sh->procs[slot];
        uint64_t pb = atomic_fetch_add(&p->busy_ns[gpu], ns);
        ring_note(&p->ring[gpu], now - ns, pb, pb);
        ring_note(&p->ring[gpu], now, pb, pb + ns);
        atomic_store(&p->last_active_ns[gpu], now);
    }
}

/* Busy time in [from_ns, now_ns], reading the samples as a piecewise-linear curve of
 * cumulative busy time ending at (now_ns, busy_now). *window_start_ns gets from_ns, or the
 * oldest sample's time when older samples were overwritten. */
uint64_t fk_ring_since(const struct fk_ring *ring, uint64_t busy_now, uint64_t now_ns,
                       uint64_t from_ns, uint64_t *window_start_ns)
{
    *window_start_ns = from_ns;
    uint32_t n = atomic_load_explicit(&ring->count, memory_order_acquire);
    if (n == 0)
        return 0;
    uint32_t oldest = n > FK_RING ? n - FK_RING : 0;
    uint64_t t0 = atomic_load(&ring->s[oldest % FK_RING].t_ns);
    uint64_t b0 = atomic_load(&ring->s[oldest % FK_RING].busy_ns);
    if (from_ns <= t0) {
        if (oldest > 0)
            *window_start_ns = t0;
        return busy_now > b0 ? busy_now - b0 : 0;
    }
    for (uint32_t i = n; i-- > oldest;) {
        uint64_t ti = atomic_load(&ring->s[i % FK_RING].t_ns);
        if (ti > from_ns)
            continue;
        uint64_t bi = atomic_load(&ring->s[i % FK_RING].busy_ns);
        uint64_t t1 = now_ns, b1 = busy_now;
        if (i + 1 < n) {
            t1 = atomic_load(&ring->s[(i + 1) % FK_RING].t_ns);
            b1 = atomic_load(&ring->s[(i + 1) % FK_RING].busy_ns);
        }
        double cum = (double)bi;
        if (t1 > ti && b1 > bi)
            cum += (double)(b1 - bi) * (double)(from_ns - ti) / (double)(t1 - ti);
        return (double)busy_now > cum ? (uint64_t)((double)busy_now - cum) : 0;
    }
    return 0;
}
