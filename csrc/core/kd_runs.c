/* kd_runs.c - iterating a strided view in logical order, as contiguous byte
 * runs (kd_runs.h): the walk every CPU hash in kd_hash.c makes.  Python-free. */
#include "kd_runs.h"

#include <stdlib.h>
#include <string.h>

/* Runs shorter than this are gathered (Note [Gathering short runs]). */
#define KD_GATHER_BELOW 256
#define KD_GATHER_BYTES 65536

/* Note [Gathering short runs]
 * A view whose innermost logical dimension is not contiguous in memory (a
 * transposed or sliced tensor) has runs of one element, or a few.  Calling
 * the hash's run function per element costs tens of nanoseconds each; the
 * runs are copied instead, in logical order, into a small buffer that is
 * hashed as one run.  When logical rows lie closer together in memory than
 * the elements of one row (a transposed view), a band of whole rows is
 * gathered at once, column by column, so that each cache line and page is
 * read once per band and not once per row.  The bytes, and the order the run
 * functions see them in, are exactly those of the per-run walk: every hash
 * gives the same value.
 */
/* Copies m blocks of n bytes, `step` bytes apart, to dst, `dstep` bytes
 * apart; in gather_blocks back to back.  Each case has a constant block size
 * (one move per block); DSTEP(N) is the destination step for block size N,
 * a constant too when the blocks go back to back. */
#define KD_GATHER_CASES(DSTEP)                                                 \
    switch (n) {                                                               \
    case 1: KD_GATHER(1, DSTEP(1));                                            \
    case 2: KD_GATHER(2, DSTEP(2));                                            \
    case 4: KD_GATHER(4, DSTEP(4));                                            \
    case 8: KD_GATHER(8, DSTEP(8));                                            \
    case 16: KD_GATHER(16, DSTEP(16));                                         \
    default: KD_GATHER(n, DSTEP(n));                                           \
    }
#define KD_GATHER(N, D)                                                        \
    for (int64_t j = 0; j < m; j++)                                            \
        memcpy(dst + j * (int64_t)(D), src + j * step, (N));                   \
    return
#define KD_GIVEN_STEP(N) dstep
#define KD_BACK_TO_BACK(N) (N)

static void gather_blocks_to(unsigned char *dst, int64_t dstep, const unsigned char *src, int64_t m, int64_t step,
                             uint64_t n)
{
    KD_GATHER_CASES(KD_GIVEN_STEP)
}

static void gather_blocks(unsigned char *dst, const unsigned char *src, int64_t m, int64_t step, uint64_t n)
{
    KD_GATHER_CASES(KD_BACK_TO_BACK)
}
#undef KD_GATHER_CASES
#undef KD_GATHER
#undef KD_GIVEN_STEP
#undef KD_BACK_TO_BACK

/* Calls fn for each maximal run of elements contiguous in memory and in
 * logical order (short runs gathered).  Returns the number of elements. */
uint64_t kd_for_each_run(const kd_view *v, kd_run_fn fn, void *ctx)
{
    int nd = v->ndim;
    uint64_t numel = 1;
    for (int d = 0; d < nd; d++)
        numel *= (uint64_t)(v->sizes[d] < 0 ? 0 : v->sizes[d]);
    if (numel == 0 || nd > 64)
        return 0;
    /* innermost dims that are row-major contiguous collapse into one run */
    int k = nd;
    int64_t expect = 1;
    while (k > 0 && (v->sizes[k - 1] == 1 || v->strides[k - 1] == expect)) {
        expect *= v->sizes[k - 1];
        k--;
    }
    uint64_t run = 1;
    for (int d = k; d < nd; d++)
        run *= (uint64_t)v->sizes[d];
    const unsigned char *base = v->data;
    const uint64_t blk = run * (uint64_t)v->itemsize;
    const int64_t is = v->itemsize;
    int64_t idx[64] = {0};
    unsigned char buf[KD_GATHER_BYTES];
    /* gathering: dim k-1 is walked by an inner loop (in bands: dims k-2 and
     * k-1), the dims before it by idx */
    const int gather = k > 0 && blk < KD_GATHER_BELOW;
    const uint64_t rowbytes = gather ? (uint64_t)v->sizes[k - 1] * blk : 0;
    const int band = gather && k >= 2 && llabs(v->strides[k - 2]) < llabs(v->strides[k - 1]) &&
                     rowbytes * 2 <= sizeof buf;
    const int outer = band ? k - 2 : gather ? k - 1 : k;
    uint64_t fill = 0;
    for (;;) {
        int64_t off = 0;
        for (int d = 0; d < outer; d++)
            off += idx[d] * v->strides[d];
        const unsigned char *p = base + off * is;
        if (band) {
            const int64_t rows = v->sizes[k - 2], cols = v->sizes[k - 1];
            const int64_t rstep = v->strides[k - 2] * is, cstep = v->strides[k - 1] * is;
            const int64_t per = (int64_t)(sizeof buf / rowbytes);
            for (int64_t r = 0; r < rows; r += per) {
                int64_t nr = rows - r < per ? rows - r : per;
                /* column i of rows r .. r+nr-1: nr blocks rstep apart, into
                 * buf[q * rowbytes + i * blk] */
                for (int64_t i = 0; i < cols; i++)
                    gather_blocks_to(buf + (uint64_t)i * blk, (int64_t)rowbytes, p + r * rstep + i * cstep, nr,
                                     rstep, blk);
                fn(ctx, buf, (uint64_t)nr * rowbytes);
            }
        } else if (!gather) {
            fn(ctx, p, blk);
        } else {
            const int64_t step = v->strides[k - 1] * is;
            for (int64_t i = 0, n = v->sizes[k - 1]; i < n;) {
                int64_t room = (int64_t)((sizeof buf - fill) / blk);
                if (room == 0) {
                    fn(ctx, buf, fill);
                    fill = 0;
                    continue;
                }
                int64_t m = n - i < room ? n - i : room;
                gather_blocks(buf + fill, p, m, step, blk);
                fill += (uint64_t)m * blk;
                p += m * step;
                i += m;
            }
        }
        int d = outer - 1;
        while (d >= 0) {
            if (++idx[d] < v->sizes[d])
                break;
            idx[d] = 0;
            d--;
        }
        if (d < 0)
            break;
    }
    if (fill)
        fn(ctx, buf, fill);
    return numel;
}
