/* kd_cursor.h - a bounds-checked little-endian / LEB128 reader over a byte
 * buffer, shared by the trace reader (kd_trace_read.c) and its Python-facing
 * hash-tree decoder (kd_trace_py.c).  Python-free.  The first failure is kept
 * (offset and reason) and leaves no bytes to read (end = pos), so every later
 * read fails too and returns 0, and the reads need no check of `bad`. */
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
        c->end = c->pos;
    }
}

static inline uint8_t kd_cur_u8(kd_cur *c)
{
    if (c->pos >= c->end) {
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

/* Eight bytes at p, little endian. */
static inline uint64_t kd_le64(const uint8_t *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
#endif
}

/* Index of the lowest set bit of x (x != 0). */
static inline int kd_ctz64(uint64_t x)
{
#if defined(__GNUC__)
    return __builtin_ctzll(x);
#else
    int n = 0;
    while (!(x & 1)) {
        x >>= 1;
        n++;
    }
    return n;
#endif
}

#if defined(__GNUC__)
#define KD_CUR_COLD __attribute__((noinline))
#else
#define KD_CUR_COLD
#endif

/* A varint of more than one byte (out of line, so kd_cur_varint inlines).  With 8 bytes or more left and at most 8
 * bytes long (the common case), its 7-bit groups are gathered from one 8-byte
 * load with no loop; anything else (longer, overlong or overflowing varints,
 * the end of the buffer) is left to the checked path. */
static KD_CUR_COLD uint64_t kd_cur_varint_long(kd_cur *c)
{
    if (c->end - c->pos >= 8) {
        uint64_t w = kd_le64(c->p + c->pos);
        uint64_t stops = ~w & 0x8080808080808080ull; /* bytes without a continuation bit */
        if (stops) {
            int bits = kd_ctz64(stops) + 1; /* through the last byte's high bit */
            if (bits < 64)
                w &= (1ull << bits) - 1;
            w &= 0x7f7f7f7f7f7f7f7full;
            w = (w & 0x007f007f007f007full) | ((w & 0x7f007f007f007f00ull) >> 1);
            w = (w & 0x00003fff00003fffull) | ((w & 0x3fff00003fff0000ull) >> 2);
            w = (w & 0x000000000fffffffull) | ((w & 0x0fffffff00000000ull) >> 4);
            c->pos += (size_t)bits / 8;
            return w;
        }
    }
    return kd_cur_varint_slow(c);
}

/* One- and two-byte varints (most of them) inline. */
static inline uint64_t kd_cur_varint(kd_cur *c)
{
    if (c->end - c->pos >= 2) {
        const uint8_t *p = c->p + c->pos;
        if (p[0] < 0x80) {
            c->pos++;
            return p[0];
        }
        if (p[1] < 0x80) {
            c->pos += 2;
            return (uint64_t)(p[0] & 0x7f) | (uint64_t)p[1] << 7;
        }
    }
    return kd_cur_varint_long(c);
}

static inline int64_t kd_cur_svarint(kd_cur *c)
{
    uint64_t u = kd_cur_varint(c);
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static inline uint64_t kd_cur_u64(kd_cur *c)
{
    if (c->end - c->pos < 8) {
        kd_cur_fail(c, "record runs past the end of its chunk");
        return 0;
    }
    uint64_t v = kd_le64(c->p + c->pos);
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
    if (n > c->end - c->pos) {
        kd_cur_fail(c, "length runs past the end of its chunk");
        return 0;
    }
    return (size_t)n;
}

#endif
