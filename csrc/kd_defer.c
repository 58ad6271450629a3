/* kd_defer.c - the queue of deferred GPU hashes and copies
 * (Note [Deferred GPU work] in kd_defer.h). */
#include "kd_defer.h"
#include "kd_phase_timers.h"

#include <stdio.h>
#include <string.h>

#include "kd_cuda_copy.h"
#include "kd_cuda_describe.h"
#include "kd_record.h"
#include "kd_shim.h"
#include "kd_write_guard.h"

typedef struct hash_entry {
    void *storage;   /* kd_shim_storage_hold: keeps the memory allocated */
    uint64_t sdata;  /* the storage's data pointer when queued */
    PyObject *owner; /* strong */
    int slot;        /* its tensor in Q.ht: views identical to an earlier one share it */
    kd_defer_sink sink;
    uint64_t aux;
    int w;
    uint64_t lo, hi;
} hash_entry;

typedef struct copy_entry {
    void *storage;  /* of the source, as in hash_entry */
    uint64_t sdata;
    PyObject *dst;  /* strong */
    uint64_t lo, hi;
} copy_entry;

static struct {
    int on;
    int device;
    uint64_t stream;
    int kinds;
    int nh, nc;
    uint64_t bytes;
    kd_cuda_tensor ht[KD_DEFER_VIEWS]; /* distinct views to hash (nu of them) */
    int nu;
    hash_entry he[KD_DEFER_ENTRIES];
    kd_cuda_copy cc[KD_CUDA_COPY_BATCH];
    copy_entry ce[KD_CUDA_COPY_BATCH];
    kd_defer_stats st;
    char error[256];
    int guard_held; /* KD_DEFER_GUARDED: the C++ write guard is installed for the queue */
} Q;

int kd_defer_set(int on)
{
    int prev = Q.on;
    if (on != KD_DEFER_OFF && on != KD_DEFER_GUARDED)
        on = KD_DEFER_MODE;
    if (on != prev)
        kd_defer_flush();
    if (on != KD_DEFER_GUARDED && Q.guard_held) {
        if (kd_write_guard_release() == 0)
            Q.guard_held = 0;
        else
            Q.st.guard_failures++; /* still installed, so still held: released at the next change */
    }
    Q.on = on;
    return prev;
}

int kd_defer_enabled(void) { return Q.on; }

void kd_defer_extent(const kd_cuda_tensor *t, uint64_t *lo, uint64_t *hi)
{
    *lo = *hi = t->data;
    if (t->numel == 0)
        return;
    int64_t min = 0, max = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = (t->sizes[d] - 1) * t->strides[d];
        if (span < 0)
            min += span;
        else
            max += span;
    }
    *lo = t->data + (uint64_t)(min * t->itemsize);
    *hi = t->data + (uint64_t)((max + 1) * t->itemsize);
}

static void set_error(const char *what, const char *detail)
{
    snprintf(Q.error, sizeof Q.error, "%s: %s", what, detail);
}

/* Storage whose memory was swapped (resize_, set_ outside any aten op kdebug
 * sees) since the entry was queued: its bytes are gone. */
static int storage_moved(void *storage, uint64_t sdata)
{
    return kd_shim_storage_data(storage) != sdata;
}

static int defer_flush(void);

int kd_defer_flush(void)
{
    uint64_t t0 = KD_PT_NOW(); /* Note [Phase timers] */
    int rc = defer_flush();
    KD_PT_ADD(KD_PT_FLUSH, t0);
    return rc;
}

static int defer_flush(void)
{
    int nh = Q.nh, nc = Q.nc, rc = 0;
    if (nh == 0 && nc == 0)
        return 0;
    int nu = Q.nu;
    Q.nh = Q.nc = Q.nu = 0;
    Q.bytes = 0;
    kd_write_guard_arm(0);
    Q.st.flushes++;
    Q.st.pending = 0;
    if (nh) {
        /* drop entries whose memory moved, then one launch for the rest */
        kd_cuda_tensor t[KD_DEFER_VIEWS];
        int map[KD_DEFER_VIEWS], n = 0;
        for (int u = 0; u < nu; u++)
            map[u] = 0;
        for (int i = 0; i < nh; i++)
            if (storage_moved(Q.he[i].storage, Q.he[i].sdata))
                map[Q.he[i].slot] = -2;
        for (int u = 0; u < nu; u++)
            if (map[u] == 0) {
                map[u] = n;
                t[n++] = Q.ht[u];
            }
        uint64_t t_enq = KD_PT_NOW();
        int64_t first = n ? kd_cuda_hash_enqueue(Q.device, Q.stream, Q.kinds, t, n) : 0;
        KD_PT_ADD(KD_PT_ENQUEUE, t_enq);
        const char *err = first < 0 ? kd_cuda_last_error() : NULL;
        if (first < 0)
            set_error("queuing GPU hashes", err);
        else if (n)
            Q.st.hash_launches++;
        for (int i = 0; i < nh; i++) {
            hash_entry *e = &Q.he[i];
            int k = map[e->slot];
            if (k == -2 || first < 0) {
                Q.st.hash_failures++;
                rc = -1;
                if (k == -2)
                    set_error("a tensor's storage was resized or replaced before kdebug hashed it",
                              "its hash is missing");
                e->sink(e->owner, e->aux, e->w, Q.device, -1, Q.error);
            } else {
                e->sink(e->owner, e->aux, e->w, Q.device, first + k, NULL);
            }
            Py_DECREF(e->owner);
            kd_shim_storage_release(e->storage);
        }
    }
    if (nc) {
        kd_cuda_copy c[KD_CUDA_COPY_BATCH];
        int n = 0;
        for (int i = 0; i < nc; i++) {
            if (storage_moved(Q.ce[i].storage, Q.ce[i].sdata)) {
                set_error("a tensor's storage was resized or replaced before kdebug copied it",
                          "a recorded output is missing");
                Q.st.copy_failures++;
                rc = -1;
                continue;
            }
            c[n++] = Q.cc[i];
        }
        if (n && kd_cuda_copy_enqueue(Q.device, Q.stream, c, n) == 0) {
            Q.st.copy_launches++;
        } else if (n) {
            set_error("launching kdebug's copy kernel", kd_cuda_last_copy_error());
            Q.st.copy_failures += (uint64_t)n;
            rc = -1;
        }
        for (int i = 0; i < nc; i++) {
            kd_shim_storage_release(Q.ce[i].storage);
            Py_DECREF(Q.ce[i].dst);
        }
    }
    return rc;
}

/* Makes room for an entry on (device, stream, kinds); 0 when it may be added. */
static void admit(int device, uint64_t stream, int kinds, uint64_t bytes)
{
    if (Q.nh + Q.nc == 0)
        return;
    if (Q.device != device || Q.stream != stream) {
        Q.st.stream_flushes++;
        uint64_t from = Q.stream;
        int dev = Q.device;
        kd_defer_flush();
        if (dev == device)
            kd_cuda_stream_wait(device, from, stream);
        return;
    }
    if ((kinds && Q.nh && Q.kinds != kinds) || (kinds && (Q.nu == KD_DEFER_VIEWS || Q.nh == KD_DEFER_ENTRIES)) ||
        (!kinds && Q.nc == KD_CUDA_COPY_BATCH) || Q.bytes + bytes > KD_DEFER_MAX_BYTES)
        kd_defer_flush();
}

/* The start of queuing work on view t of src: holds its storage (NULL: not
 * queued, nothing held) and admits the view's bytes to the queue (which may
 * flush it first). */
static void *enter(PyObject *src, const kd_cuda_tensor *t, int device, uint64_t stream, int kinds,
                   uint64_t *sdata, uint64_t *lo, uint64_t *hi)
{
    *sdata = 0;
    if (Q.on == KD_DEFER_GUARDED && !Q.guard_held) { /* Note [C++ write guard]: before the first entry */
        if (kd_write_guard_acquire() != 0) {
            Q.st.guard_failures++;
            set_error("deferring GPU work in kernels_only", kd_write_guard_error());
            return NULL; /* not queued: the caller does it now */
        }
        Q.guard_held = 1;
    }
    void *storage = Q.on ? kd_shim_storage_hold(src, sdata) : NULL;
    if (storage == NULL)
        return NULL;
    kd_defer_extent(t, lo, hi);
    admit(device, stream, kinds, *hi - *lo);
    return storage;
}

/* The end of queuing an entry of `bytes` bytes on (device, stream).  A guard
 * paused at a quiet point is enabled again here, after admit()'s flush (whose
 * reference drops may run Python code that reaches another quiet point) and
 * before the entry is armed, with no Python code between; if torch will not
 * enable it, the queue is launched now: nothing waits unguarded. */
static void queued(int device, uint64_t stream, uint64_t bytes)
{
    Q.device = device, Q.stream = stream;
    Q.bytes += bytes;
    Q.st.queued_bytes += bytes;
    Q.st.pending = (uint64_t)(Q.nh + Q.nc);
    if (Q.guard_held && kd_write_guard_idle(0) != 0) {
        Q.st.guard_failures++;
        set_error("deferring GPU work in kernels_only", kd_write_guard_error());
        kd_defer_flush();
        return;
    }
    kd_write_guard_arm(1);
}

int kd_defer_hash(PyObject *src, const kd_cuda_tensor *t, int device, uint64_t stream, int kinds,
                  kd_defer_sink sink, PyObject *owner, uint64_t aux, int w)
{
    uint64_t sdata, lo, hi;
    void *storage = enter(src, t, device, stream, kinds, &sdata, &lo, &hi);
    if (storage == NULL)
        return 0;
    hash_entry *e = &Q.he[Q.nh];
    /* the same view queued already (nothing wrote it since: that would have
     * flushed the queue) has the same hash: share its result */
    e->slot = -1;
    for (int u = 0; u < Q.nu; u++)
        if (memcmp(&Q.ht[u], t, sizeof *t) == 0) {
            e->slot = u;
            Q.st.shared_hashes++;
            break;
        }
    if (e->slot < 0) {
        e->slot = Q.nu;
        Q.ht[Q.nu++] = *t;
    }
    e->storage = storage;
    e->sdata = sdata;
    e->owner = Py_NewRef(owner);
    e->sink = sink;
    e->aux = aux;
    e->w = w;
    e->lo = lo, e->hi = hi;
    Q.nh++;
    Q.kinds = kinds;
    Q.st.queued_hashes++;
    queued(device, stream, hi - lo);
    return 1;
}

int kd_defer_copy(PyObject *src, const kd_cuda_tensor *t, PyObject *dst, uint64_t dst_ptr,
                  int dst_like_src, int device, uint64_t stream)
{
    uint64_t sdata, lo, hi;
    void *storage = enter(src, t, device, stream, 0, &sdata, &lo, &hi);
    if (storage == NULL)
        return 0;
    if (Q.nh == 0)
        Q.kinds = 0;
    kd_cuda_copy *c = &Q.cc[Q.nc];
    memset(c, 0, sizeof *c);
    c->src = *t;
    c->dst = dst_ptr;
    c->dst_like_src = dst_like_src;
    copy_entry *e = &Q.ce[Q.nc];
    e->storage = storage;
    e->sdata = sdata;
    e->dst = Py_NewRef(dst);
    e->lo = lo, e->hi = hi;
    Q.nc++;
    Q.st.queued_copies++;
    queued(device, stream, hi - lo);
    return 1;
}

static int overlaps_queued(uint64_t lo, uint64_t hi)
{
    for (int i = 0; i < Q.nh; i++)
        if (lo < Q.he[i].hi && Q.he[i].lo < hi)
            return 1;
    for (int i = 0; i < Q.nc; i++)
        if (lo < Q.ce[i].hi && Q.ce[i].lo < hi)
            return 1;
    return 0;
}

void kd_defer_guard(int device, uint64_t stream, uint64_t lo, uint64_t hi)
{
    if (Q.nh + Q.nc == 0)
        return;
    if (Q.device != device || Q.stream != stream) {
        admit(device, stream, 0, 0);
        return;
    }
    if (lo < hi && overlaps_queued(lo, hi)) {
        Q.st.hazard_flushes++;
        kd_defer_flush();
    }
}

void kd_defer_guard_tensor(PyObject *o, uint64_t stream)
{
    if (Q.nh + Q.nc == 0)
        return;
    kd_tensor_meta m;
    int r = kd_shim_tensor_meta(o, &m);
    if (r == 0 || (r > 0 && m.device_type != KD_DEV_CUDA))
        return;
    kd_cuda_tensor t;
    if (r < 0 || !kd_cuda_describe(&m, &t)) {
        kd_defer_flush(); /* a view we cannot bound: assume it overlaps */
        return;
    }
    if (stream == 0)
        stream = kd_shim_current_stream(m.device_type, m.device_index);
    uint64_t lo, hi;
    kd_defer_extent(&t, &lo, &hi);
    kd_defer_guard(m.device_index, stream, lo, hi);
}

PyObject *kd_defer_clone(PyObject *o, const kd_tensor_meta *m, uint64_t stream)
{
    kd_cuda_tensor t;
    if (Q.on && !m->math_bits && kd_cuda_describe(m, &t) && t.numel > 0) { /* bytes copy: not for conj / neg views */
        int same = 0;
        PyObject *dst = kd_shim_empty_like(o, &same);
        kd_tensor_meta dm;
        if (dst != NULL && kd_shim_tensor_meta(dst, &dm) == 1) {
            if (stream == 0)
                stream = kd_shim_current_stream(m->device_type, m->device_index);
            if (!kd_defer_copy(o, &t, dst, dm.data_ptr, same, m->device_index, stream) &&
                kd_shim_copy(dst, o) != 0) {
                Py_DECREF(dst);
                return NULL;
            }
            return dst;
        }
        Py_XDECREF(dst);
    }
    return kd_shim_clone(o);
}

int kd_defer_pending(void) { return Q.nh + Q.nc != 0; }

void kd_defer_read_back_early(void)
{
    if (kd_cuda_hash_unread() >= KD_READ_BACK_AT)
        (void)kd_cuda_hash_collect_ready(); /* its failure is the next blocking collect's to report */
}

int kd_defer_flush_quiet(void)
{
    int rc = kd_defer_flush();
    if (Q.guard_held && Q.nh + Q.nc == 0)
        kd_write_guard_idle(1);
    return rc;
}

void kd_defer_get_stats(kd_defer_stats *s)
{
    *s = Q.st;
    s->pending = (uint64_t)(Q.nh + Q.nc);
}

const char *kd_defer_last_error(void) { return Q.error; }
