/* kd_hash.c - tensor fingerprints in C: bitwise, norm, stats, hash_tensor (kd_hash.h). */
#include "kd_hash.h"
#include "kd_runs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int kd_itemsize(int st)
{
    switch (st) {
    case KD_ST_BYTE: case KD_ST_CHAR: case KD_ST_BOOL: case KD_ST_QINT8: case KD_ST_QUINT8:
    case KD_ST_QUINT4X2: case KD_ST_QUINT2X4: case KD_ST_BITS1X8: case KD_ST_BITS2X4:
    case KD_ST_BITS4X2: case KD_ST_BITS8: case KD_ST_F8E5M2: case KD_ST_F8E4M3FN:
    case KD_ST_F8E5M2FNUZ: case KD_ST_F8E4M3FNUZ: case KD_ST_F8E8M0FNU: case KD_ST_F4E2M1FNX2:
        return 1;
    case KD_ST_SHORT: case KD_ST_HALF: case KD_ST_BFLOAT16: case KD_ST_BITS16: case KD_ST_UINT16:
        return 2;
    case KD_ST_INT: case KD_ST_FLOAT: case KD_ST_COMPLEX_HALF: case KD_ST_QINT32: case KD_ST_UINT32:
        return 4;
    case KD_ST_LONG: case KD_ST_DOUBLE: case KD_ST_COMPLEX_FLOAT: case KD_ST_UINT64:
        return 8;
    case KD_ST_COMPLEX_DOUBLE:
        return 16;
    default:
        /* UInt1..7 (30..36) and Int1..7 (37..43) are stored a byte each */
        return st >= 30 && st <= 43 ? 1 : 0;
    }
}

/* ---- bitwise ---- */

typedef struct bw {
    uint64_t s[4];
    uint64_t pos;   /* (p + 1) * GOLDEN for the next word */
    unsigned char part[8];
    unsigned npart;
    uint64_t nbytes;
} bw;

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, 8); /* little-endian hosts: x86-64, aarch64 */
    return w;
}

static void bw_run(void *ctx, const unsigned char *p, uint64_t n)
{
    bw *h = ctx;
    h->nbytes += n;
    while (h->npart && n) {
        h->part[h->npart++] = *p++;
        n--;
        if (h->npart == 8) {
            h->s[0] += kd_fmix64(load64(h->part) ^ h->pos);
            h->pos += KD_HASH_GOLDEN;
            h->npart = 0;
        }
    }
    uint64_t pos = h->pos;
    uint64_t s0 = h->s[0], s1 = h->s[1], s2 = h->s[2], s3 = h->s[3];
    while (n >= 32) {
        s0 += kd_fmix64(load64(p) ^ pos);
        s1 += kd_fmix64(load64(p + 8) ^ (pos + KD_HASH_GOLDEN));
        s2 += kd_fmix64(load64(p + 16) ^ (pos + 2 * KD_HASH_GOLDEN));
        s3 += kd_fmix64(load64(p + 24) ^ (pos + 3 * KD_HASH_GOLDEN));
        pos += 4 * KD_HASH_GOLDEN;
        p += 32;
        n -= 32;
    }
    while (n >= 8) {
        s0 += kd_fmix64(load64(p) ^ pos);
        pos += KD_HASH_GOLDEN;
        p += 8;
        n -= 8;
    }
    h->s[0] = s0, h->s[1] = s1, h->s[2] = s2, h->s[3] = s3;
    h->pos = pos;
    while (n) {
        h->part[h->npart++] = *p++;
        n--;
    }
}

uint64_t kd_hash_bitwise(const kd_view *v)
{
    bw h;
    memset(&h, 0, sizeof h);
    h.pos = KD_HASH_GOLDEN;
    kd_for_each_run(v, bw_run, &h);
    if (h.npart) {
        memset(h.part + h.npart, 0, 8 - h.npart);
        h.s[0] += kd_fmix64(load64(h.part) ^ h.pos);
    }
    return kd_hash_finish(h.s[0] + h.s[1] + h.s[2] + h.s[3], h.nbytes);
}

/* ---- decoding values ---- */

static double ldexp_u(double m, int e) { return ldexp(m, e); }

static double half_to_double(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) {
        /* inf / NaN through float32 bits, keeping the payload as torch does */
        uint32_t u = ((uint32_t)s << 31) | 0x7f800000u | ((uint32_t)m << 13);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    double v = e == 0 ? ldexp_u(m, -24) : ldexp_u(1024 + m, e - 25);
    return s ? -v : v;
}

static double bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float8 with `eb` exponent bits and `mb` mantissa bits */
static double f8_to_double(uint8_t x, int eb, int mb, int bias, int fnuz, int fn)
{
    if (fnuz && x == 0x80)
        return NAN;
    int s = x >> 7, e = (x >> mb) & ((1 << eb) - 1), m = x & ((1 << mb) - 1);
    if (fn && e == (1 << eb) - 1 && m == (1 << mb) - 1)
        return NAN;
    if (!fn && !fnuz && e == (1 << eb) - 1)
        return m ? NAN : (s ? -INFINITY : INFINITY);
    double v = e == 0 ? ldexp_u(m, 1 - bias - mb) : ldexp_u((1 << mb) + m, e - bias - mb);
    return s ? -v : v;
}

double kd_decode_float(int st, const void *elem)
{
    const unsigned char *p = elem;
    uint16_t u16;
    switch (st) {
    case KD_ST_HALF:
        memcpy(&u16, p, 2);
        return half_to_double(u16);
    case KD_ST_BFLOAT16:
        memcpy(&u16, p, 2);
        return bf16_to_double(u16);
    case KD_ST_F8E5M2:
        return f8_to_double(p[0], 5, 2, 15, 0, 0);
    case KD_ST_F8E4M3FN:
        return f8_to_double(p[0], 4, 3, 7, 0, 1);
    case KD_ST_F8E5M2FNUZ:
        return f8_to_double(p[0], 5, 2, 16, 1, 0);
    case KD_ST_F8E4M3FNUZ:
        return f8_to_double(p[0], 4, 3, 8, 1, 0);
    case KD_ST_F8E8M0FNU:
        return p[0] == 0xff ? NAN : ldexp(1.0, (int)p[0] - 127);
    case KD_ST_FLOAT: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case KD_ST_DOUBLE: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    default:
        return NAN;
    }
}

/* Integer element as int64 (bool 0/1); returns 0 and sets *ok=0 for non-integers. */
static int64_t decode_int(int st, const unsigned char *p, int *ok)
{
    *ok = 1;
    switch (st) {
    case KD_ST_BOOL: return p[0] != 0;
    case KD_ST_BYTE: return p[0];
    case KD_ST_CHAR: return (int8_t)p[0];
    case KD_ST_SHORT: { int16_t v; memcpy(&v, p, 2); return v; }
    case KD_ST_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case KD_ST_INT: { int32_t v; memcpy(&v, p, 4); return v; }
    case KD_ST_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case KD_ST_LONG: case KD_ST_UINT64: { int64_t v; memcpy(&v, p, 8); return v; }
    default:
        *ok = 0;
        return 0;
    }
}

enum { K_FLOAT, K_INT, K_COMPLEX, K_NONE };

static int value_kind(int st)
{
    switch (st) {
    case KD_ST_HALF: case KD_ST_BFLOAT16: case KD_ST_FLOAT: case KD_ST_DOUBLE: case KD_ST_F8E5M2:
    case KD_ST_F8E4M3FN: case KD_ST_F8E5M2FNUZ: case KD_ST_F8E4M3FNUZ: case KD_ST_F8E8M0FNU:
        return K_FLOAT;
    case KD_ST_BOOL: case KD_ST_BYTE: case KD_ST_CHAR: case KD_ST_SHORT: case KD_ST_INT:
    case KD_ST_LONG: case KD_ST_UINT16: case KD_ST_UINT32: case KD_ST_UINT64:
        return K_INT;
    case KD_ST_COMPLEX_HALF: case KD_ST_COMPLEX_FLOAT: case KD_ST_COMPLEX_DOUBLE:
        return K_COMPLEX;
    default:
        return K_NONE;
    }
}

static void complex_parts(int st, const unsigned char *p, double *re, double *im)
{
    if (st == KD_ST_COMPLEX_HALF) {
        *re = kd_decode_float(KD_ST_HALF, p);
        *im = kd_decode_float(KD_ST_HALF, p + 2);
    } else if (st == KD_ST_COMPLEX_FLOAT) {
        *re = kd_decode_float(KD_ST_FLOAT, p);
        *im = kd_decode_float(KD_ST_FLOAT, p + 4);
    } else {
        *re = kd_decode_float(KD_ST_DOUBLE, p);
        *im = kd_decode_float(KD_ST_DOUBLE, p + 8);
    }
}

/* ---- norm ---- */

typedef struct nm {
    int st, kind, itemsize;
    double acc;
    kd_norm *out;
} nm;

static void add_abs(nm *c, double a)
{
    if (isnan(a))
        c->out->nan++;
    else if (isinf(a) && a > 0)
        c->out->posinf++;
    else if (isinf(a))
        c->out->neginf++;
    else
        c->acc += fabs(a);
}

/* Tight loops for the common float types; same order of additions as the
 * generic loop below (one accumulator, element order), so the same result. */
#define KD_NORM_LOOP(T, LOAD)                                                  \
    do {                                                                       \
        for (uint64_t i = 0; i < n; i++) {                                     \
            T raw;                                                             \
            memcpy(&raw, p + i * sizeof(T), sizeof(T));                        \
            double a = LOAD;                                                   \
            if (isfinite(a))                                                   \
                acc += fabs(a);                                                \
            else                                                               \
                add_abs(c, a);                                                 \
        }                                                                      \
    } while (0)

static void norm_run(void *ctx, const unsigned char *p, uint64_t nbytes)
{
    nm *c = ctx;
    uint64_t n = nbytes / (uint64_t)c->itemsize;
    double acc = c->acc;
    switch (c->st) {
    case KD_ST_FLOAT:
        KD_NORM_LOOP(float, (double)raw);
        c->acc = acc;
        return;
    case KD_ST_DOUBLE:
        KD_NORM_LOOP(double, raw);
        c->acc = acc;
        return;
    case KD_ST_BFLOAT16:
        KD_NORM_LOOP(uint16_t, bf16_to_double(raw));
        c->acc = acc;
        return;
    case KD_ST_HALF:
        KD_NORM_LOOP(uint16_t, half_to_double(raw));
        c->acc = acc;
        return;
    default:
        break;
    }
    for (uint64_t i = 0; i < n; i++, p += c->itemsize) {
        if (c->kind == K_FLOAT) {
            add_abs(c, kd_decode_float(c->st, p));
        } else if (c->kind == K_INT) {
            int ok;
            /* upstream casts integers to float32 first */
            add_abs(c, (double)(float)decode_int(c->st, p, &ok));
        } else {
            double re, im;
            complex_parts(c->st, p, &re, &im);
            if (isnan(re) || isnan(im))
                c->out->nan++;
            else if (isinf(re) || isinf(im))
                c->out->posinf++; /* |z| = +inf */
            else
                c->acc += hypot(re, im);
        }
    }
}

int kd_hash_norm(const kd_view *v, kd_norm *out)
{
    memset(out, 0, sizeof *out);
    int kind = value_kind(v->scalar_type);
    if (kind == K_NONE || v->itemsize != kd_itemsize(v->scalar_type))
        return -1;
    nm c = {v->scalar_type, kind, v->itemsize, 0.0, out};
    kd_for_each_run(v, norm_run, &c);
    out->l1 = c.acc;
    return 0;
}

/* ---- stats (Note [The stats hash]) ---- */

typedef struct st {
    int st, kind, itemsize;
    double l1, sum, amax; /* floating and complex */
    uint64_t isum, iamax; /* integers: exact, wrapping */
    kd_norm *out;
} st;

/* One floating value x of a finite-or-not element: the norm's fields and sum / absmax. */
static inline void stats_float(st *c, double x)
{
    if (isnan(x)) {
        c->out->nan++;
    } else if (isinf(x)) {
        if (x > 0)
            c->out->posinf++;
        else
            c->out->neginf++;
    } else {
        double a = fabs(x);
        c->l1 += a;
        c->sum += x;
        if (a > c->amax)
            c->amax = a;
    }
}

/* One element x in the tight loops below (l1, sum, amax: their locals). */
#define KD_STATS_ONE(x)                                                        \
    do {                                                                       \
        if (isfinite(x)) {                                                     \
            double a_ = fabs(x);                                               \
            l1 += a_;                                                          \
            sum += (x);                                                        \
            amax = a_ > amax ? a_ : amax;                                      \
        } else {                                                               \
            stats_float(c, (x));                                               \
        }                                                                      \
    } while (0)

/* Tight loop for a common float type: same additions, in element order, as
 * stats_float; two elements a step, with one branch and one max for the
 * pair when both are finite (the usual case). */
#define KD_STATS_LOOP(T, LOAD)                                                 \
    do {                                                                       \
        double l1 = c->l1, sum = c->sum, amax = c->amax;                       \
        uint64_t i = 0;                                                        \
        for (; i + 2 <= n; i += 2) {                                           \
            T raw, raw1;                                                       \
            memcpy(&raw1, p + (i + 1) * sizeof(T), sizeof(T));                 \
            memcpy(&raw, p + i * sizeof(T), sizeof(T));                        \
            const double x = LOAD;                                             \
            raw = raw1;                                                        \
            const double y = LOAD;                                             \
            if (isfinite(x) && isfinite(y)) {                                  \
                double a = fabs(x), b = fabs(y);                               \
                l1 += a;                                                       \
                l1 += b;                                                       \
                sum += x;                                                      \
                sum += y;                                                      \
                a = a > b ? a : b;                                             \
                amax = a > amax ? a : amax;                                    \
            } else {                                                           \
                KD_STATS_ONE(x);                                               \
                KD_STATS_ONE(y);                                               \
            }                                                                  \
        }                                                                      \
        for (; i < n; i++) {                                                   \
            T raw;                                                             \
            memcpy(&raw, p + i * sizeof(T), sizeof(T));                        \
            const double x = LOAD;                                             \
            KD_STATS_ONE(x);                                                   \
        }                                                                      \
        c->l1 = l1, c->sum = sum, c->amax = amax;                              \
    } while (0)

static void stats_run(void *ctx, const unsigned char *p, uint64_t nbytes)
{
    st *c = ctx;
    uint64_t n = nbytes / (uint64_t)c->itemsize;
    switch (c->st) {
    case KD_ST_FLOAT:
        KD_STATS_LOOP(float, (double)raw);
        return;
    case KD_ST_DOUBLE:
        KD_STATS_LOOP(double, raw);
        return;
    case KD_ST_BFLOAT16:
        KD_STATS_LOOP(uint16_t, bf16_to_double(raw));
        return;
    case KD_ST_HALF:
        KD_STATS_LOOP(uint16_t, half_to_double(raw));
        return;
    default:
        break;
    }
    for (uint64_t i = 0; i < n; i++, p += c->itemsize) {
        if (c->kind == K_FLOAT) {
            stats_float(c, kd_decode_float(c->st, p));
        } else if (c->kind == K_INT) {
            int ok;
            int64_t x = decode_int(c->st, p, &ok);
            c->l1 += fabs((double)(float)x); /* the norm's value: through float32, as upstream */
            c->isum += (uint64_t)x;
            uint64_t a = c->st == KD_ST_UINT64 || x >= 0 ? (uint64_t)x : 0 - (uint64_t)x;
            if (a > c->iamax)
                c->iamax = a;
        } else {
            double re, im;
            complex_parts(c->st, p, &re, &im);
            if (isnan(re) || isnan(im)) {
                c->out->nan++;
            } else if (isinf(re) || isinf(im)) {
                c->out->posinf++; /* |z| = +inf, as the norm counts it */
            } else {
                c->l1 += hypot(re, im);
                c->sum += re;
                c->sum += im;
                double a = fabs(re) > fabs(im) ? fabs(re) : fabs(im);
                if (a > c->amax)
                    c->amax = a;
            }
        }
    }
}

int kd_hash_stats(const kd_view *v, kd_stats *out)
{
    memset(out, 0, sizeof *out);
    int kind = value_kind(v->scalar_type);
    if (kind == K_NONE || v->itemsize != kd_itemsize(v->scalar_type))
        return -1;
    st c = {v->scalar_type, kind, v->itemsize, 0.0, 0.0, 0.0, 0, 0, &out->norm};
    kd_for_each_run(v, stats_run, &c);
    out->norm.l1 = c.l1;
    if (kind == K_INT) {
        out->sum = v->scalar_type == KD_ST_UINT64 ? (double)c.isum : (double)(int64_t)c.isum;
        out->absmax = (double)c.iamax;
    } else {
        out->sum = c.sum;
        out->absmax = c.amax;
    }
    return 0;
}

/* ---- hash_tensor (XOR of 64-bit upcast values) ---- */

typedef struct xr {
    int st, kind, itemsize;
    uint64_t acc;
} xr;

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static void xor_run(void *ctx, const unsigned char *p, uint64_t nbytes)
{
    xr *c = ctx;
    uint64_t n = nbytes / (uint64_t)c->itemsize;
    for (uint64_t i = 0; i < n; i++, p += c->itemsize) {
        if (c->kind == K_FLOAT) {
            c->acc ^= dbits(kd_decode_float(c->st, p));
        } else if (c->kind == K_INT) {
            int ok;
            c->acc ^= (uint64_t)decode_int(c->st, p, &ok);
        } else {
            double re, im;
            complex_parts(c->st, p, &re, &im);
            c->acc ^= dbits(re) ^ dbits(im);
        }
    }
}

int kd_hash_xor64(const kd_view *v, uint64_t *out)
{
    int kind = value_kind(v->scalar_type);
    if (kind == K_NONE || v->itemsize != kd_itemsize(v->scalar_type))
        return -1;
    xr c = {v->scalar_type, kind, v->itemsize, 0};
    kd_for_each_run(v, xor_run, &c);
    *out = c.acc;
    return 0;
}
