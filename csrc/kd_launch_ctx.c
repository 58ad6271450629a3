/* kd_launch_ctx.c - each thread's launch context: where a launch is
 * described before it goes into the ring. */
#include <pthread.h>
#include <stdlib.h>

#include "kd_launch_ctx.h"
#include "kd_recorder.h" /* KD_BUILD_SLOTS */
#include "kd_shim.h"     /* kd_tensor_meta */

/* Note [Per-thread launch context]
 * A launch is described in a buffer of its own thread (kd_launch_ctx), not in
 * one the recorder shares between threads: Python code runs in the middle of
 * describing a launch (custom and slow hashers, output clones), and a hasher
 * that releases the GIL lets another thread's launch in.  The rules:
 *  - Python callbacks write only into this thread's context, never into ring
 *    slots.  Before the launch they fill the build buffer, which is copied
 *    into the ring after they are done; after the launch they work on a copy
 *    of the launch's record whose post-launch hash values are then merged
 *    back (merge_post).
 *  - Ring slots are written only in stretches of C that hold the GIL (every
 *    writer holds it) and run no Python code, each starting right after
 *    kd_ring_reserve or after a check that the ring has not lapped the launch:
 *    no other writer can come in between.  Objects a stretch lets go of are
 *    released after it (ctx->released), since releasing one can run Python.
 *  - A thread inside kd_launch_begin / kd_launch_end is `busy`, as
 *    tracemalloc's reentrant flag: a launch it makes meanwhile (a kernel run
 *    by a hash_fn) is the hash's own work, like the aten ops a hash_fn runs,
 *    and is counted as suppressed instead of recorded.  That also keeps a
 *    hash_fn that calls a compiled function from hashing its own launches
 *    without end.  Launches made by the kernel itself, between begin and end,
 *    are recorded as before: the build buffer is free by then.
 *  - The buffers are allocated on a thread's first recorded launch and freed
 *    when the thread exits (a pthread key's destructor): no allocation per
 *    launch.
 */
_Thread_local kd_launch_ctx *kd_tls_launch_ctx;
static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static int ctx_key_ok;

/* Frees a thread's launch context (the pthread key's destructor, at thread exit). */
static void ctx_free(void *p)
{
    kd_launch_ctx *c = p;
    if (c == NULL)
        return;
    free(c->build);
    free(c->released);
    free(c->metas);
    free(c->hash_at);
    free(c);
}

static void ctx_key_init(void) { ctx_key_ok = pthread_key_create(&ctx_key, ctx_free) == 0; }

kd_launch_ctx *kd_launch_ctx_get(void)
{
    kd_launch_ctx *c = kd_tls_launch_ctx;
    if (c != NULL)
        return c;
    pthread_once(&ctx_once, ctx_key_init);
    c = calloc(1, sizeof *c);
    if (c != NULL) {
        c->build = calloc(KD_BUILD_SLOTS, sizeof(kd_payload));
        c->released = calloc(KD_BUILD_SLOTS, sizeof(PyObject *));
        c->metas = calloc(KD_RECORD_ARGS, sizeof(kd_tensor_meta));
        c->hash_at = calloc(KD_RECORD_ARGS, sizeof(uint32_t));
    }
    if (c == NULL || c->build == NULL || c->released == NULL || c->metas == NULL || c->hash_at == NULL ||
        !ctx_key_ok ||
        pthread_setspecific(ctx_key, c) != 0) {
        ctx_free(c);
        return NULL;
    }
    kd_tls_launch_ctx = c;
    return c;
}
