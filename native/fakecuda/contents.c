/*
 * contents.c - fake driver (a STAND-IN for tests, see fake.h): what device memory holds.
 * An allocation of the cuMemAlloc family (plain, pitch, managed, stream-ordered) gets a host
 * backing on its first write (cuMemcpyHtoD, cuMemsetD8 with a value other than 0, and their
 * async forms, which copy when called); never-written memory reads as zeros. Memory of other
 * kinds (VMM mappings, arrays, IPC imports, graph nodes) has no contents: copies to and from
 * it only take time, as before. At checkpoint (checkpoint.c) the backings are written to the
 * checkpoint file and freed; at restore they are read back.
 *
 * Checkpoint file: records of {uint64 dptr, uint64 bytes} followed by `bytes` bytes, one per
 * backed allocation, ending with a record whose dptr is 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake.h"

static int has_contents(const struct fk_alloc *a)
{
    return a->kind == FK_A_MEM || a->kind == FK_A_PITCH || a->kind == FK_A_MANAGED ||
           a->kind == FK_A_ASYNC || a->kind == FK_A_POOL;
}

/* The allocation holding [dptr, dptr + n), or NULL (not contents-backed memory, or the range
 * crosses its end). Caller: fk_g.lock. */
static struct fk_alloc *containing(uint64_t dptr, uint64_t n)
{
    struct fk_alloc *a = fk_alloc_find(dptr);
    if (a == NULL)
        a = fk_alloc_containing(dptr); /* an interior pointer */
    if (a == NULL || !has_contents(a) || dptr - a->dptr > a->bytes ||
        n > a->bytes - (dptr - a->dptr))
        return NULL;
    return a;
}

static int ensure_backing(struct fk_alloc *a)
{
    if (a->data != NULL)
        return 0;
    void *m = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return -1;
    a->data = m;
    return 0;
}

void fk_contents_free(struct fk_alloc *a)
{
    if (a->data != NULL)
        munmap(a->data, a->bytes);
    a->data = NULL;
}

/* Copies happen under fk_g.lock, after the checkpoint gate: a checkpoint (which takes the
 * same lock) never sees half a copy, and a copy never touches a backing it freed. */
static struct fk_alloc *enter(uint64_t dptr, uint64_t n)
{
    for (;;) {
        fk_ck_gate();
        pthread_mutex_lock(&fk_g.lock);
        int slot = fk_my_slot();
        if (slot < 0 || atomic_load(&fk_sh->procs[slot].ck_state) == CU_PROCESS_STATE_RUNNING)
            return containing(dptr, n);
        pthread_mutex_unlock(&fk_g.lock); /* locked meanwhile: wait again */
    }
}

CUresult fk_contents_write(uint64_t dptr, const void *src, uint64_t n)
{
    struct fk_alloc *a = enter(dptr, n);
    CUresult rc = CUDA_SUCCESS;
    if (a != NULL && n != 0) {
        if (ensure_backing(a) != 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            memcpy(a->data + (dptr - a->dptr), src, n);
    }
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

CUresult fk_contents_read(void *dst, uint64_t dptr, uint64_t n)
{
    struct fk_alloc *a = enter(dptr, n);
    if (a != NULL && n != 0) {
        if (a->data != NULL)
            memcpy(dst, a->data + (dptr - a->dptr), n);
        else
            memset(dst, 0, n);
    }
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}

CUresult fk_contents_set(uint64_t dptr, unsigned char value, uint64_t n)
{
    struct fk_alloc *a = enter(dptr, n);
    CUresult rc = CUDA_SUCCESS;
    if (a != NULL && n != 0 && (a->data != NULL || value != 0)) {
        if (ensure_backing(a) != 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            memset(a->data + (dptr - a->dptr), value, n);
    }
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

/* ------------------------------------------------------------------ checkpoint file */

static int write_all(int fd, const void *buf, uint64_t n)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (uint64_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, uint64_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EIO; /* the file ends early */
            return -1;
        }
        p += r;
        n -= (uint64_t)r;
    }
    return 0;
}

struct save_ctx {
    int fd;
    int rc;
};

static void save_one(struct fk_alloc *a, void *arg)
{
    struct save_ctx *c = arg;
    if (c->rc != 0 || a->data == NULL)
        return;
    uint64_t head[2] = {a->dptr, a->bytes};
    if (write_all(c->fd, head, sizeof head) != 0 || write_all(c->fd, a->data, a->bytes) != 0)
        c->rc = -1;
}

static void free_one(struct fk_alloc *a, void *arg)
{
    (void)arg;
    fk_contents_free(a);
}

int fk_contents_save(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    struct save_ctx c = {fd, 0};
    fk_alloc_each(save_one, &c);
    uint64_t end[2] = {0, 0};
    if (c.rc == 0 && write_all(fd, end, sizeof end) != 0)
        c.rc = -1;
    int saved_errno = errno;
    if (close(fd) != 0 && c.rc == 0)
        c.rc = -1;
    if (c.rc != 0) {
        unlink(path);
        errno = saved_errno;
        return -1;
    }
    fk_alloc_each(free_one, NULL); /* the contents live in the file now */
    return 0;
}

int fk_contents_load(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = 0;
    for (;;) {
        uint64_t head[2];
        if (read_all(fd, head, sizeof head) != 0) {
            rc = -1;
            break;
        }
        if (head[0] == 0)
            break;
        struct fk_alloc *a = fk_alloc_find(head[0]);
        if (a == NULL || a->bytes != head[1] || ensure_backing(a) != 0 ||
            read_all(fd, a->data, a->bytes) != 0) {
            if (errno == 0)
                errno = EIO;
            rc = -1;
            break;
        }
    }
    close(fd);
    return rc;
}
