/*
 * graph.h - fake driver (a STAND-IN for tests, see fake.h): the graph objects shared by
 * graphs.c (nodes, instantiate, launch), graph_nodes.c (cuGraphAddNode, the instantiate
 * variants, upload, node queries) and capture.c (stream capture).
 */
#ifndef FGPU_FAKE_GRAPH_H
#define FGPU_FAKE_GRAPH_H

#include "fake.h"

enum { FK_N_KERNEL = 1, FK_N_ALLOC, FK_N_FREE, FK_N_EMPTY, FK_N_CHILD };

struct fk_node {
    uint32_t magic;
    int kind;
    uint64_t ns; /* kernel: duration, read from kernelParams when added */
    int gpu;     /* alloc: global index */
    int dev;     /* alloc: the visible ordinal asked for */
    uint64_t bytes;
    uint64_t dptr; /* alloc and free */
    struct fk_graph *child; /* a child graph moved into its parent (owned by this node) */
};

struct fk_graph {
    uint32_t magic;
    size_t n, cap;
    struct fk_node **nodes;
};

struct fk_exec {
    uint32_t magic;
    size_t n;
    struct fk_node *nodes; /* copies taken at instantiation */
};

/* Add a node made from proto to graph hg after its dependencies (graphs.c). */
CUresult fk_graph_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                      const struct fk_node *proto);
/* Grow the graph memory pool so the exec's alloc nodes fit (cuGraphUpload; graphs.c). */
CUresult fk_graph_upload(struct fk_exec *x);

/* capture.c: the graph a stream is being captured into (NULL: not capturing). Kernel and
 * copy operations enqueued on such a stream become nodes (streams.c), as do stream-ordered
 * allocations and frees (memory.c). */
struct fk_graph *fk_stream_capture(struct fk_stream *s);
void fk_stream_set_capture(struct fk_stream *s, struct fk_graph *g);

#endif /* FGPU_FAKE_GRAPH_H */
