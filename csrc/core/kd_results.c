/* kd_results.c - handing collected GPU hash results to whoever waits for them
 * (Note [GPU hash results] in kd_results.h). */
#include "kd_results.h"

#include <stdlib.h>
#include <string.h>

/* One registration; several may wait for one index (the deferred queue shares
 * one result among identical views: Note [Deferred GPU work]). */
typedef struct waiter {
    kd_result_fn fn;
    void *owner; /* direct owner, or NULL */
    kd_result_anchor *anchor;
    uint64_t aux;
    int w;
    int next;    /* next waiter of the same index, or the free list; -1 ends */
} waiter;

typedef struct slot {
    int64_t index; /* -1: never used */
    int head;      /* first waiter for index, -1: none */
    int arrived;   /* res holds index's result */
    kd_cuda_result res;
} slot;

static slot *tables[KD_RESULTS_DEVICES];
static waiter *pool;
static int pool_cap, free_head = -1;
static uint64_t waiting;

kd_result_anchor *kd_result_anchor_new(void *owner)
{
    kd_result_anchor *a = calloc(1, sizeof *a);
    if (a != NULL)
        a->owner = owner;
    return a;
}

void kd_result_anchor_drop(kd_result_anchor *a)
{
    if (a == NULL)
        return;
    a->owner = NULL;
    if (a->refs == 0)
        free(a);
}

static slot *table(int device)
{
    if (device < 0 || device >= KD_RESULTS_DEVICES)
        return NULL;
    if (tables[device] == NULL) {
        slot *t = calloc(KD_CUDA_CAPACITY, sizeof *t);
        if (t == NULL)
            return NULL;
        for (int i = 0; i < KD_CUDA_CAPACITY; i++)
            t[i].index = -1, t[i].head = -1;
        tables[device] = t;
    }
    return tables[device];
}

static int new_waiter(void)
{
    if (free_head < 0) {
        int cap = pool_cap ? pool_cap * 2 : 256;
        waiter *p = realloc(pool, (size_t)cap * sizeof *p);
        if (p == NULL)
            return -1;
        pool = p;
        for (int i = cap - 1; i >= pool_cap; i--)
            pool[i].next = free_head, free_head = i;
        pool_cap = cap;
    }
    int i = free_head;
    free_head = pool[i].next;
    waiting++;
    return i;
}

/* Hands `res` to waiter i (when its owner is still there) and frees it. */
static void hand_over(int i, const kd_cuda_result *res)
{
    waiter *wt = &pool[i];
    kd_result_anchor *a = wt->anchor;
    void *owner = a != NULL ? a->owner : wt->owner;
    if (owner != NULL && res != NULL)
        wt->fn(owner, wt->aux, wt->w, res);
    if (a != NULL && --a->refs == 0 && a->owner == NULL)
        free(a);
    wt->next = free_head;
    free_head = i;
    waiting--;
}

/* Makes s the slot of `index`: waiters of an older index there lose their
 * result (only possible with more than KD_CUDA_CAPACITY in flight). */
static void claim(slot *s, int64_t index)
{
    if (s->index == index)
        return;
    while (s->head >= 0) {
        int i = s->head;
        s->head = pool[i].next;
        hand_over(i, NULL);
    }
    s->index = index;
    s->arrived = 0;
}

int kd_results_expect(int device, int64_t index, kd_result_fn fn, void *owner, kd_result_anchor *anchor,
                      uint64_t aux, int w)
{
    slot *t = table(device);
    if (t == NULL || index < 0 || fn == NULL)
        return -1;
    slot *s = &t[index % KD_CUDA_CAPACITY];
    if (s->index != index && s->head >= 0)
        return -1; /* another index still waits there: too many in flight */
    int i = new_waiter();
    if (i < 0)
        return -1;
    claim(s, index);
    waiter *wt = &pool[i];
    wt->fn = fn;
    wt->owner = anchor != NULL ? NULL : owner;
    wt->anchor = anchor;
    wt->aux = aux;
    wt->w = w;
    if (anchor != NULL)
        anchor->refs++;
    if (s->arrived) {
        hand_over(i, &s->res);
    } else {
        wt->next = s->head;
        s->head = i;
    }
    return 0;
}

void kd_results_forget(int device, int64_t index, const void *owner)
{
    if (device < 0 || device >= KD_RESULTS_DEVICES || tables[device] == NULL || index < 0)
        return;
    slot *s = &tables[device][index % KD_CUDA_CAPACITY];
    if (s->index != index)
        return;
    for (int i = s->head; i >= 0; i = pool[i].next)
        if (pool[i].anchor == NULL && pool[i].owner == owner) {
            pool[i].owner = NULL; /* the waiter stays until the result comes */
            return;
        }
}

void kd_results_deliver(int device, int64_t index, const kd_cuda_result *res)
{
    slot *t = table(device);
    if (t == NULL || index < 0)
        return;
    slot *s = &t[index % KD_CUDA_CAPACITY];
    claim(s, index);
    s->res = *res;
    s->arrived = 1; /* for registrations still to come */
    while (s->head >= 0) {
        int i = s->head;
        s->head = pool[i].next;
        hand_over(i, &s->res);
    }
}

uint64_t kd_results_waiting(void) { return waiting; }

void kd_results_reset(void)
{
    for (int d = 0; d < KD_RESULTS_DEVICES; d++) {
        free(tables[d]);
        tables[d] = NULL;
    }
    free(pool);
    pool = NULL;
    pool_cap = 0;
    free_head = -1;
    waiting = 0;
}
