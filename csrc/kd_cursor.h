/* kd_cursor.h - a bounds-checked little-endian / LEB128 reader over a byte
 * buffer, shared by the trace reader (kd_trace_read.c) and its Python-facing
 * hash-tree decoder (kd_trace_py.c).  Python-free.  The first failure is kept
 * (offset and reason); every later read returns 0. */
#ifndef KD_CURSOR_H
#define KD_CURSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct kd_cur {
    const uint8_t *p;
    size_t pos, end; /* absolute offsets into p */
    int bad;
    size_t bad_off;
    const char *why;
} kd_cur;

static inline void kd_cur_fail(kd_cur *c, const char *why)
{
    if (!c->bad) {
        c->bad = 1;
        c->bad_off = c->pos;
        c->why = why;
    }
}

static inline uint8_t kd_cur_u8(kd_cur *c)
{
    if (c->bad || c->pos >= c->end) {
        kd_cur_fail(c, "record runs past the end of its chunk");
        return 0;
    }
    return c->p[c->pos++];
}

static inline uint64_t kd_cur_varint_slow(kd_cur *c)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        uint8_t b = kd_cur_u8(c);
        if (c->bad)
            return 0;
        if (shift == 63 && (b & 0x7e)) {
            kd_cur_fail(c, "varint overflows 64 bits");
            return 0;
        }
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    kd_cur_fail(c, "varint longer than 10 bytes");
    return 0;
}

/* The common case, 10 bytes or more left: no per-byte bounds check.  Any
 * error (an overlong or overflowing varint) is left to the checked path. */
static inline uint64_t kd_cur_varint(kd_cur *c)
{
    if (!c->bad && c->end - c->pos >= 10) {
        const uint8_t *p = c->p + c->pos;
        uint64_t v = 0;
        for (int i = 0; i < 9; i++) {
            v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
            if (!(p[i] & 0x80)) {
                c->pos += (size_t)i + 1;
                return v;
            }
        }
    }
    return kd_cur_varint_slow(c);
}

static inline int64_t kd_cur_svarint(kd_cur *c)
{
    uint64_t u = kd_cur_varint(c);
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static inline uint64_t kd_cur_u64(kd_cur *c)
{
    if (c->bad || c->end - c->pos < 8) {
        kd_cur_fail(c, "record runs past the end of its chunk");
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)c->p[c->pos + i] << (8 * i);
    c->pos += 8;
    return v;
}

static inline double kd_cur_f64(kd_cur *c)
{
    uint64_t u = kd_cur_u64(c);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static inline size_t kd_cur_len(kd_cur *c)
{
    uint64_t n = kd_cur_varint(c);
    if (!c->bad && n > c->end - c->pos) {
        kd_cur_fail(c, "length runs past the end of its chunk");
        return 0;
    }
    return (size_t)n;
}

#endif
