/* kd_launch_ctx.h - each thread's launch context (Note [Per-thread launch
 * context], kd_launch_ctx.c). */
#ifndef KD_LAUNCH_CTX_H
#define KD_LAUNCH_CTX_H

#include <Python.h>

#include "kd_record.h"

typedef struct kd_launch_ctx {
    int busy;             /* inside kd_launch_begin / kd_launch_end */
    kd_payload *build;    /* [KD_BUILD_SLOTS] the launch being described */
    PyObject **released;  /* [KD_BUILD_SLOTS] references to drop after a ring stretch */
    /* kd_launch_record (Note [Records made in one pass]), for its at most
     * KD_RECORD_ARGS arguments: each one's metadata as described, and where
     * its hash payload lies in build (0: none) */
    struct kd_tensor_meta *metas;
    uint32_t *hash_at;
} kd_launch_ctx;

#define KD_RECORD_ARGS 128

/* This thread's context, or NULL before its first recorded launch. */
extern _Thread_local kd_launch_ctx *kd_tls_launch_ctx;

/* This thread's launch context, allocated on its first use; NULL when out of
 * memory (the caller counts the launch as unrecorded). */
kd_launch_ctx *kd_launch_ctx_get(void);

#endif
