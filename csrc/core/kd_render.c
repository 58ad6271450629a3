/* kd_render.c - rendering records as text (kd_render.h). */
#include "kd_render.h"

#include "kd_args.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An output cursor with snprintf semantics: counts everything, writes what fits. */
typedef struct w {
    char *out;
    size_t cap;
    size_t len;
} w;

static void put(w *o, const char *s, size_t n)
{
    if (o->len < o->cap) {
        size_t room = o->cap - o->len;
        size_t k = n < room ? n : room;
        memcpy(o->out + o->len, s, k);
    }
    o->len += n;
}

static void puts_(w *o, const char *s) { put(o, s, strlen(s)); }

static void putf(w *o, const char *fmt, ...)
{
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(o, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static size_t finish(w *o)
{
    if (o->cap > 0)
        o->out[o->len < o->cap ? o->len : o->cap - 1] = '\0';
    return o->len;
}

size_t kd_render_double(double v, char *out, size_t cap)
{
    char buf[48];
    w o = {out, cap, 0};
    if (isnan(v)) {
        puts_(&o, "nan");
        return finish(&o);
    }
    if (isinf(v)) {
        puts_(&o, v > 0 ? "inf" : "-inf");
        return finish(&o);
    }
    /* Shortest mantissa that round-trips, as Python's repr picks it. */
    char e[40];
    int prec = 0;
    for (; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, v);
        if (strtod(e, NULL) == v)
            break;
    }
    /* e is "[-]d[.ddd]e[+-]XX": split sign, digits and exponent. */
    const char *s = e;
    int neg = *s == '-';
    if (neg)
        s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.' && nd < (int)sizeof digits - 1)
            digits[nd++] = *s;
    digits[nd] = '\0';
    int exp = *s == 'e' ? atoi(s + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') /* drop trailing zeros */
        digits[--nd] = '\0';
    if (neg)
        put(&o, "-", 1);
    if (exp >= -4 && exp < 16) {
        /* fixed notation: exp = position of the first digit's place */
        if (exp < 0) {
            puts_(&o, "0.");
            for (int i = 0; i < -exp - 1; i++)
                put(&o, "0", 1);
            put(&o, digits, (size_t)nd);
        } else if (nd <= exp + 1) {
            put(&o, digits, (size_t)nd);
            for (int i = nd; i < exp + 1; i++)
                put(&o, "0", 1);
            puts_(&o, ".0");
        } else {
            put(&o, digits, (size_t)exp + 1);
            put(&o, ".", 1);
            put(&o, digits + exp + 1, (size_t)(nd - exp - 1));
        }
    } else {
        put(&o, digits, 1);
        if (nd > 1) {
            put(&o, ".", 1);
            put(&o, digits + 1, (size_t)nd - 1);
        }
        snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        puts_(&o, buf);
    }
    return finish(&o);
}

static const char *dtype_name(const kd_render_ctx *c, unsigned dt)
{
    if (c->dtype_names != NULL && dt < c->ndtype_names && c->dtype_names[dt] != NULL)
        return c->dtype_names[dt];
    return NULL;
}

static void tensor(w *o, const kd_render_ctx *c, const kd_payload *p, int flags)
{
    const kd_tensor_arg *t = &p->tensor;
    const char *dn = dtype_name(c, t->dtype);
    puts_(o, "t: ");
    if (dn != NULL)
        puts_(o, dn);
    else
        putf(o, "dtype%u", (unsigned)t->dtype);
    put(o, "[", 1);
    for (uint32_t d = 0; d < t->ndim; d++) {
        int64_t size, stride;
        kd_tensor_dim(p, d, &size, &stride);
        putf(o, d ? ", %" PRId64 : "%" PRId64, size);
    }
    put(o, "]", 1);
    if (flags & KD_RENDER_VERBOSE) {
        static const char *roles[4] = {"-", "R", "W", "RW"};
        putf(o, "{%s, stride=(", roles[t->role & 3]);
        for (uint32_t d = 0; d < t->ndim; d++) {
            int64_t size, stride;
            kd_tensor_dim(p, d, &size, &stride);
            putf(o, d ? ", %" PRId64 : "%" PRId64, stride);
        }
        if (t->ndim == 1)
            put(o, ",", 1);
        putf(o, "), offset=%" PRId64 ", ptr=0x%" PRIx64, t->storage_offset, t->data_ptr);
        if (t->device_type == KD_DEV_CUDA)
            putf(o, ", cuda:%d", (int)t->device_index);
        put(o, "}", 1);
    }
}

size_t kd_render_tensor(const kd_render_ctx *c, const kd_payload *p, int flags,
                        char *out, size_t cap)
{
    w o = {out, cap, 0};
    tensor(&o, c, p, flags);
    return finish(&o);
}

static void args(w *o, const kd_render_ctx *c, const kd_payload *p, int flags)
{
    kd_arg_iter it = kd_args_begin(p, 1u + p->launch.nslots);
    while (kd_args_next(&it)) {
        const kd_payload *q = it.arg;
        uint32_t a = it.index;
        if (a)
            puts_(o, ", ");
        size_t nlen;
        const char *name = kd_strtab_get(c->strings, q->scalar.name_id, &nlen);
        if (nlen)
            put(o, name, nlen);
        else
            putf(o, "arg%u", a);
        put(o, "=", 1);
        switch (q->tag) {
        case KD_TAG_TENSOR:
            tensor(o, c, q, flags);
            break;
        case KD_TAG_INT:
            putf(o, "%" PRId64, q->scalar.value.i);
            break;
        case KD_TAG_FLOAT: {
            char buf[40];
            kd_render_double(q->scalar.value.f, buf, sizeof buf);
            puts_(o, buf);
            break;
        }
        case KD_TAG_BOOL:
            puts_(o, q->scalar.value.i ? "True" : "False");
            break;
        case KD_TAG_NONE:
            puts_(o, "None");
            break;
        case KD_TAG_OTHER:
            put(o, "<", 1);
            puts_(o, kd_strtab_get(c->strings, q->scalar.value.type_name_id, NULL));
            put(o, ">", 1);
            break;
        default:
            putf(o, "<bad tag %u>", (unsigned)q->tag);
            break;
        }
    }
}

size_t kd_render_args(const kd_render_ctx *c, const kd_payload *p, int flags,
                      char *out, size_t cap)
{
    w o = {out, cap, 0};
    args(&o, c, p, flags);
    return finish(&o);
}

size_t kd_render_launch(const kd_render_ctx *c, const kd_payload *p, int flags,
                        char *out, size_t cap)
{
    w o = {out, cap, 0};
    const kd_launch *l = &p->launch;
    puts_(&o, l->kind == KD_KIND_CPP ? "[cpp] " : l->kind == KD_KIND_ATEN ? "[aten] " : "[triton] ");
    puts_(&o, kd_strtab_get(c->strings, l->name_id, NULL));
    put(&o, "(", 1);
    if (l->kind == KD_KIND_TRITON && (l->flags & KD_LF_GRID)) {
        putf(&o, "grid=(%" PRIu32 ", %" PRIu32 ", %" PRIu32 ")", l->grid[0],
             l->grid[1], l->grid[2]);
        if (l->nargs)
            puts_(&o, ", ");
    }
    args(&o, c, p, flags);
    put(&o, ")", 1);
    /* Note [CUDA graph replays] */
    if (l->flags & KD_LF_REPLAYED)
        putf(&o, "  # CUDA graph %" PRIu32 " replay %" PRIu64, l->graph_id, l->replay_index);
    else if (l->flags & KD_LF_CAPTURED)
        putf(&o, "  # captured into CUDA graph %" PRIu32 " (not run)", l->graph_id);
    if (flags & KD_RENDER_VERBOSE) {
        if (l->flags & KD_LF_CONFIG) {
            puts_(&o, "  # ");
            size_t n;
            const char *cfg = kd_strtab_get(c->strings, l->config_id, &n);
            if (n) {
                put(&o, cfg, n);
                puts_(&o, ", ");
            }
            putf(&o, "num_warps=%u, num_stages=%u", (unsigned)l->num_warps,
                 (unsigned)l->num_stages);
        }
        if (l->flags & KD_LF_RAISED)
            puts_(&o, "  # launch raised");
    }
    return finish(&o);
}
