/* kd_crc32.c - CRC-32 (IEEE 802.3, reflected, as zlib's crc32) of trace
 * chunks: the writer stamps every chunk with it, the reader checks every
 * chunk, so reading a trace computes it over the whole file.  Python-free.
 *
 * Two implementations of the same function: slicing by 8 (portable), and on
 * x86-64 CPUs with PCLMULQDQ and SSE4.1 (checked at run time) carry-less
 * multiplication folding, several times faster, for the 16-byte blocks of
 * buffers of 64 bytes or more.  The folding follows Gopal et al., "Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Intel,
 * 2009); its constants are x^k mod P(x) for the reflected polynomial, and the
 * Barrett reduction's mu and P'.  csrc/tests/test_trace.c checks the two
 * against a bit-at-a-time reference over many lengths and alignments. */
#include <stddef.h>
#include <stdint.h>

#include "kd_crc32.h"

/* Slicing by 8: table k gives the CRC of a byte followed by k zero bytes, so
 * eight bytes are folded per step (about 4x the byte-at-a-time loop). */
static uint32_t crc_tables[8][256];
static int crc_ready = 0; /* benign race: every thread computes the same tables */

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tables[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tables[t][i] = (crc_tables[t - 1][i] >> 8) ^ crc_tables[0][crc_tables[t - 1][i] & 0xff];
    crc_ready = 1;
}

/* c: the running (inverted) CRC state. */
static uint32_t crc_slice8(uint32_t c, const uint8_t *p, size_t n)
{
    if (!crc_ready)
        crc_init();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint32_t lo = c ^ ((uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 |
                           (uint32_t)p[i + 3] << 24);
        uint32_t hi = (uint32_t)p[i + 4] | (uint32_t)p[i + 5] << 8 | (uint32_t)p[i + 6] << 16 |
                      (uint32_t)p[i + 7] << 24;
        c = crc_tables[7][lo & 0xff] ^ crc_tables[6][(lo >> 8) & 0xff] ^ crc_tables[5][(lo >> 16) & 0xff] ^
            crc_tables[4][lo >> 24] ^ crc_tables[3][hi & 0xff] ^ crc_tables[2][(hi >> 8) & 0xff] ^
            crc_tables[1][(hi >> 16) & 0xff] ^ crc_tables[0][hi >> 24];
    }
    for (; i < n; i++)
        c = crc_tables[0][(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KD_CRC_CLMUL 1
#include <immintrin.h>

#define KD_CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

/* a = a.lo * k.lo ^ a.hi * k.hi ^ next: a 128-bit block folded forward */
KD_CLMUL_TARGET static inline __m128i fold(__m128i a, __m128i k, __m128i next)
{
    __m128i lo = _mm_clmulepi64_si128(a, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(a, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* c: the running (inverted) CRC state; n >= 64, a multiple of 16. */
KD_CLMUL_TARGET static uint32_t crc_clmul(uint32_t c, const uint8_t *p, size_t n)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4); /* fold 4 blocks by 512 bits */
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0); /* fold one block by 128 bits */
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);               /* 64 bits to 32 */
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);  /* Barrett: mu, P' */
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
    for (; n >= 64; p += 64, n -= 64) {
        x1 = fold(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = fold(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = fold(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = fold(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = fold(x1, k3k4, x2);
    x1 = fold(x1, k3k4, x3);
    x1 = fold(x1, k3k4, x4);
    for (; n >= 16; p += 16, n -= 16)
        x1 = fold(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    /* 64 bits to 32 */
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to the 32-bit remainder */
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, mask32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int have_clmul = -1; /* benign race: every thread finds the same */

static int clmul_usable(void)
{
    if (have_clmul < 0)
        have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return have_clmul;
}
#endif

uint32_t kd_crc32_portable(const uint8_t *p, size_t n)
{
    return crc_slice8(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

uint32_t kd_crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
#ifdef KD_CRC_CLMUL
    if (n >= 64 && clmul_usable()) {
        size_t m = n & ~(size_t)15;
        c = crc_clmul(c, p, m);
        p += m;
        n -= m;
    }
#endif
    return crc_slice8(c, p, n) ^ 0xFFFFFFFFu;
}
