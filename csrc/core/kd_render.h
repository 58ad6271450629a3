/* kd_render.h - kernel records as text, in upstream DebugMode's style:
 *
 *   [triton] triton_poi_fused_add_0(grid=(16, 1, 1), in_ptr0=t: f32[8, 256], out_ptr0=t: f32[8, 256], xnumel=2048)
 *   [cpp] cpp_fused_sum_0(in_ptr0=t: f32[64, 16], out_ptr0=t: f32[16])
 *
 * KD_RENDER_VERBOSE adds each argument's role, strides, storage offset and
 * data pointer, and a trailing "# config" comment.
 * All functions have snprintf semantics: they write at most cap bytes
 * (NUL-terminated when cap > 0) and return the length the full text needs.
 */
#ifndef KD_RENDER_H
#define KD_RENDER_H

#include <stddef.h>

#include "kd_record.h"
#include "kd_strtab.h"

enum { KD_RENDER_VERBOSE = 1 };

typedef struct kd_render_ctx {
    const kd_strtab *strings;
    const char *const *dtype_names; /* indexed by c10::ScalarType; may hold NULLs */
    unsigned ndtype_names;
} kd_render_ctx;

/* "name=value, ..." for every argument of the launch at p[0]. */
size_t kd_render_args(const kd_render_ctx *c, const kd_payload *p, int flags,
                      char *out, size_t cap);

/* The whole line, without a trailing newline. */
size_t kd_render_launch(const kd_render_ctx *c, const kd_payload *p, int flags,
                        char *out, size_t cap);

/* One tensor argument as "t: f32[8, 256]" (p points at its first payload). */
size_t kd_render_tensor(const kd_render_ctx *c, const kd_payload *p, int flags,
                        char *out, size_t cap);

/* A double the way Python's repr() writes it ("1.0", "1e-05", "inf", "nan"). */
size_t kd_render_double(double v, char *out, size_t cap);

#endif
