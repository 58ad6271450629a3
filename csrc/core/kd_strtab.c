/* kd_strtab.c - the interned string table (kd_strtab.h). */
#include "kd_strtab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define KD_CHUNK_BYTES (64 * 1024)

typedef struct kd_chunk {
    struct kd_chunk *next;
    size_t used;
    size_t cap;
    char data[];
} kd_chunk;

typedef struct kd_entry {
    const char *s;
    uint32_t len;
    uint32_t hash;
} kd_entry;

struct kd_strtab {
    pthread_mutex_t lock;
    uint32_t max_strings;
    _Atomic uint32_t count;  /* published strings */
    kd_entry *entries;       /* [max_strings + 1], fixed: readers never see it move */
    uint32_t *index;         /* open addressing: ids, 0 = empty (under lock) */
    uint32_t index_cap;      /* power of two */
    kd_chunk *chunks;        /* arena (under lock); strings never move */
};

static uint32_t fnv1a(const char *s, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

kd_strtab *kd_strtab_new(uint32_t max_strings)
{
    if (max_strings == 0 || max_strings > (1u << 28))
        return NULL;
    kd_strtab *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->max_strings = max_strings;
    t->entries = calloc((size_t)max_strings + 1, sizeof(kd_entry));
    t->index_cap = 1024;
    t->index = calloc(t->index_cap, sizeof(uint32_t));
    if (t->entries == NULL || t->index == NULL || pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t->entries);
        free(t->index);
        free(t);
        return NULL;
    }
    t->entries[0].s = "";
    return t;
}

void kd_strtab_free(kd_strtab *t)
{
    if (t == NULL)
        return;
    kd_chunk *c = t->chunks;
    while (c != NULL) {
        kd_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(t->entries);
    free(t->index);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static char *arena_copy(kd_strtab *t, const char *s, size_t len)
{
    kd_chunk *c = t->chunks;
    if (c == NULL || c->cap - c->used < len + 1) {
        size_t cap = len + 1 > KD_CHUNK_BYTES ? len + 1 : KD_CHUNK_BYTES;
        kd_chunk *n = malloc(sizeof(kd_chunk) + cap);
        if (n == NULL)
            return NULL;
        n->next = t->chunks;
        n->used = 0;
        n->cap = cap;
        t->chunks = n;
        c = n;
    }
    char *dst = c->data + c->used;
    memcpy(dst, s, len);
    dst[len] = '\0';
    c->used += len + 1;
    return dst;
}

/* Doubles the hash index (under lock).  Returns 0 or -1 on out of memory. */
static int grow_index(kd_strtab *t)
{
    uint32_t cap = t->index_cap * 2;
    uint32_t *idx = calloc(cap, sizeof(uint32_t));
    if (idx == NULL)
        return -1;
    uint32_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
    for (uint32_t id = 1; id <= n; id++) {
        uint32_t pos = t->entries[id].hash & (cap - 1);
        while (idx[pos] != 0)
            pos = (pos + 1) & (cap - 1);
        idx[pos] = id;
    }
    free(t->index);
    t->index = idx;
    t->index_cap = cap;
    return 0;
}

uint32_t kd_strtab_intern(kd_strtab *t, const char *s, size_t len)
{
    if (len > UINT32_MAX / 2 || memchr(s, '\0', len) != NULL)
        return 0;
    uint32_t h = fnv1a(s, len);
    uint32_t id = 0;
    pthread_mutex_lock(&t->lock);
    uint32_t pos = h & (t->index_cap - 1);
    while (t->index[pos] != 0) {
        const kd_entry *e = &t->entries[t->index[pos]];
        if (e->hash == h && e->len == len && memcmp(e->s, s, len) == 0) {
            id = t->index[pos];
            goto done;
        }
        pos = (pos + 1) & (t->index_cap - 1);
    }
    uint32_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
    if (n >= t->max_strings)
        goto done;
    /* keep the index at most half full */
    if ((uint64_t)(n + 1) * 2 > t->index_cap) {
        if (grow_index(t) != 0)
            goto done;
        pos = h & (t->index_cap - 1);
        while (t->index[pos] != 0)
            pos = (pos + 1) & (t->index_cap - 1);
    }
    char *copy = arena_copy(t, s, len);
    if (copy == NULL)
        goto done;
    id = n + 1;
    t->entries[id].s = copy;
    t->entries[id].len = (uint32_t)len;
    t->entries[id].hash = h;
    t->index[pos] = id;
    atomic_store_explicit(&t->count, id, memory_order_release);
done:
    pthread_mutex_unlock(&t->lock);
    return id;
}

const char *kd_strtab_get(const kd_strtab *t, uint32_t id, size_t *len)
{
    uint32_t n = atomic_load_explicit(&((kd_strtab *)t)->count, memory_order_acquire);
    if (id == 0 || id > n) {
        if (len)
            *len = 0;
        return "";
    }
    if (len)
        *len = t->entries[id].len;
    return t->entries[id].s;
}

uint32_t kd_strtab_count(const kd_strtab *t)
{
    return atomic_load_explicit(&((kd_strtab *)t)->count, memory_order_acquire);
}
